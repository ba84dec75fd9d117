"""Equi-joins with retractions, Spark SQL semantics: inner, left, right, full outer, left semi,
left anti.

Keys are compared after Spark's normalisation (-0.0 = 0.0, NaN = NaN); a row with a NULL in any
key column never matches, so it is never stored: outer joins emit it padded with NULLs at once
(an anti join emits it as is). State: one spine per side, key = the normalised key encoding,
val = the exact row (all columns, so -0.0 in a key column comes out as -0.0), w = multiplicity.
A semi/anti join keeps only the right side's per-key multiplicity (val empty).

For the keys in the batch's deltas, with old state L, R and deltas dL, dR:
matched rows change by dL x R + L x dR + dL x dR; a left row's padded (or semi/anti) output is
present while f(count of right rows with its key) holds (f = "== 0" for padding and anti,
"> 0" for semi), so it changes by f(cR_new) * (L + dL) - f(cR_old) * L, which retracts the
padding when the first match arrives and restores it when the last match leaves.

A batch that retracts a stored row more often than it was inserted raises NegativeMultiplicity
before anything is written (the rows of the batch's keys are read anyway; only retractions are
compared with them). A row with a NULL key is never stored, so its retraction cannot be checked:
an outer join passes it on as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.errors import NegativeMultiplicity
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.operators.deltas import (
    align,
    as_array,
    consolidate_rows,
    group_sum,
    pushed_negative,
    weights,
    zset,
)
from headrace.pipeline.operators.kernel import (
    Expires,
    Kernel,
    KeyLayout,
    Rebucketable,
    RoutesKeys,
    StateSpine,
    delete_below,
)
from headrace.zset import consolidate

HOWS = {"inner": "inner", "left": "left", "left_outer": "left", "leftouter": "left",
        "right": "right", "right_outer": "right", "rightouter": "right", "full": "full",
        "outer": "full", "full_outer": "full", "fullouter": "full", "left_semi": "left_semi",
        "semi": "left_semi", "leftsemi": "left_semi", "left_anti": "left_anti",
        "anti": "left_anti", "leftanti": "left_anti"}


class JoinKernel(Kernel, RoutesKeys, Expires, Rebucketable):
    state_sides = 2

    def __init__(self, left: pa.Schema, right: pa.Schema, how: str = "inner", *,
                 on: Sequence[str] | None = None, left_on: Sequence[str] | None = None,
                 right_on: Sequence[str] | None = None):
        if how not in HOWS:
            raise InvalidInput(f"join type {how!r} is not one of {sorted(set(HOWS))}")
        self.how = HOWS[how]
        self.using = on is not None
        if self.using == (left_on is not None or right_on is not None):
            raise InvalidInput("a join takes either on=[...] or both left_on and right_on")
        self.left_on = list(on) if on is not None else list(left_on or [])
        self.right_on = list(on) if on is not None else list(right_on or [])
        if not self.left_on or len(self.left_on) != len(self.right_on):
            raise InvalidInput(f"join keys {self.left_on} and {self.right_on} must be non-empty "
                               "and of equal length")
        for side, schema, cols in (("left", left, self.left_on), ("right", right, self.right_on)):
            for c in cols:
                if c not in schema.names:
                    raise InvalidInput(f"join key {c!r} is not a {side} column {schema.names}")
            for f in schema:
                if f.name.startswith(PREFIX):
                    raise InvalidInput(f"{side} column {f.name!r} uses the reserved prefix")
        for lc, rc in zip(self.left_on, self.right_on, strict=True):
            lt, rt = left.field(lc).type, right.field(rc).type
            if lt != rt:
                raise InvalidInput(f"join key {lc!r} is {lt} on the left and {rc!r} is {rt} on "
                                   "the right; cast one side first")
        self.left, self.right = left, right
        self.lkey = keys.RowCodec(left, self.left_on, normalize=True)
        self.rkey = keys.RowCodec(right, self.right_on, normalize=True)
        self.lrow = keys.RowCodec(left)
        self.rrow = keys.RowCodec(right)
        semi = self.how in ("left_semi", "left_anti")
        if self.using:
            self.l_rest = [c for c in left.names if c not in self.left_on]
            self.r_rest = [c for c in right.names if c not in self.right_on]
            key_src = right if self.how == "right" else left
            fields = [key_src.field(c) for c in self.left_on] + [left.field(c)
                                                                 for c in self.l_rest]
        else:
            self.l_rest, self.r_rest = list(left.names), list(right.names)
            fields = [left.field(c) for c in self.l_rest]
        self.sources = ([("key", c) for c in self.left_on] if self.using else []) + [
            ("l", c) for c in self.l_rest]
        if not semi:
            fields += [right.field(c) for c in self.r_rest]
            self.sources += [("r", c) for c in self.r_rest]
        names = [f.name for f in fields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InvalidInput(f"both join inputs have columns {dup}; rename one side")
        self.output_schema = pa.schema(fields)
        self.out_codec = keys.RowCodec(self.output_schema)

    def key_layout(self, side: int) -> KeyLayout:
        """The join key is the state key."""
        return (self.lkey if side == 0 else self.rkey), 0

    def bucket_columns(self, input_index: int) -> list[str]:
        return list(self.left_on if input_index == 0 else self.right_on)

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """The state key of each delta row (null for a NULL join key: never stored), as
        (input, keys) pairs; see AggregateKernel.route_keys."""
        out = []
        for i, (delta, codec, on) in enumerate(((deltas[0], self.lkey, self.left_on),
                                                (deltas[1], self.rkey, self.right_on))):
            null = np.zeros(delta.num_rows, bool)
            for c in on:
                null |= np.asarray(as_array(delta[c]).is_null().to_numpy(zero_copy_only=False))
            enc = codec.encode(delta)
            out.append((i, pc.if_else(pa.array(null), pa.scalar(None, enc.type), enc)))
        return out

    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
        dl_rows, dr_rows = deltas
        lstate, rstate = states
        semi = self.how in ("left_semi", "left_anti")
        parts: list[pa.Table] = []
        zl, lnull = self._side(dl_rows, self.lkey, self.lrow, self.left_on, keep_rows=True)
        zr, rnull = self._side(dr_rows, self.rkey, self.rrow, self.right_on, keep_rows=not semi)
        if lnull.num_rows and self.how in ("left", "full", "left_anti"):
            parts.append(self._rows(lnull, None, lnull[W]))
        if rnull.num_rows and self.how in ("right", "full"):
            parts.append(self._rows(None, rnull, rnull[W]))
        if zl.num_rows or zr.num_rows:
            parts += self._keyed(zl, zr, lstate, rstate)
            lstate.insert_updates(zl)
            rstate.insert_updates(zr)
        if not parts:
            return self._empty()
        out = pa.concat_tables(parts)
        return consolidate_rows(out, self.out_codec)

    def _empty(self) -> pa.Table:
        return pa.schema(list(self.output_schema) + [pa.field(W, pa.int64())]).empty_table()

    def expire(self, states: Sequence[StateSpine], below: bytes, emit: bool) -> pa.Table:
        """Event time: delete both sides' rows whose key sorts below ``below`` — the time key
        leads the key, so these are the keys the watermark closed: one deleted key range per
        side, nothing of it read. The output they produced stays (update mode), outer padding
        included: no later row can carry these keys (they are late), so none would retract
        it."""
        if emit:
            raise InvalidInput("a join emits changes, not final rows: write it with "
                               "mode='update'")
        for state in states:  # the bucket's spine of each side
            delete_below(state, below)
        return self._empty()

    def _side(self, delta: pa.Table, key_codec, row_codec, on, keep_rows: bool):
        """(consolidated state delta of rows with non-NULL keys, rows with a NULL key + W)."""
        null = np.zeros(delta.num_rows, bool)
        for c in on:
            null |= np.asarray(as_array(delta[c]).is_null().to_numpy(zero_copy_only=False))
        ok = pa.array(~null)
        good = delta.filter(ok)
        val = (row_codec.encode(good) if keep_rows
               else pa.array([b""] * good.num_rows, pa.binary()))
        z = consolidate(zset(key_codec.encode(good), val, weights(good)))
        nulls = delta.filter(pa.array(null)).select(row_codec.columns + [W])
        return z, nulls.cast(pa.schema(list(row_codec.schema) + [pa.field(W, pa.int64())]))

    def _keyed(self, zl: pa.Table, zr: pa.Table, lstate: StateSpine,
               rstate: StateSpine) -> list[pa.Table]:
        semi = self.how in ("left_semi", "left_anti")
        uniq = as_array(pc.unique(pa.concat_arrays([as_array(zl["key"]), as_array(zr["key"])])))
        k = len(uniq)
        lold = lstate.lookup_many(uniq)
        rold = rstate.lookup_many(uniq)
        ids = {name: align(t["key"], uniq)[0]
               for name, t in (("lold", lold), ("rold", rold), ("zl", zl), ("zr", zr))}

        def count(name: str, t: pa.Table) -> np.ndarray:
            return group_sum(ids[name], np.asarray(t["w"].to_numpy(), np.int64), k)

        self._check_rows(zl, lold, 0)
        self._check_rows(zr, rold, 1)
        cl_old, cr_old = count("lold", lold), count("rold", rold)
        cl_new, cr_new = cl_old + count("zl", zl), cr_old + count("zr", zr)
        parts = []
        if not semi:
            _check_products(zl, rold, lold, zr)
            for a, b in ((zl, rold), (lold, zr), (zl, zr)):
                pairs = _pairs(a, b)
                if pairs.num_rows:
                    parts.append(self._rows(self.lrow.decode(pairs["lv"]),
                                            self.rrow.decode(pairs["rv"]), pairs["w"]))
        if self.how in ("left", "full", "left_anti", "left_semi"):
            if self.how == "left_semi":
                f_old, f_new = cr_old > 0, cr_new > 0
            else:
                f_old, f_new = cr_old == 0, cr_new == 0
            rows = self._flip(lold, ids["lold"], zl, ids["zl"], f_old, f_new)
            if rows.num_rows:
                parts.append(self._rows(self.lrow.decode(rows["val"]), None, rows["w"]))
        if self.how in ("right", "full"):
            rows = self._flip(rold, ids["rold"], zr, ids["zr"], cl_old == 0, cl_new == 0)
            if rows.num_rows:
                parts.append(self._rows(None, self.rrow.decode(rows["val"]), rows["w"]))
        return parts

    def _check_rows(self, delta: pa.Table, old: pa.Table, side: int) -> None:
        """NegativeMultiplicity (nothing written yet) if ``delta`` retracts a stored row of
        this side more often than it was inserted (a semi/anti join's right side: its key)."""
        bad = pushed_negative(old, delta)
        if not bad.any():
            return
        keys_ = as_array(delta["key"]).filter(pa.array(bad))
        i = int(np.argmax(bad))
        val = as_array(delta["val"])[i].as_py()
        codec = (self.lrow, self.rrow)[side]
        what = (codec.decode(pa.array([val], pa.binary())).to_pylist()[0] if val
                else (self.lkey, self.rkey)[side].decode(keys_.slice(0, 1)).to_pylist()[0])
        raise NegativeMultiplicity(
            f"{('left', 'right')[side]} join row {what} would occur fewer than 0 times",
            keys_.to_pylist())

    @staticmethod
    def _flip(old: pa.Table, old_ids: np.ndarray, delta: pa.Table, delta_ids: np.ndarray,
              f_old: np.ndarray, f_new: np.ndarray) -> pa.Table:
        """Rows of f(new) * (old + delta) - f(old) * old, per key."""
        coef_old = (f_new.astype(np.int64) - f_old.astype(np.int64))[old_ids]
        coef_delta = f_new.astype(np.int64)[delta_ids]
        w = np.concatenate([np.asarray(old["w"].to_numpy(), np.int64) * coef_old,
                            np.asarray(delta["w"].to_numpy(), np.int64) * coef_delta])
        val = pa.concat_arrays([as_array(old["val"]), as_array(delta["val"])])
        keep = w != 0
        return pa.table({"val": val.filter(pa.array(keep)), "w": pa.array(w[keep])})

    def _rows(self, lrows: pa.Table | None, rrows: pa.Table | None, w) -> pa.Table:
        """Output rows from matched or one-sided (NULL-padded) left/right rows."""
        some = lrows if lrows is not None else rrows
        if some is None:
            raise ValueError("join output rows need the rows of one side at least")
        n = some.num_rows
        cols = []
        for f, (side, name) in zip(self.output_schema, self.sources, strict=True):
            if side == "key":
                i = self.left_on.index(name)
                if rrows is not None and (self.how == "right" or lrows is None):
                    cols.append(rrows[self.right_on[i]])
                elif lrows is None:
                    raise ValueError("a right join's output needs its right rows")
                else:
                    cols.append(lrows[name])
            else:
                rows = lrows if side == "l" else rrows
                cols.append(rows[name] if rows is not None else pa.nulls(n, f.type))
        cols.append(pc.cast(w, pa.int64()))
        return pa.Table.from_arrays(cols, schema=pa.schema(
            list(self.output_schema) + [pa.field(W, pa.int64())]))


def _check_products(*tables: pa.Table) -> None:
    top = [int(pc.max(pc.abs(t["w"])).as_py() or 0) if t.num_rows else 0 for t in tables]
    if max(top[0] * top[1], top[2] * top[3]) >= 1 << 62:
        raise InvalidInput("join weights are too large: their product would overflow int64")


def _pairs(a: pa.Table, b: pa.Table) -> pa.Table:
    """Inner join of two state tables on key: (lv, rv, w = wa * wb)."""
    if a.num_rows == 0 or b.num_rows == 0:
        return pa.table({"lv": pa.array([], pa.binary()), "rv": pa.array([], pa.binary()),
                         "w": pa.array([], pa.int64())})
    lt = pa.table({"k": a["key"], "lv": a["val"], "lw": a["w"]})
    rt = pa.table({"k": b["key"], "rv": b["val"], "rw": b["w"]})
    j = lt.join(rt, "k", join_type="inner", use_threads=False)
    return pa.table({"lv": j["lv"], "rv": j["rv"], "w": pc.multiply(j["lw"], j["rw"])})
