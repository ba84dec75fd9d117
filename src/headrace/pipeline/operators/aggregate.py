"""GROUP BY with retractions, Spark SQL semantics: count(*), count, sum, avg, min, max,
count_distinct; no group columns = a global aggregate (one row, even over empty input).

State (one spine; every key starts with a tag byte, then the group key, so a group's rows share
its bucket):

- ``00 group`` -> the group's accumulators (weight 1): count(*), and per aggregate its non-NULL
  count, exact sums (integers: three 24-bit limbs, decimal128: six, so no batch sum can wrap
  and the overflow check sees the true total; double: the exactsum limbs plus counts of +inf,
  -inf and NaN inputs), the current min/max, the number of distinct values;
- ``01 agg group`` -> val = a value (order-preserving bytes), w = its multiplicity: the
  min/max multiset. It is read only for groups whose current extreme was retracted;
  append-only input never reads it;
- ``02 agg group value`` -> w = the multiplicity of a distinct value (count_distinct), read only
  for the values in the delta.

Output: for each changed group, the old row with weight -1 and the new row with +1 (a group
whose visible row did not change emits nothing).
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import FormatError, InvalidInput
from headrace.pipeline import keys
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.operators import exactsum
from headrace.pipeline.operators.base import ArithmeticOverflow, StateSpine
from headrace.pipeline.operators.zset import (
    align,
    as_array,
    consolidate,
    dense_ids,
    fill,
    group_sum,
    weights,
    zset,
)

FUNCS = ("count", "sum", "avg", "min", "max", "count_distinct")
_M24 = (1 << 24) - 1
ACC, MULTISET, DISTINCT = b"\x00", b"\x01", b"\x02"
NOT_NULL = b"\x01"  # RowCodec's flag byte before a non-NULL value (keys.py)


@dataclass(frozen=True)
class Agg:
    """One aggregate: ``func`` over ``column`` (None only for count(*)), output ``name``."""

    func: str
    column: str | None
    name: str


def _long_sum_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) and t != pa.uint64()


class AggregateKernel:
    state_sides = 1

    def __init__(self, schema: pa.Schema, by: Sequence[str], aggs: Sequence[Agg]):
        self.by = list(by)
        self.aggs = list(aggs)
        if not self.aggs:
            raise InvalidInput("an aggregate needs at least one aggregate function")
        for c in self.by:
            if c not in schema.names:
                raise InvalidInput(f"group column {c!r} is not an input column {schema.names}")
        self.group_codec = keys.RowCodec(schema, self.by, normalize=True) if self.by else None
        names = list(self.by)
        acc = [pa.field("n", pa.int64())]
        out = [schema.field(c) for c in self.by]
        self.kinds: list[str] = []
        self.int_limbs: dict[int, int] = {}  # sum_int: 3 limbs for long, 6 for decimal128
        for j, a in enumerate(self.aggs):
            if a.func not in FUNCS:
                raise InvalidInput(f"aggregate {a.name!r}: unknown function {a.func!r}; "
                                   f"have {FUNCS}")
            if a.name in names or a.name.startswith(PREFIX) or a.name == W:
                raise InvalidInput(f"aggregate output {a.name!r} repeats a column name or uses "
                                   f"the reserved prefix {PREFIX!r}")
            names.append(a.name)
            if a.column is None:
                if a.func != "count":
                    raise InvalidInput(f"aggregate {a.name!r}: {a.func} needs a column")
                self.kinds.append("count_star")
                out.append(pa.field(a.name, pa.int64()))
                continue
            if a.column not in schema.names:
                raise InvalidInput(f"aggregate {a.name!r}: unknown column {a.column!r}")
            t = schema.field(a.column).type
            keys.check_type(t, f"aggregate {a.name!r} column {a.column!r}")
            numeric = pa.types.is_integer(t) or pa.types.is_floating(t)
            if a.func in ("sum", "avg") and not (numeric or (
                    a.func == "sum" and pa.types.is_decimal128(t))):
                raise InvalidInput(f"aggregate {a.name!r}: {a.func} of {t} is not supported "
                                   "(integers and floats are; sum also takes decimal128)")
            if a.func == "sum" and (_long_sum_type(t) or pa.types.is_decimal128(t)):
                kind = "sum_int"
                self.int_limbs[j] = 6 if pa.types.is_decimal(t) else 3
                acc += [pa.field(f"{j}nn", pa.int64())] + [
                    pa.field(f"{j}s{i}", pa.int64()) for i in range(self.int_limbs[j])]
                out.append(pa.field(a.name, pa.decimal128(min(38, t.precision + 10), t.scale)
                                    if pa.types.is_decimal(t) else pa.int64()))
            elif a.func in ("sum", "avg"):
                if a.func == "sum" and t == pa.uint64():
                    raise InvalidInput(f"aggregate {a.name!r}: sum of uint64 is not supported")
                kind = "sum_double" if a.func == "sum" else "avg"
                acc += [pa.field(f"{j}{s}", pa.int64()) for s in ("nn", "pinf", "ninf", "nan")]
                acc.append(pa.field(f"{j}limbs", pa.binary()))
                out.append(pa.field(a.name, pa.float64()))
            elif a.func in ("min", "max"):
                kind = a.func
                acc.append(pa.field(f"{j}ext", pa.binary()))
                out.append(pa.field(a.name, t))
            elif a.func == "count":
                kind = "count"
                acc.append(pa.field(f"{j}nn", pa.int64()))
                out.append(pa.field(a.name, pa.int64()))
            else:
                kind = "count_distinct"
                acc.append(pa.field(f"{j}nd", pa.int64()))
                out.append(pa.field(a.name, pa.int64()))
            self.kinds.append(kind)
        self.input_schema = schema
        self.acc_schema = pa.schema(acc)
        self.acc_codec = keys.RowCodec(self.acc_schema)
        self.output_schema = pa.schema(out)
        self.out_codec = keys.RowCodec(self.output_schema)
        self._distinct_codecs = {
            j: keys.RowCodec(schema, [a.column], normalize=True)
            for j, a in enumerate(self.aggs) if a.func == "count_distinct"}

    def bucket_columns(self, input_index: int) -> list[str]:
        return list(self.by)

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """Every state key ``apply`` may read or write for these deltas, as (input, keys
        aligned with that input's rows): a task-wide state routes each key to its row's
        bucket, so one ``apply`` serves all of a task's buckets."""
        delta = deltas[0]
        g = (self.group_codec.encode(delta) if self.by
             else pa.array([b""] * delta.num_rows, pa.binary()))
        out = [(0, keys.concat_binary(ACC, g))]
        for j, kind in enumerate(self.kinds):
            tag = j.to_bytes(2, "big")
            if kind in ("min", "max"):
                out.append((0, keys.concat_binary(MULTISET + tag, g)))
            elif kind == "count_distinct":
                out.append((0, keys.concat_binary(DISTINCT + tag, g,
                                                  self._distinct_codecs[j].encode(delta))))
        return out

    def apply(self, deltas: list[pa.Table], states: list[StateSpine]) -> pa.Table:
        delta, state = deltas[0], states[0]
        n_rows = delta.num_rows
        if self.by and n_rows == 0:
            return self._empty()
        w = weights(delta)
        exactsum.check_weights(w, "aggregate")
        if self.by:
            gkeys, gid = dense_ids(self.group_codec.encode(delta))
        else:
            gkeys, gid = pa.array([b""], pa.binary()), np.zeros(n_rows, np.int64)
        g = len(gkeys)
        uniq = keys.concat_binary(ACC, gkeys)

        old = state.lookup_many(uniq)
        oid, _ = align(old["key"], uniq)
        if len(np.unique(oid)) != len(oid) or np.any(
                np.asarray(old["w"].to_numpy()) != 1):
            raise FormatError(None, None, "aggregate state holds a group's accumulators with "
                                          "a weight other than 1")
        has_old = np.zeros(g, bool)
        has_old[oid] = True
        pos = np.full(g, -1, np.int64)
        pos[oid] = np.arange(len(oid))
        take_old = pa.array(pos, mask=pos < 0)
        old_bytes = as_array(old["val"]).take(take_old)
        old_acc = self.acc_codec.decode(old["val"])

        def old_int(name: str) -> np.ndarray:
            col = np.zeros(g, np.int64)
            col[oid] = np.asarray(old_acc[name].to_numpy(), np.int64)
            return col

        new: dict[str, object] = {"n": old_int("n") + group_sum(gid, w, g)}
        olds: dict[str, object] = {"n": old_int("n")}
        updates: list[pa.Table] = []
        for j, (a, kind) in enumerate(zip(self.aggs, self.kinds, strict=True)):
            if kind == "count_star":
                continue
            col = as_array(delta[a.column])
            valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
            wv = np.where(valid, w, 0)
            if kind in ("count", "sum_int", "sum_double", "avg"):
                olds[f"{j}nn"] = old_int(f"{j}nn")
                new[f"{j}nn"] = olds[f"{j}nn"] + group_sum(gid, wv, g)
            if kind == "sum_int":
                parts = _int_limbs(col)
                s = []
                for i, part in enumerate(parts):
                    olds[f"{j}s{i}"] = old_int(f"{j}s{i}")
                    s.append(olds[f"{j}s{i}"] + group_sum(gid, part * wv, g))
                for i in range(len(parts) - 1):  # carry: all limbs but the top in [0, 2^24)
                    s[i + 1] += s[i] >> 24
                    s[i] &= _M24
                for i, limb in enumerate(s):
                    new[f"{j}s{i}"] = limb
            elif kind in ("sum_double", "avg"):
                v = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)).astype(
                    np.float64)
                for name, hit in (("pinf", v == np.inf), ("ninf", v == -np.inf),
                                  ("nan", np.isnan(v))):
                    olds[f"{j}{name}"] = old_int(f"{j}{name}")
                    new[f"{j}{name}"] = olds[f"{j}{name}"] + group_sum(gid, wv * hit, g)
                finite = np.isfinite(v)
                limbs_old = np.zeros((g, exactsum.LIMBS), np.int64)
                limbs_old[oid] = exactsum.unpack(old_acc[f"{j}limbs"])
                olds[f"{j}limbs"] = limbs_old
                new[f"{j}limbs"] = exactsum.normalize(limbs_old + exactsum.contributions(
                    np.where(finite, v, 0.0), np.where(finite, wv, 0), gid, g))
            elif kind in ("min", "max"):
                olds[f"{j}ext"] = as_array(old_acc[f"{j}ext"]).take(take_old)
                ext, upd = self._extreme(j, kind, col, valid, w, gid, gkeys,
                                         olds[f"{j}ext"], state)
                new[f"{j}ext"] = ext
                updates.append(upd)
            elif kind == "count_distinct":
                olds[f"{j}nd"] = old_int(f"{j}nd")
                nd, upd = self._distinct(j, delta, valid, w, gid, gkeys, state)
                new[f"{j}nd"] = olds[f"{j}nd"] + nd
                updates.append(upd)

        new_bytes = self.acc_codec.encode(self._acc_table(new))
        changed = ~has_old | ~np.asarray(
            pc.fill_null(pc.equal(new_bytes, old_bytes), False).to_numpy(zero_copy_only=False))
        if self.by:
            keep_new = new["n"] != 0
            vis_new, vis_old = new["n"] > 0, has_old & (olds["n"] > 0)
        else:
            keep_new = vis_new = np.ones(g, bool)
            vis_old = has_old
        self._check_overflow(new, changed & vis_new, gkeys)

        out_old = self._outputs(olds, gkeys)
        out_new = self._outputs(new, gkeys)
        same = np.asarray(pc.equal(self.out_codec.encode(out_old),
                                   self.out_codec.encode(out_new)).to_numpy(
            zero_copy_only=False), bool)
        both = vis_old & vis_new & same
        emit_old = changed & vis_old & ~both
        emit_new = changed & vis_new & ~both

        retract, insert = changed & has_old, changed & keep_new
        updates.append(zset(uniq.filter(pa.array(retract)),
                            old_bytes.filter(pa.array(retract)), fill(int(retract.sum()), -1)))
        updates.append(zset(uniq.filter(pa.array(insert)),
                            new_bytes.filter(pa.array(insert)), fill(int(insert.sum()), 1)))
        state.insert_updates(pa.concat_tables(updates))

        parts = []
        for rows, mask, sign in ((out_old, emit_old, -1), (out_new, emit_new, 1)):
            sel = rows.filter(pa.array(mask))
            parts.append(sel.append_column(W, pa.array(fill(sel.num_rows, sign))))
        return pa.concat_tables(parts)

    def _empty(self) -> pa.Table:
        return pa.schema(list(self.output_schema) + [pa.field(W, pa.int64())]).empty_table()

    def expire(self, states, below: bytes, emit: bool) -> pa.Table:
        """Event time: drop every group whose encoded group key sorts below ``below`` (its
        first group column is a window the watermark has closed) with its min/max multisets
        and distinct values — one deleted key range per state section, read not at all — and
        with ``emit`` (append mode) return the groups' final rows (+1), read by a scan of only
        the closed groups' range. ``states``: the operator's spines of the bucket (one)."""
        from headrace.pipeline.operators.join import _delete_below

        state = states[0]
        if not self.by:
            return self._empty()
        # from the first non-NULL key: a NULL event time is never final (never late either)
        t = None
        if emit:
            found = list(state.scan(ACC + NOT_NULL, ACC + below))
            t = pa.concat_tables(found).combine_chunks() if found else None
        _delete_below(state, ACC + below, ACC + NOT_NULL)
        for j, kind in enumerate(self.kinds):
            section = {"min": MULTISET, "max": MULTISET, "count_distinct": DISTINCT}.get(kind)
            if section is not None:  # keys: section, tag, group key (multiset value after)
                tag = section + j.to_bytes(2, "big")
                _delete_below(state, tag + below, tag + NOT_NULL)
        if t is None or not t.num_rows:
            return self._empty()
        gkeys = as_array(pc.binary_slice(t["key"], 1, 1 << 30))  # stop: Arrow needs one
        decoded = self.acc_codec.decode(t["val"])
        acc: dict[str, object] = {}
        for f in self.acc_schema:
            col = decoded[f.name]
            if f.name.endswith("limbs"):
                acc[f.name] = exactsum.unpack(col)
            elif f.type == pa.int64():
                acc[f.name] = np.asarray(col.to_numpy(), np.int64)
            else:
                acc[f.name] = as_array(col)
        out = self._outputs(acc, gkeys).filter(pa.array(acc["n"] > 0))
        return out.append_column(W, pa.array(fill(out.num_rows, 1)))

    def _acc_table(self, acc: dict) -> pa.Table:
        cols = []
        for f in self.acc_schema:
            v = acc[f.name]
            if f.name.endswith("limbs"):
                cols.append(exactsum.pack(v))
            elif isinstance(v, np.ndarray):
                cols.append(pa.array(v, pa.int64()))
            else:
                cols.append(v)
        return pa.Table.from_arrays(cols, schema=self.acc_schema)

    def _check_overflow(self, acc: dict, mask: np.ndarray, gkeys: pa.Array) -> None:
        for j, (a, kind) in enumerate(zip(self.aggs, self.kinds, strict=True)):
            if kind != "sum_int":
                continue
            t = self.output_schema.field(len(self.by) + j).type
            bad = mask & (acc[f"{j}nn"] > 0) & ~self._int_fits(acc, j, t)
            if bad.any():
                i = int(np.argmax(bad))
                group = (self.group_codec.decode(gkeys.slice(i, 1)).to_pylist()[0]
                         if self.by else "(global)")
                raise ArithmeticOverflow(
                    f"sum({a.column}) as {a.name!r} overflows {t} in group {group}; "
                    "Spark in ANSI mode raises here too (ARITHMETIC_OVERFLOW / "
                    "NUMERIC_VALUE_OUT_OF_RANGE); cast the column to a wider type to sum it")

    def _int_fits(self, acc: dict, j: int, t: pa.DataType) -> np.ndarray:
        nl = self.int_limbs[j]
        top = acc[f"{j}s{nl - 1}"]
        if nl == 3:
            return (top >= -(1 << 15)) & (top < (1 << 15))
        fits = (top >= -128) & (top < 128)
        unscaled = _int128(acc, j, nl, pa.decimal128(38, 0), fits)
        limit = pa.scalar(decimal.Decimal(10**t.precision - 1), pa.decimal128(38, 0))
        ok = pc.less_equal(pc.abs(pc.if_else(pa.array(fits), unscaled, 0)), limit)
        return fits & np.asarray(ok.to_numpy(zero_copy_only=False), bool)

    def _outputs(self, acc: dict, gkeys: pa.Array) -> pa.Table:
        cols = list(self.group_codec.decode(gkeys).columns) if self.by else []
        for j, kind in enumerate(self.kinds):
            f = self.output_schema.field(len(self.by) + j)
            if kind == "count_star":
                cols.append(pa.array(acc["n"], pa.int64()))
            elif kind == "count":
                cols.append(pa.array(acc[f"{j}nn"], pa.int64()))
            elif kind == "count_distinct":
                cols.append(pa.array(acc[f"{j}nd"], pa.int64()))
            elif kind == "sum_int" and self.int_limbs[j] == 3:
                s0, s1, s2 = (acc[f"{j}s{i}"] for i in range(3))
                with np.errstate(over="ignore"):
                    v = (s2 << 48) + (s1 << 24) + s0
                cols.append(pa.array(v, pa.int64(), mask=acc[f"{j}nn"] <= 0))
            elif kind == "sum_int":
                cols.append(_int128(acc, j, 6, f.type, acc[f"{j}nn"] > 0))
            elif kind in ("sum_double", "avg"):
                cols.append(pa.array(self._double_sum(acc, j, kind), pa.float64(),
                                     mask=acc[f"{j}nn"] <= 0))
            else:
                cols.append(keys.decode_sortable(acc[f"{j}ext"], f.type))
        return pa.Table.from_arrays(cols, schema=self.output_schema)

    @staticmethod
    def _double_sum(acc: dict, j: int, kind: str) -> np.ndarray:
        total = exactsum.to_double(acc[f"{j}limbs"])
        pinf, ninf, nan = acc[f"{j}pinf"] > 0, acc[f"{j}ninf"] > 0, acc[f"{j}nan"] > 0
        total = np.where(pinf, np.inf, np.where(ninf, -np.inf, total))
        total = np.where(nan | (pinf & ninf), np.nan, total)
        if kind == "avg":
            with np.errstate(divide="ignore", invalid="ignore"):
                total = total / np.maximum(acc[f"{j}nn"], 1).astype(np.float64)
        return total

    def _extreme(self, j: int, kind: str, col: pa.Array, valid: np.ndarray, w: np.ndarray,
                 gid: np.ndarray, gkeys: pa.Array, old_ext: pa.Array, state: StateSpine):
        """New min/max per group and the multiset's state delta; the multiset is read only
        for groups whose current extreme was retracted."""
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
        tag = MULTISET + j.to_bytes(2, "big")
        mkeys = keys.concat_binary(tag, gkeys)
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
        upd = zset(mkeys.take(d["g"]), d["v"], d["w"].to_numpy())
        return as_array(ext), upd

    def _distinct(self, j: int, delta: pa.Table, valid: np.ndarray, w: np.ndarray,
                  gid: np.ndarray, gkeys: pa.Array, state: StateSpine):
        """Change in each group's distinct count, and the state delta of value counts."""
        g = len(gkeys)
        sel = pa.array(valid)
        tag = DISTINCT + j.to_bytes(2, "big")
        vk = keys.concat_binary(tag, gkeys.take(pa.array(gid, pa.int64())),
                                self._distinct_codecs[j].encode(delta))
        d = consolidate(pa.table({"k": vk.filter(sel),
                                  "g": pa.array(gid, pa.int64()).filter(sel),
                                  "w": pa.array(w, pa.int64()).filter(sel)}))
        found = state.lookup_many(d["k"])
        fid, _ = align(found["key"], as_array(d["k"]))
        old = np.zeros(d.num_rows, np.int64)
        np.add.at(old, fid, np.asarray(found["w"].to_numpy(), np.int64))
        new = old + np.asarray(d["w"].to_numpy(), np.int64)
        step = (new > 0).astype(np.int64) - (old > 0).astype(np.int64)
        nd = group_sum(np.asarray(d["g"].to_numpy(), np.int64), step, g)
        return nd, zset(d["k"], pa.array([b""] * d.num_rows, pa.binary()), d["w"].to_numpy())


