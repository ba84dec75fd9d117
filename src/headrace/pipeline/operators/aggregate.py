"""GROUP BY with retractions, Spark SQL semantics: count(*), count(a, ...), sum, avg, min, max,
count(DISTINCT a, ...), sum(DISTINCT x), avg(DISTINCT x); no group columns = a global
aggregate (one row, even over empty input).

State (one spine; every key starts with a tag byte, then the group key, so a group's rows share
its bucket):

- ``00 group`` -> the group's accumulators (weight 1): count(*), and per aggregate its non-NULL
  count (for a DISTINCT aggregate: of distinct values), exact sums (``accumulators``), the
  current min/max;
- ``01 agg group`` -> val = a value (order-preserving bytes), w = its multiplicity: the
  min/max multiset. It is read only for groups whose current extreme was retracted;
  append-only input never reads it;
- ``02 agg group value`` -> w = the multiplicity of a distinct value (the tuple of a DISTINCT
  aggregate's arguments, normalised), read only for the values in the delta. A value entering
  or leaving the set adds or removes it in that aggregate's count/sum accumulators.

Output: for each changed group, the old row with weight -1 and the new row with +1 (a group
whose visible row did not change emits nothing).

A batch that leaves a group's accumulators where no set of rows could put them — count(*)
below 0, a group of count 0 that still holds a sum or an extreme, a non-NULL count above the
group's count — or a min/max or distinct value's multiplicity below 0 (checked where the
kernel reads it) raises NegativeMultiplicity before any state is written: it retracted a row
that was never inserted. A retraction that keeps every accumulator possible (another row of
the same group and value) cannot be told apart: only the accumulators are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import FormatError, InvalidInput
from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.errors import ArithmeticOverflow, NegativeMultiplicity
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.operators import accumulators, exactsum
from headrace.pipeline.operators.deltas import (
    align,
    as_array,
    dense_ids,
    fill,
    group_sum,
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
    replace_rows,
    scanning,
    tagged_offsets,
)
from headrace.pipeline.operators.multisets import distinct_steps, extreme

FUNCS = ("count", "sum", "avg", "min", "max", "count_distinct", "sum_distinct",
         "avg_distinct")
ACC, MULTISET, DISTINCT = b"\x00", b"\x01", b"\x02"
NOT_NULL = b"\x01"  # RowCodec's flag byte before a non-NULL value (encoding/rowkeys.py)


@dataclass(frozen=True)
class Agg:
    """One aggregate: ``func`` over ``column`` (None only for count(*); a tuple of columns for
    count / count_distinct over several, which count rows where none is NULL), output
    ``name``."""

    func: str
    column: str | tuple[str, ...] | None
    name: str

    @property
    def columns(self) -> tuple[str, ...]:
        if self.column is None:
            return ()
        return (self.column,) if isinstance(self.column, str) else tuple(self.column)

    def sql(self) -> str:
        func, distinct = self.func.removesuffix("_distinct"), self.func.endswith("_distinct")
        return f"{func}({'DISTINCT ' if distinct else ''}{', '.join(self.columns) or '*'})"


def _long_sum_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) and t != pa.uint64()


class AggregateKernel(Kernel, RoutesKeys, Expires, Rebucketable):
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
        # DISTINCT aggregates: the codec of their value tuples (state section 02)
        self._distinct_codecs: dict[int, keys.RowCodec] = {}
        for j, a in enumerate(self.aggs):
            kind, acc_j, out_t = self._define(schema, j, a, names)
            names.append(a.name)
            self.kinds.append(kind)
            acc += acc_j
            out.append(pa.field(a.name, out_t))
            if a.func.endswith("_distinct"):
                self._distinct_codecs[j] = keys.RowCodec(schema, list(a.columns),
                                                         normalize=True)
        self.input_schema = schema
        self.acc_schema = pa.schema(acc)
        self.acc_codec = keys.RowCodec(self.acc_schema)
        self.output_schema = pa.schema(out)
        self.out_codec = keys.RowCodec(self.output_schema)

    def _define(self, schema: pa.Schema, j: int, a: Agg, names: list[str]):
        """(kind, accumulator fields, output type) of aggregate ``j``, or InvalidInput."""
        if a.func not in FUNCS:
            raise InvalidInput(f"aggregate {a.name!r}: unknown function {a.func!r}; "
                               f"have {FUNCS}")
        if a.name in names or a.name.startswith(PREFIX) or a.name == W:
            raise InvalidInput(f"aggregate output {a.name!r} repeats a column name or uses "
                               f"the reserved prefix {PREFIX!r}")
        cols = a.columns
        if not cols:
            if a.func != "count":
                raise InvalidInput(f"aggregate {a.name!r}: {a.func} needs a column")
            return "count_star", [], pa.int64()
        if len(cols) > 1 and a.func not in ("count", "count_distinct"):
            raise InvalidInput(f"aggregate {a.name!r}: {a.sql()} takes one column (only "
                               "count and count_distinct take several)")
        for c in cols:
            if c not in schema.names:
                raise InvalidInput(f"aggregate {a.name!r}: unknown column {c!r}")
            keys.check_type(schema.field(c).type, f"aggregate {a.name!r} column {c!r}")
        func = a.func.removesuffix("_distinct")
        what = f"{func}(DISTINCT)" if a.func.endswith("_distinct") else func
        if func == "count":
            return "count", accumulators.fields("count", j, 0), pa.int64()
        t = schema.field(cols[0]).type
        if func in ("min", "max"):
            return func, [pa.field(f"{j}ext", pa.binary())], t
        numeric = pa.types.is_integer(t) or pa.types.is_floating(t)
        if not (numeric or (func == "sum" and pa.types.is_decimal128(t))):
            raise InvalidInput(f"aggregate {a.name!r}: {what} of {t} is not supported "
                               "(integers and floats are; sum also takes decimal128)")
        if func == "sum" and (_long_sum_type(t) or pa.types.is_decimal128(t)):
            self.int_limbs[j] = 6 if pa.types.is_decimal(t) else 3
            out_t = (pa.decimal128(min(38, t.precision + 10), t.scale)
                     if pa.types.is_decimal(t) else pa.int64())
            return "sum_int", accumulators.fields("sum_int", j, self.int_limbs[j]), out_t
        if func == "sum" and t == pa.uint64():
            raise InvalidInput(f"aggregate {a.name!r}: {what} of uint64 is not supported")
        kind = "sum_double" if func == "sum" else "avg"
        return kind, accumulators.fields(kind, j, 0), pa.float64()

    @property
    def _group(self) -> keys.RowCodec:
        """The group key's codec (only an aggregate with ``by`` has one)."""
        assert self.group_codec is not None, "a global aggregate has no group key"
        return self.group_codec

    def key_layout(self, side: int) -> KeyLayout:
        """ACC g | MULTISET j j g | DISTINCT j j g v: the group key after the section tag."""
        return self.group_codec, tagged_offsets({0: 1, 1: 3, 2: 3}, "aggregate")

    def bucket_columns(self, input_index: int) -> list[str]:
        return list(self.by)

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """Every state key ``apply`` may read or write for these deltas, as (input, keys
        aligned with that input's rows): a task-wide state routes each key to its row's
        bucket, so one ``apply`` serves all of a task's buckets."""
        delta = deltas[0]
        g = (self._group.encode(delta) if self.by
             else pa.array([b""] * delta.num_rows, pa.binary()))
        out = [(0, keys.concat_binary(ACC, g))]
        for j, kind in enumerate(self.kinds):
            tag = j.to_bytes(2, "big")
            if kind in ("min", "max"):
                out.append((0, keys.concat_binary(MULTISET + tag, g)))
            elif j in self._distinct_codecs:
                out.append((0, keys.concat_binary(DISTINCT + tag, g,
                                                  self._distinct_codecs[j].encode(delta))))
        return out

    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
        delta, state = deltas[0], states[0]
        n_rows = delta.num_rows
        if self.by and n_rows == 0:
            return self._empty()
        w = weights(delta)
        exactsum.check_weights(w, "aggregate")
        if self.by:
            gkeys, gid = dense_ids(self._group.encode(delta))
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

        def old_limbs(name: str) -> np.ndarray:
            limbs = np.zeros((g, exactsum.LIMBS), np.int64)
            limbs[oid] = exactsum.unpack(old_acc[name])
            return limbs

        new: dict[str, Any] = {"n": old_int("n") + group_sum(gid, w, g)}
        olds: dict[str, Any] = {"n": old_int("n")}
        updates: list[pa.Table] = []
        below_zero = np.zeros(g, bool)  # a min/max or distinct value's multiplicity
        for j, (a, kind) in enumerate(zip(self.aggs, self.kinds, strict=True)):
            if kind == "count_star":
                continue
            valid = np.ones(n_rows, bool)
            for c in a.columns:  # SQL: a row counts where no argument is NULL
                valid &= np.asarray(as_array(delta[c]).is_valid().to_numpy(
                    zero_copy_only=False), bool)
            col = as_array(delta[a.columns[0]])
            if kind in ("min", "max"):
                olds[f"{j}ext"] = as_array(old_acc[f"{j}ext"]).take(take_old)
                ext, upd, bad = extreme(MULTISET + j.to_bytes(2, "big"), kind, col, valid, w,
                                        gid, gkeys, olds[f"{j}ext"], state)
                new[f"{j}ext"] = ext
                updates.append(upd)
                below_zero |= bad
                continue
            rows_w, rows_gid = w, gid
            if j in self._distinct_codecs:  # the set's changes are the rows to accumulate
                rows, rows_gid, rows_w, upd, bad = distinct_steps(
                    DISTINCT + j.to_bytes(2, "big"), self._distinct_codecs[j], delta, valid, w,
                    gid, gkeys, state)
                updates.append(upd)
                below_zero |= bad
                col, valid = col.take(pa.array(rows, pa.int64())), np.ones(len(rows), bool)
            o, nw = accumulators.update(kind, j, self.int_limbs.get(j, 0), col, valid, rows_w,
                                        rows_gid, g, old_int, old_limbs)
            olds.update(o)
            new.update(nw)

        # before any state is written: a group no multiset of rows gives (and that was not
        # so before: state from before this check is left to stand) is a retraction of rows
        # never inserted
        bad = self._impossible(new)
        if bad.any():
            bad &= ~(has_old & self._impossible(olds))
        bad |= below_zero
        if bad.any():
            raise NegativeMultiplicity(self._describe(new, gkeys, int(np.argmax(bad)),
                                                      bool(below_zero[np.argmax(bad)])),
                                       gkeys.filter(pa.array(bad)).to_pylist())
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

        groups = self._group.decode(gkeys).columns if self.by else []  # decoded once
        out_old = self._outputs(olds, gkeys, groups)
        out_new = self._outputs(new, gkeys, groups)
        same = np.asarray(pc.equal(self.out_codec.encode(out_old),
                                   self.out_codec.encode(out_new)).to_numpy(
            zero_copy_only=False), bool)
        both = vis_old & vis_new & same
        emit_old = changed & vis_old & ~both
        emit_new = changed & vis_new & ~both

        if updates:  # min/max multisets, distinct values: keys of their own sections
            state.insert_updates(pa.concat_tables(updates))
        # each changed group's accumulator row replaces its old one (one row per group)
        retract, insert = changed & has_old, changed & keep_new
        replace_rows(state, uniq.filter(pa.array(changed)),
                     zset(uniq.filter(pa.array(retract)), old_bytes.filter(pa.array(retract)),
                          fill(int(retract.sum()), 1)),
                     zset(uniq.filter(pa.array(insert)), new_bytes.filter(pa.array(insert)),
                          fill(int(insert.sum()), 1)))

        parts = []
        for rows, mask, sign in ((out_old, emit_old, -1), (out_new, emit_new, 1)):
            sel = rows.filter(pa.array(mask))
            parts.append(sel.append_column(W, pa.array(fill(sel.num_rows, sign))))
        return pa.concat_tables(parts)

    def _empty(self) -> pa.Table:
        return pa.schema(list(self.output_schema) + [pa.field(W, pa.int64())]).empty_table()

    def _impossible(self, acc: dict) -> np.ndarray:
        """Per group: accumulators no multiset of rows gives — a count(*) below 0, a group of
        count 0 that still holds a value (an extreme, a non-NULL count, a sum), a column's
        fields out of line with each other (``accumulators.impossible``)."""
        n = acc["n"]
        bad = n < 0
        for j, kind in enumerate(self.kinds):
            if kind in ("min", "max"):
                ext = as_array(acc[f"{j}ext"])
                bad |= (n == 0) & np.asarray(ext.is_valid().to_numpy(zero_copy_only=False),
                                             bool)
            elif kind != "count_star":
                bad |= accumulators.impossible(kind, j, self.int_limbs.get(j, 0), acc, n)
        return bad

    def _describe(self, acc: dict, gkeys: pa.Array, i: int, below_zero: bool) -> str:
        """Group ``i``'s impossible accumulators, in words."""
        group = (self._group.decode(gkeys.slice(i, 1)).to_pylist()[0] if self.by
                 else "(global)")
        parts = [f"count(*) would be {int(acc['n'][i])}"]
        for j, (a, kind) in enumerate(zip(self.aggs, self.kinds, strict=True)):
            if kind in ("min", "max"):
                has = as_array(acc[f"{j}ext"]).slice(i, 1).is_valid()[0].as_py()
                parts.append(f"{a.sql()} {'still holds a value' if has else 'holds none'}")
            elif kind != "count_star":
                one = {k: (v[i:i + 1] if isinstance(v, np.ndarray) else v) for k, v in
                       acc.items()}
                one[f"{j}nn"] = np.ones(1, np.int64)  # the sum as it stands, counted or not
                t = self.output_schema.field(len(self.by) + j).type
                text = f"{a.sql()} over {int(acc[f'{j}nn'][i])} value(s)"
                if kind != "count":
                    total = accumulators.output("sum_double" if kind == "avg" else kind, j,
                                                self.int_limbs.get(j, 0), one,
                                                pa.float64() if kind == "avg" else t)
                    text += f" summing to {total[0].as_py()}"
                parts.append(text)
        why = ("a value of a min/max or DISTINCT aggregate would be retracted more often than "
               "inserted" if below_zero else "no set of inserted rows gives that")
        return f"group {group}: {', '.join(parts)}: {why}"

    def expire(self, states: Sequence[StateSpine], below: bytes, emit: bool) -> pa.Table:
        """Event time: drop every group whose encoded group key sorts below ``below`` (its
        first group column is a window the watermark has closed) with its min/max multisets
        and distinct values — one deleted key range per state section, read not at all — and
        with ``emit`` (append mode) return the groups' final rows (+1), read by a scan of only
        the closed groups' range. ``states``: the operator's spines of the bucket (one)."""
        state = states[0]
        if not self.by:
            return self._empty()
        # from the first non-NULL key: a NULL event time is never final (never late either)
        t = None
        if emit:
            found = list(scanning(state).scan(ACC + NOT_NULL, ACC + below))
            t = pa.concat_tables(found).combine_chunks() if found else None
        delete_below(state, ACC + below, ACC + NOT_NULL)
        for j, kind in enumerate(self.kinds):
            section = (MULTISET if kind in ("min", "max")
                       else DISTINCT if j in self._distinct_codecs else None)
            if section is not None:  # keys: section, tag, group key (multiset value after)
                tag = section + j.to_bytes(2, "big")
                delete_below(state, tag + below, tag + NOT_NULL)
        if t is None or not t.num_rows:
            return self._empty()
        gkeys = as_array(pc.binary_slice(t["key"], 1, 1 << 30))  # stop: Arrow needs one
        decoded = self.acc_codec.decode(t["val"])
        acc: dict[str, Any] = {}
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
            bad = mask & (acc[f"{j}nn"] > 0) & ~accumulators.int_fits(
                acc, j, self.int_limbs[j], t)
            if bad.any():
                i = int(np.argmax(bad))
                group = (self._group.decode(gkeys.slice(i, 1)).to_pylist()[0]
                         if self.by else "(global)")
                raise ArithmeticOverflow(
                    f"{a.sql()} as {a.name!r} overflows {t} in group {group}; "
                    "Spark in ANSI mode raises here too (ARITHMETIC_OVERFLOW / "
                    "NUMERIC_VALUE_OUT_OF_RANGE); cast the column to a wider type to sum it")

    def _outputs(self, acc: dict, gkeys: pa.Array, groups: list | None = None) -> pa.Table:
        if groups is None:
            groups = self._group.decode(gkeys).columns if self.by else []
        cols = list(groups)
        for j, kind in enumerate(self.kinds):
            f = self.output_schema.field(len(self.by) + j)
            if kind == "count_star":
                cols.append(pa.array(acc["n"], pa.int64()))
            elif kind in ("min", "max"):
                cols.append(keys.decode_sortable(acc[f"{j}ext"], f.type))
            else:
                cols.append(accumulators.output(kind, j, self.int_limbs.get(j, 0), acc, f.type))
        return pa.Table.from_arrays(cols, schema=self.output_schema)
