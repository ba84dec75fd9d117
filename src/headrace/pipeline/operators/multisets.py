"""Per-(group, value) multiplicities in aggregate state: the min/max multiset and the value
sets of DISTINCT aggregates.

Both keep one state row per (group, value) with the value's multiplicity as its weight, and
both read only what the delta needs: min/max reads a group's multiset only when its current
extreme was retracted; a DISTINCT aggregate reads only the (group, value) rows of the delta's
values, to see which values enter the set (multiplicity 0 -> >0) or leave it (>0 -> 0).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.operators.deltas import align, as_array, dense_ids, group_sum, zset
from headrace.pipeline.operators.kernel import StateSpine
from headrace.zset import consolidate


def distinct_steps(tag: bytes, codec: keys.RowCodec, delta: pa.Table, valid: np.ndarray,
                   w: np.ndarray, gid: np.ndarray, gkeys: pa.Array, state: StateSpine):
    """Which values enter or leave each group's set of distinct values.

    A value is the tuple of ``codec``'s columns, normalised as Spark groups them (-0.0 = 0.0,
    one NaN); a row takes part only where ``valid`` (no argument NULL). Returns (``rows``: one
    delta row index per value that entered or left, ``vgid``: its group id, ``step``: +1
    entered / -1 left), the state delta of the multiplicities, keyed ``tag group value``, and
    per group whether the delta takes a value's multiplicity below zero (a retraction of a
    value never inserted).
    """
    rows = np.flatnonzero(valid)
    vk = keys.concat_binary(tag, gkeys.take(pa.array(gid, pa.int64())),
                            codec.encode(delta)).take(pa.array(rows, pa.int64()))
    uk, ids = dense_ids(vk)
    n = len(uk)
    dw = group_sum(ids, w[rows], n)
    rep = np.zeros(n, np.int64)
    rep[ids] = rows  # any row of a value stands for it: equal keys are equal normalised values
    moved = dw != 0
    uk, dw, rep = uk.filter(pa.array(moved)), dw[moved], rep[moved]
    found = state.lookup_many(uk)
    fid, _ = align(found["key"], uk)
    old = np.zeros(len(uk), np.int64)
    np.add.at(old, fid, np.asarray(found["w"].to_numpy(), np.int64))
    step = (old + dw > 0).astype(np.int64) - (old > 0).astype(np.int64)
    upd = zset(uk, pa.array([b""] * len(uk), pa.binary()), dw)
    changed = step != 0
    bad = np.zeros(len(gkeys), bool)
    bad[gid[rep[(old + dw < 0) & (dw < 0)]]] = True
    return rep[changed], gid[rep[changed]], step[changed], upd, bad


def extreme(tag: bytes, kind: str, col: pa.Array, valid: np.ndarray, w: np.ndarray,
            gid: np.ndarray, gkeys: pa.Array, old_ext: pa.Array, state: StateSpine):
    """New min/max (order-preserving bytes) per group, the multiset's state delta, and per
    group whether a value's multiplicity went below zero. The multiset is read only for groups
    whose current extreme was retracted, so only there is that checked (reading it at every
    retraction would cost a lookup per retracted value)."""
    g = len(gkeys)
    sel = pa.array(valid)
    d = pa.table({"g": pa.array(gid, pa.int64()).filter(sel),
                  "v": keys.encode_sortable(col).filter(sel),
                  "w": pa.array(w, pa.int64()).filter(sel)})
    d = consolidate(d)
    agg = "max" if kind == "max" else "min"
    ins = _per_group(d.filter(pc.greater(d["w"], 0)), agg, g)
    dels = d.filter(pc.less(d["w"], 0))
    hit = pc.fill_null(pc.equal(dels["v"], old_ext.take(dels["g"])), False)
    rescan = np.zeros(g, bool)
    rescan[np.asarray(dels["g"].filter(hit).to_numpy(), np.int64)] = True
    better = pc.greater(ins, old_ext) if kind == "max" else pc.less(ins, old_ext)
    ext = pc.if_else(pc.or_(pc.is_null(old_ext), pc.fill_null(better, False)), ins, old_ext)
    ext = pc.if_else(pc.is_null(ins), old_ext, ext)
    mkeys = keys.concat_binary(tag, gkeys)
    bad = np.zeros(g, bool)
    if rescan.any():
        rg = np.flatnonzero(rescan)
        found = state.lookup_many(mkeys.take(pa.array(rg)))
        fid, _ = align(found["key"], mkeys.take(pa.array(rg)))
        merged = consolidate(pa.concat_tables([
            pa.table({"g": pa.array(rg[fid], pa.int64()), "v": found["val"],
                      "w": found["w"]}),
            d.filter(pc.is_in(d["g"], value_set=pa.array(rg, pa.int64())))]))
        fresh = _per_group(merged.filter(pc.greater(merged["w"], 0)), agg, g)
        ext = pc.if_else(pa.array(rescan), fresh, ext)
        gone = merged.filter(pc.less(merged["w"], 0)).select(["g", "v"]).join(
            dels.select(["g", "v"]), ["g", "v"], join_type="inner", use_threads=False)
        bad[np.asarray(gone["g"].to_numpy(), np.int64)] = True
    upd = zset(mkeys.take(d["g"]), d["v"], d["w"].to_numpy())
    return as_array(ext), upd, bad


def _per_group(t: pa.Table, agg: str, g: int) -> pa.Array:
    """The min/max of ``v`` per group id ``g`` in [0, g), NULL where a group has no row."""
    r = t.group_by("g", use_threads=False).aggregate([("v", agg)])
    pos = np.full(g, -1, np.int64)
    pos[np.asarray(r["g"].to_numpy(), np.int64)] = np.arange(r.num_rows)
    return as_array(r[f"v_{agg}"]).take(pa.array(pos, mask=pos < 0))
