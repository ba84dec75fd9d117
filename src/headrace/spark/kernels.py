"""Incremental Z-set operators over Arrow: deltas in, deltas out (DBSP).

Each kernel turns one micro-batch's input delta (rows with a weight column ``__w``) and its
operator state (spines keyed by an encoded key) into an output delta (rows with ``diff``) and
the state updates to insert. Everything is whole-column Arrow work: one group_by, one hash join,
one lookup_many per batch; no Python loop per row. Kernels know nothing of Spark, so the
differential tests run them directly against a from-scratch recomputation.

State access goes through the :class:`StateSpine` protocol (``lookup_many`` and ``insert``),
which headrace.spine's Spine satisfies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.spark.rowcodec import RowCodec

W = "__w"
DIFF = "diff"
KEY = "key"
VAL = "val"
ZSET_SCHEMA = pa.schema([("key", pa.string()), ("val", pa.string()), ("w", pa.int64())])


class StateSpine(Protocol):
    def lookup_many(self, keys: pa.Array) -> pa.Table:
        """Rows (key, val, w) for the given keys, consolidated, zero weights dropped."""

    def insert_updates(self, updates: pa.Table) -> None:
        """Add a Z-set delta (key, val, w)."""


def _any_true(arrays: list) -> pa.Array:
    out = arrays[0]
    for a in arrays[1:]:
        out = pc.or_(out, a)
    return out


def _full(n: int, value: int) -> pa.Array:
    return pa.array(np.full(n, value, dtype=np.int64))


def zset(key: pa.Array, val: pa.Array, w: pa.Array) -> pa.Table:
    return pa.Table.from_arrays([key, val, pc.cast(w, pa.int64())], schema=ZSET_SCHEMA)


def consolidate(table: pa.Table, weight: str) -> pa.Table:
    """Sum the weights of equal rows and drop rows whose weight is 0."""
    cols = [c for c in table.column_names if c != weight]
    if table.num_rows == 0:
        return table
    g = table.group_by(cols, use_threads=False).aggregate([(weight, "sum")])
    g = g.rename_columns([weight if c == f"{weight}_sum" else c for c in g.column_names])
    g = g.filter(pc.not_equal(g[weight], 0))
    return g.select(table.column_names)


_AGG = re.compile(r"^\s*(count|sum)\s*(?:\(\s*([A-Za-z_][A-Za-z0-9_]*)?\s*\))?\s*$")


@dataclass(frozen=True)
class AggSpec:
    out: str
    fn: str  # "count" | "sum"
    col: str | None

    @staticmethod
    def parse(out: str, text: str) -> AggSpec:
        m = _AGG.match(text)
        if not m:
            raise InvalidInput(f"aggregate {out!r}: {text!r} is not 'count' or 'sum(col)'")
        fn, col = m.group(1), m.group(2)
        if fn == "sum" and not col:
            raise InvalidInput(f"aggregate {out!r}: sum needs a column, as sum(amount)")
        return AggSpec(out, fn, col if fn == "sum" else None)


class AggregateKernel:
    """GROUP BY ``by`` with linear aggregates (count, sum). State: key -> current aggregates.

    For each changed group the output retracts the old row (diff -1) and inserts the new one
    (diff +1); a group whose count falls to 0 disappears. Sums are exact for integers; float sums
    depend on the order of additions, like any streaming sum.
    """

    def __init__(self, schema: pa.Schema, by: list[str], aggs: dict[str, str]):
        if not aggs:
            raise InvalidInput("aggregate needs at least one aggregate")
        self.by = list(by)
        self.specs = [AggSpec.parse(o, t) for o, t in aggs.items()]
        self.key_codec = RowCodec(schema, self.by)
        fields = [pa.field("__count", pa.int64())]
        for s in self.specs:
            if s.fn == "sum":
                if s.col not in schema.names:
                    raise InvalidInput(f"aggregate {s.out!r}: unknown column {s.col!r}")
                t = schema.field(s.col).type
                fields.append(pa.field(s.out, pa.float64() if pa.types.is_floating(t)
                                       else pa.int64()))
            else:
                fields.append(pa.field(s.out, pa.int64()))
        self.state_schema = pa.schema(fields)
        self.val_codec = RowCodec(self.state_schema, self.state_schema.names)
        self.output_schema = pa.schema(
            [schema.field(c) for c in self.by]
            + [f for f in fields if f.name != "__count"] + [pa.field(DIFF, pa.int64())])

    def keys(self, delta: pa.Table) -> pa.Array:
        return self.key_codec.encode(delta)

    def apply(self, delta: pa.Table, state: StateSpine, key: pa.Array | None = None) -> pa.Table:
        if delta.num_rows == 0:
            return self.output_schema.empty_table()
        key = self.keys(delta) if key is None else key
        w = pc.cast(delta[W], pa.int64())
        contrib = {"__key": key, "__count": w}
        for s in self.specs:
            if s.fn == "sum":
                x = pc.cast(delta[s.col], self.state_schema.field(s.out).type)
                contrib[s.out] = pc.multiply(pc.fill_null(x, 0), pc.cast(w, x.type))
            else:
                contrib[s.out] = w
        names = [n for n in self.state_schema.names]
        d = pa.table(contrib).group_by(["__key"], use_threads=False).aggregate(
            [(n, "sum") for n in names])
        d = d.rename_columns([c if c == "__key" else "d_" + c.removesuffix("_sum")
                              for c in d.column_names])

        old = state.lookup_many(d["__key"])
        old_vals = self.val_codec.decode(old[VAL]).rename_columns([f"o_{n}" for n in names])
        old_t = pa.Table.from_arrays([old[KEY]] + old_vals.columns,
                                     names=["__key"] + old_vals.column_names)
        j = d.join(old_t, "__key", join_type="left outer", use_threads=False)
        had_old = pc.is_valid(j["o___count"])
        new_cols = {n: pc.add(pc.fill_null(j[f"o_{n}"], 0), j[f"d_{n}"]) for n in names}
        changed = pc.or_(pc.invert(had_old), _any_true(
            [pc.not_equal(new_cols[n], pc.fill_null(j[f"o_{n}"], 0)) for n in names]))
        # a group is kept in state while any aggregate is non-zero (negative weights can leave
        # count 0 with a non-zero sum); it is *visible* in the output while its count is non-zero
        keep_new = _any_true([pc.not_equal(new_cols[n], 0) for n in names])
        retract = pc.and_(had_old, changed)
        insert = pc.and_(keep_new, changed)
        out_retract = pc.and_(retract, pc.not_equal(pc.fill_null(j["o___count"], 0), 0))
        out_insert = pc.and_(changed, pc.not_equal(new_cols["__count"], 0))

        new_state = pa.Table.from_arrays([new_cols[n] for n in names], schema=self.state_schema)
        new_val = self.val_codec.encode(new_state)
        keys = j["__key"].combine_chunks()
        old_val_enc = pc.if_else(had_old, self.val_codec.encode(
            pa.Table.from_arrays([pc.fill_null(j[f"o_{n}"], 0) for n in names],
                                 schema=self.state_schema)), pa.scalar(None, pa.string()))
        updates = pa.concat_tables([
            zset(keys.filter(retract), old_val_enc.filter(retract),
                 _full(pc.sum(retract).as_py() or 0, -1)),
            zset(keys.filter(insert), new_val.filter(insert),
                 _full(pc.sum(insert).as_py() or 0, 1)),
        ])
        state.insert_updates(updates)

        by_old = self.key_codec.decode(keys.filter(out_retract))
        by_new = self.key_codec.decode(keys.filter(out_insert))
        out_old = self._rows(by_old, j.filter(out_retract), "o_", -1)
        out_new = self._rows(by_new, new_state.filter(out_insert), "", 1)
        return pa.concat_tables([out_old, out_new])

    def _rows(self, by: pa.Table, vals: pa.Table, prefix: str, diff: int) -> pa.Table:
        cols = list(by.columns)
        for f in self.output_schema:
            if f.name in self.by or f.name == DIFF:
                continue
            cols.append(pc.cast(vals[f"{prefix}{f.name}"], f.type))
        cols.append(_full(by.num_rows, diff))
        return pa.Table.from_arrays(cols, schema=self.output_schema)


class JoinKernel:
    """Inner equi-join of two Z-sets: Δ(L⋈R) = ΔL⋈R_old + L_new⋈ΔR.

    State: one spine per side, key = the join key, val = the encoded row, w = multiplicity.
    """

    def __init__(self, left: pa.Schema, right: pa.Schema, on: list[str]):
        for c in on:
            if c not in left.names or c not in right.names:
                raise InvalidInput(f"join column {c!r} must be in both inputs")
            if left.field(c).type != right.field(c).type:
                raise InvalidInput(f"join column {c!r} has type {left.field(c).type} on the "
                                   f"left and {right.field(c).type} on the right")
        self.on = list(on)
        self.left_codec = RowCodec(left, left.names)
        self.right_codec = RowCodec(right, right.names)
        self.key_codec = RowCodec(left, self.on)
        self.right_key_codec = RowCodec(right, self.on)
        self.left_rest = [c for c in left.names if c not in on]
        self.right_rest = [c for c in right.names if c not in on]
        clash = set(self.left_rest) & set(self.right_rest)
        if clash:
            raise InvalidInput(f"both join inputs have columns {sorted(clash)}; rename one side")
        self.output_schema = pa.schema(
            [left.field(c) for c in on] + [left.field(c) for c in self.left_rest]
            + [right.field(c) for c in self.right_rest] + [pa.field(DIFF, pa.int64())])

    def _side_updates(self, delta: pa.Table, key_codec: RowCodec, row_codec: RowCodec,
                      key: pa.Array | None) -> pa.Table:
        key = key_codec.encode(delta) if key is None else key
        return consolidate(zset(key, row_codec.encode(delta), delta[W]), "w")

    def apply(self, left_delta: pa.Table, right_delta: pa.Table, left: StateSpine,
              right: StateSpine, left_key: pa.Array | None = None,
              right_key: pa.Array | None = None) -> pa.Table:
        dl = self._side_updates(left_delta, self.key_codec, self.left_codec, left_key)
        dr = self._side_updates(right_delta, self.right_key_codec, self.right_codec, right_key)
        parts = []
        if dl.num_rows:
            r_old = right.lookup_many(pc.unique(dl[KEY]))
            parts.append(self._pair(dl, r_old))
            left.insert_updates(dl)
        if dr.num_rows:
            l_new = left.lookup_many(pc.unique(dr[KEY]))
            parts.append(self._pair(l_new, dr))
            right.insert_updates(dr)
        if not parts:
            return self.output_schema.empty_table()
        return consolidate(pa.concat_tables(parts), DIFF)

    def _pair(self, lrows: pa.Table, rrows: pa.Table) -> pa.Table:
        lt = pa.table({"k": lrows[KEY], "lv": lrows[VAL], "lw": lrows["w"]})
        rt = pa.table({"k": rrows[KEY], "rv": rrows[VAL], "rw": rrows["w"]})
        j = lt.join(rt, "k", join_type="inner", use_threads=False)
        if j.num_rows == 0:
            return self.output_schema.empty_table()
        lrow = self.left_codec.decode(j["lv"])
        rrow = self.right_codec.decode(j["rv"])
        cols = [lrow[c] for c in self.on] + [lrow[c] for c in self.left_rest]
        cols += [rrow[c] for c in self.right_rest] + [pc.multiply(j["lw"], j["rw"])]
        return pa.Table.from_arrays(cols, schema=self.output_schema)


class DistinctKernel:
    """DISTINCT: a row is present (diff +1) while its total weight is positive."""

    def __init__(self, schema: pa.Schema):
        self.codec = RowCodec(schema, schema.names)
        self.output_schema = pa.schema(list(schema) + [pa.field(DIFF, pa.int64())])

    def apply(self, delta: pa.Table, state: StateSpine, key: pa.Array | None = None) -> pa.Table:
        if delta.num_rows == 0:
            return self.output_schema.empty_table()
        key = self.codec.encode(delta) if key is None else key
        empty = pa.array([""] * len(key), pa.string())
        d = consolidate(zset(key, empty, delta[W]), "w")
        if d.num_rows == 0:
            return self.output_schema.empty_table()
        old = state.lookup_many(d[KEY])
        j = d.join(pa.table({KEY: old[KEY], "ow": old["w"]}), KEY, join_type="left outer",
                   use_threads=False)
        ow = pc.fill_null(j["ow"], 0)
        nw = pc.add(ow, j["w"])
        was = pc.greater(ow, 0)
        now = pc.greater(nw, 0)
        up = pc.and_(pc.invert(was), now)
        down = pc.and_(was, pc.invert(now))
        state.insert_updates(d)
        rows = self.codec.decode(j[KEY])
        diff = pc.if_else(up, 1, pc.if_else(down, -1, 0))
        out = rows.append_column(DIFF, pc.cast(diff, pa.int64()))
        return out.filter(pc.not_equal(out[DIFF], 0))