def _int_limbs(col: pa.Array) -> list[np.ndarray]:
    """Integer or decimal128 values as 24-bit limbs (the top one signed); NULLs as 0."""
    if pa.types.is_decimal(col.type):
        n = len(col)
        raw = np.frombuffer(col.buffers()[1], np.uint8, count=(col.offset + n) * 16)
        b = raw[col.offset * 16:].reshape(n, 16).astype(np.int64)
        limbs = [b[:, 3 * i] | (b[:, 3 * i + 1] << 8) | (b[:, 3 * i + 2] << 16)
                 for i in range(5)]
        return limbs + [b[:, 15].astype(np.uint8).view(np.int8).astype(np.int64)]
    v = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64)
    return [v & _M24, (v >> 24) & _M24, v >> 48]


def _int128(acc: dict, j: int, nl: int, t: pa.DataType, valid: np.ndarray) -> pa.Array:
    """Six normalised limbs -> a decimal128 array of type ``t`` (NULL where not valid)."""
    limbs = [acc[f"{j}s{i}"] for i in range(nl)]
    n = len(limbs[0])
    out = np.zeros((n, 16), np.uint8)
    for i in range(5):
        for k in range(3):
            out[:, 3 * i + k] = (limbs[i] >> (8 * k)) & 0xFF
    out[:, 15] = limbs[5] & 0xFF
    nulls = int(n - valid.sum())
    bitmap = pa.array(valid, pa.bool_()).buffers()[1] if nulls else None
    return pa.Array.from_buffers(t, n, [bitmap, pa.py_buffer(out.tobytes())], null_count=nulls)


def _per_group(t: pa.Table, agg: str, g: int) -> pa.Array:
    """The min/max of ``v`` per group id ``g`` in [0, g), NULL where a group has no row."""
    r = t.group_by("g", use_threads=False).aggregate([("v", agg)])
    pos = np.full(g, -1, np.int64)
    pos[np.asarray(r["g"].to_numpy(), np.int64)] = np.arange(r.num_rows)
    return as_array(r[f"v_{agg}"]).take(pa.array(pos, mask=pos < 0))
