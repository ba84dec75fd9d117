"""Z-set helpers shared by the kernels: weights, state rows, exact consolidation of user rows,
dense group ids (the consolidation itself is headrace.zset's)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import FormatError
from headrace.pipeline.encoding.rowkeys import RowCodec
from headrace.pipeline.errors import NegativeMultiplicity
from headrace.pipeline.names import W
from headrace.pipeline.operators.kernel import ZSET_SCHEMA
from headrace.zset import consolidate


def as_array(col) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def weights(delta: pa.Table) -> np.ndarray:
    return np.asarray(as_array(pc.cast(delta[W], pa.int64())).to_numpy(zero_copy_only=False),
                      np.int64)


def zset(key, val, w) -> pa.Table:
    """A state delta table (key, val, w)."""
    return pa.Table.from_arrays([pc.cast(as_array(key), pa.binary()),
                                 pc.cast(as_array(val), pa.binary()),
                                 pa.array(np.asarray(w, np.int64), pa.int64())],
                                schema=ZSET_SCHEMA)


def consolidate_rows(table: pa.Table, codec: RowCodec) -> pa.Table:
    """Consolidate a delta of user rows (columns + W) exactly: equal bytes merge, -0.0 and 0.0
    stay apart. The result is decoded back from the row encoding."""
    if table.num_rows == 0:
        return table.select(codec.columns + [W])
    enc = codec.encode(table)
    t = consolidate(pa.table({"r": enc, W: pc.cast(table[W], pa.int64())}), W)
    rows = codec.decode(t["r"])
    return rows.append_column(W, t[W])


def dense_ids(keys: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(unique keys, for each input row the index of its key in the uniques)."""
    keys = as_array(keys)
    uniq = as_array(pc.unique(keys))
    ids = as_array(pc.index_in(keys, value_set=uniq))
    return uniq, np.asarray(ids.to_numpy(zero_copy_only=False), np.int64)


def align(found_keys: pa.Array, uniq: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """For rows fetched from state: the index of each row's key in ``uniq`` (all must be)."""
    ids = as_array(pc.index_in(as_array(found_keys), value_set=uniq))
    if ids.null_count:
        raise FormatError(None, None, "state lookup returned a key that was not asked for")
    return np.asarray(ids.to_numpy(zero_copy_only=False), np.int64), ids


def group_sum(ids: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 per-group sum (np.add.at: no float rounding, unlike bincount)."""
    out = np.zeros(n, np.int64)
    np.add.at(out, ids, values.astype(np.int64))
    return out


def fill(n: int, value: int) -> np.ndarray:
    return np.full(n, value, np.int64)


def pushed_negative(old: pa.Table, delta: pa.Table) -> np.ndarray:
    """Which rows of ``delta`` (key, val, w; one row per (key, val)) leave their (key, val)'s
    multiplicity in ``old`` (as ``lookup_many`` returns it: consolidated) below zero — a
    retraction of what is not there. Only retractions are looked at (the rest cannot make a
    multiplicity negative), and a row already negative in ``old`` (state from before this
    check) counts only if the delta lowers it further."""
    w = np.asarray(as_array(pc.cast(delta["w"], pa.int64())).to_numpy(zero_copy_only=False),
                   np.int64) if delta.num_rows else np.zeros(0, np.int64)
    bad = np.zeros(len(w), bool)
    neg = np.flatnonzero(w < 0)
    if not len(neg):
        return bad
    d = pa.table({"key": as_array(delta["key"]).take(pa.array(neg)),
                  "val": as_array(delta["val"]).take(pa.array(neg)),
                  "i": pa.array(neg, pa.int64())})
    o = pa.table({"key": as_array(old["key"]), "val": as_array(old["val"]),
                  "ow": pc.cast(as_array(old["w"]), pa.int64())})
    j = d.join(o, ["key", "val"], join_type="left outer", use_threads=False)
    j = j.group_by("i", use_threads=False).aggregate([("ow", "sum")])  # min_count 1: NULL
    i = np.asarray(as_array(j["i"]).to_numpy(zero_copy_only=False), np.int64)
    ow = np.asarray(as_array(j["ow_sum"]).fill_null(0).to_numpy(zero_copy_only=False),
                    np.int64)
    bad[i] = ow + w[i] < 0
    return bad


def refuse_pushed_negative(old: pa.Table, delta: pa.Table, row_codec: RowCodec,
                           what: str) -> None:
    """NegativeMultiplicity (before anything is written) if ``delta`` leaves a (key, val) of
    ``old`` below zero (``pushed_negative``), naming the first such row, decoded by
    ``row_codec``, as ``what`` and every refused state key."""
    bad = pushed_negative(old, delta)
    if bad.any():
        keys = as_array(delta["key"]).filter(pa.array(bad))
        row = row_codec.decode(as_array(delta["val"]).filter(pa.array(bad)).slice(0, 1))
        raise NegativeMultiplicity(f"{what} {row.to_pylist()[0]} would occur fewer than 0 "
                                   "times", keys.to_pylist())
