"""Window functions over partitions with retractions (``F.row_number().over(w)``), Spark SQL
semantics: row_number, rank, dense_rank, ntile, percent_rank, cume_dist; count/sum/avg/min/max
and first/last/nth_value (IGNORE NULLS or not) over ROWS frames ``rowsBetween(a, b)`` and RANGE
frames ``rangeBetween(a, b)`` (UNBOUNDED, CURRENT ROW — Spark's default frame — or value
offsets over one numeric, date or timestamp order column); an aggregate over the whole
partition without orderBy; ``lag``/``lead``.

The output is every input row with the functions' values appended, as Spark's
``withColumn(name, f.over(w))``. State (one spine, like a join side): key = the normalised
partition key (-0.0 = 0.0, NaN = NaN, NULL is one partition, as Spark's PARTITION BY), val =
the exact row, w = its multiplicity. For a delta, the touched partitions' rows are read, the
functions evaluated over the old rows and over old + delta, and the difference (new - old,
consolidated) is the output: a retraction in the middle of a partition shifts the values of
the rows after it. Cost per batch: the touched partitions' sizes; state: every row of every
partition (no expiry).

Evaluation is vectorised across all touched partitions at once: one sort by (partition, order
keys, the row's encoding), positions and peer groups from run boundaries, row counts and
integer sums from cumulative sums, double sums as Spark folds them (``0.0 + v1 + v2 ...`` in
frame order, so the last bits match), min/max by a sparse table over (value rank, first
position), value-offset frame ends by binary search over (partition, value rank) — see
window_frames.py. A RANGE frame's CURRENT ROW bound is the edge of the row's peer group (rows equal on
every order key, NULLs equal); a value offset reaches the rows whose order value lies in
``[v + a, v + b]`` (``[v - b, v - a]`` under DESC, as Spark flips it), computed in the column's
type: an integer bound that leaves the type raises, as Spark's ANSI addExact does (Spark skips
the bound of a partition's last rows when nothing is left to compare; we check every row's);
a NULL order value's bounded sides reach only the NULLs. lag/lead, ntile, percent_rank and
cume_dist ignore the frame, as Spark's. Ordering follows Spark: ASC NULLS FIRST / DESC NULLS
LAST unless said otherwise, -0.0 and 0.0 are peers, NaN sorts above every number. Rows that tie
on every order key are ordered by their encoding, so ``row_number`` (and first/last among
peers) is deterministic (Spark's order among such ties is not defined); ``rank``/
``dense_rank`` are exact either way. Without orderBy only an aggregate over the whole
partition is accepted (its double sums fold in encoding order; Spark's order is undefined).
A batch that retracts a row more often than it was inserted raises NegativeMultiplicity before
anything is written (the touched partitions are read anyway).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.errors import ArithmeticOverflow
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.operators.deltas import (
    as_array,
    consolidate_rows,
    dense_ids,
    refuse_pushed_negative,
    weights,
    zset,
)
from headrace.pipeline.operators.kernel import (
    Kernel,
    KeyLayout,
    Rebucketable,
    RoutesKeys,
    StateSpine,
)
from headrace.pipeline.operators.window_frames import (
    dense,
    fold,
    frame_bounds,
    frame_extreme,
    frame_sum,
    nth_position,
    ntile,
    range_bounds,
    range_targets,
    run_ends,
    value_rank,
)
from headrace.zset import consolidate

RANKING = ("row_number", "rank", "dense_rank", "ntile", "percent_rank", "cume_dist")
AGGREGATES = ("count", "sum", "avg", "min", "max")
VALUES = ("first", "last", "nth_value")
OFFSETS = ("lag", "lead")
FUNCS = RANKING + AGGREGATES + VALUES + OFFSETS
MAX_ROWS = 1 << 28  # expanded rows (multiplicities) of the touched partitions, per batch
_M24 = (1 << 24) - 1


@dataclass(frozen=True)
class WindowFn:
    """``func`` over ``column`` (None: a ranking function or count(*)), output ``name``.

    ``frame`` of an aggregate: None (ROWS UNBOUNDED PRECEDING .. CURRENT ROW), an int n (ROWS
    n PRECEDING .. CURRENT ROW), or ``[kind, lower, upper]`` with kind "rows" or "range" and
    each bound an offset from the current row (negative: preceding) or None (unbounded); a
    RANGE bound is a value offset (0: the current row's peers; for a timestamp order column
    in microseconds, for a date in days). Of first/last/nth_value: ``[frame, n,
    ignore_nulls]`` (n = 1 for first/last). Of lag/lead: ``[n, default]`` (n >= 1 rows
    back/ahead; default a plain value of the column's type or None). Of ntile: the number of
    buckets. JSON-able, as the plan's params are."""

    func: str
    column: str | None
    name: str
    frame: Any = None

    def bounds(self) -> tuple[str, int | float | None, int | float | None]:
        """(kind, lower, upper) of an aggregate's or value function's frame, checked
        (InvalidInput)."""
        where = f"window function {self.name!r}"
        f = self.value_spec()[0] if self.func in VALUES else self.frame
        if f is None:
            return "rows", None, 0
        if isinstance(f, int) and not isinstance(f, bool):
            if f < 0:
                raise InvalidInput(f"{where}: the frame starts {f!r} rows before the current "
                                   "row; want an int >= 0 or None (unbounded)")
            return "rows", -f, 0
        if not isinstance(f, (list, tuple)) or len(f) != 3 or f[0] not in ("rows", "range"):
            raise InvalidInput(f"{where}: the frame {f!r} is not None, an int >= 0 or "
                               "[\"rows\" | \"range\", lower, upper]")
        kind, lower, upper = f
        number = (int, float) if kind == "range" else int
        for b in (lower, upper):
            if b is not None and (not isinstance(b, number) or isinstance(b, bool)
                                  or b != b or b in (math.inf, -math.inf)):
                raise InvalidInput(f"{where}: the frame bound {b!r} is not "
                                   f"{'a finite number' if kind == 'range' else 'an int'} "
                                   "or None")
        if lower is not None and upper is not None and lower > upper:
            raise InvalidInput(f"{where}: the frame {f!r} starts after it ends")
        return kind, lower, upper

    def value_spec(self) -> tuple[object, int, bool]:
        """(frame, n, ignore_nulls) of first / last / nth_value, checked (InvalidInput)."""
        f = self.frame
        ok = isinstance(f, (list, tuple)) and len(f) == 3
        n = f[1] if ok else None
        if (not ok or not isinstance(n, int) or isinstance(n, bool) or n < 1
                or (self.func != "nth_value" and n != 1) or not isinstance(f[2], bool)):
            raise InvalidInput(f"window function {self.name!r}: {self.func} takes [frame, n, "
                               f"ignore_nulls] with an int n >= 1 (1 for first/last) and a "
                               f"bool, not {f!r}")
        return f[0], n, f[2]

    def buckets(self) -> int:
        """ntile's number of buckets, checked (InvalidInput)."""
        n = self.frame
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n < 2**31:
            raise InvalidInput(f"window function {self.name!r}: ntile takes a number of "
                               f"buckets in [1, 2^31), not {n!r}")
        return n

    def offset(self) -> tuple[int, object]:
        """(signed row offset, default) of lag (-n) / lead (+n), checked (InvalidInput)."""
        f = self.frame
        ok = isinstance(f, (list, tuple)) and len(f) == 2
        n = f[0] if ok else None
        if not ok or not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidInput(f"window function {self.name!r}: {self.func} takes [n, default] "
                               f"with an int n >= 1, not {f!r}")
        return (-n if self.func == "lag" else n), f[1]


@dataclass(frozen=True)
class OrderKey:
    column: str
    descending: bool = False
    nulls_first: bool | None = None  # None: Spark's default (first for ASC, last for DESC)

    @property
    def nulls_go_first(self) -> bool:
        return (not self.descending) if self.nulls_first is None else self.nulls_first


class OverKernel(Kernel, RoutesKeys, Rebucketable):
    state_sides = 1

    def __init__(self, schema: pa.Schema, partition_by: Sequence[str],
                 order_by: Sequence[OrderKey], funcs: Sequence[WindowFn]):
        self.partition_by = list(partition_by)
        self.order_by = list(order_by)
        self.funcs = list(funcs)
        if not self.funcs:
            raise InvalidInput("a window operator needs at least one window function")
        for f in schema:
            if f.name.startswith(PREFIX):
                raise InvalidInput(f"column {f.name!r} uses the reserved prefix {PREFIX!r}")
        for c in self.partition_by + [o.column for o in self.order_by]:
            if c not in schema.names:
                raise InvalidInput(f"window: no column {c!r} to partition or order by in "
                                   f"{schema.names}")
        for o in self.order_by:
            keys.check_type(schema.field(o.column).type, f"window order column {o.column!r}")
        names = list(schema.names)
        out = list(schema)
        for fn in self.funcs:
            where = f"window function {fn.name!r}"
            if fn.func not in FUNCS:
                raise InvalidInput(f"{where}: {fn.func!r} is not one of {FUNCS}")
            if fn.name in names or fn.name.startswith(PREFIX) or fn.name == W:
                raise InvalidInput(f"{where}: the name repeats a column or uses the reserved "
                                   f"prefix {PREFIX!r}")
            names.append(fn.name)
            if not self.order_by and not (fn.func in AGGREGATES
                                          and fn.bounds()[1:] == (None, None)):
                raise InvalidInput(f"{where}: {fn.func} needs an orderBy (without one the "
                                   "rows' order in a partition is not defined; only an "
                                   "aggregate over the whole partition does without)")
            if fn.func in RANKING:
                if fn.column is not None:
                    raise InvalidInput(f"{where}: {fn.func} takes no column")
                if fn.func == "ntile":
                    fn.buckets()
                out.append(pa.field(fn.name, pa.float64() if fn.func in ("percent_rank",
                                                                         "cume_dist")
                                    else pa.int32()))
                continue
            if fn.column is None:
                if fn.func != "count":
                    raise InvalidInput(f"{where}: {fn.func} needs a column")
                self._check_frame(fn, schema)
                out.append(pa.field(fn.name, pa.int64()))
                continue
            if fn.column not in schema.names:
                raise InvalidInput(f"{where}: no column {fn.column!r} in {schema.names}")
            t = schema.field(fn.column).type
            keys.check_type(t, f"{where} column {fn.column!r}")
            if fn.func in OFFSETS:
                _, default = fn.offset()
                try:
                    pa.scalar(default, t)
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                    raise InvalidInput(f"{where}: the default {default!r} is not a {t} "
                                       f"value of column {fn.column!r}: {e}") from e
                out.append(pa.field(fn.name, t))
                continue
            self._check_frame(fn, schema)
            if fn.func in ("sum", "avg"):
                if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or t == pa.uint64():
                    raise InvalidInput(f"{where}: {fn.func} of {t} is not supported over a "
                                       "window (integers and floats are)")
                if fn.func == "sum" and pa.types.is_integer(t):
                    out.append(pa.field(fn.name, pa.int64()))
                else:
                    out.append(pa.field(fn.name, pa.float64()))
            elif fn.func == "count":
                out.append(pa.field(fn.name, pa.int64()))
            else:
                out.append(pa.field(fn.name, t))
        self.input_schema = schema
        self.part_codec = (keys.RowCodec(schema, self.partition_by, normalize=True)
                           if self.partition_by else None)
        self.row_codec = keys.RowCodec(schema)
        self.output_schema = pa.schema(out)
        self.out_codec = keys.RowCodec(self.output_schema)

    def _check_frame(self, fn: WindowFn, schema: pa.Schema) -> None:
        """A RANGE frame with a value offset needs ONE order column of a type that adds."""
        kind, lower, upper = fn.bounds()
        offsets = [b for b in (lower, upper) if b not in (None, 0)]
        if kind != "range" or not offsets:
            return
        where = f"window function {fn.name!r}: the RANGE frame {fn.frame!r}"
        if len(self.order_by) != 1:
            raise InvalidInput(f"{where} has a value offset, which needs exactly one order "
                               f"column, not {len(self.order_by)}")
        col = self.order_by[0].column
        t = schema.field(col).type
        if pa.types.is_floating(t):
            return
        if pa.types.is_timestamp(t) and t.unit != "us":
            raise InvalidInput(f"{where}: the order column {col!r} is {t}; value offsets need "
                               "microseconds")
        if not (pa.types.is_signed_integer(t) or pa.types.is_date32(t)
                or pa.types.is_timestamp(t)):
            raise InvalidInput(f"{where}: the order column {col!r} is {t}; value offsets need "
                               "a signed integer, float, date or timestamp column")
        storage = np.dtype(np.int32 if pa.types.is_date32(t) else
                           np.int64 if pa.types.is_timestamp(t) else t.to_pandas_dtype())
        top = int(np.iinfo(storage).max)
        for b in offsets:
            if not isinstance(b, int) or not -top <= b <= top:
                raise InvalidInput(f"{where}: the offset {b!r} is not an integer within the "
                                   f"range of {t} (the order column {col!r})")

    def key_layout(self, side: int) -> KeyLayout:
        """The partition key leads the state key."""
        return self.part_codec, 0

    def bucket_columns(self, input_index: int) -> list[str]:
        return list(self.partition_by)

    def _part_keys(self, delta: pa.Table) -> pa.Array:
        if self.part_codec is None:
            return pa.array([b""] * delta.num_rows, pa.binary())
        return self.part_codec.encode(delta)

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """The state key of each delta row (its partition); see AggregateKernel.route_keys."""
        return [(0, self._part_keys(deltas[0]))]

    def _empty(self) -> pa.Table:
        return pa.schema(list(self.output_schema) + [pa.field(W, pa.int64())]).empty_table()

    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
        delta, state = deltas[0], states[0]
        if delta.num_rows == 0:
            return self._empty()
        d = consolidate(zset(self._part_keys(delta), self.row_codec.encode(delta),
                             weights(delta)))
        if d.num_rows == 0:
            return self._empty()
        old = state.lookup_many(as_array(pc.unique(d["key"])))
        # a row retracted more often than inserted: nothing written yet
        refuse_pushed_negative(old, d, self.row_codec, "window partition row")
        new = consolidate(pa.concat_tables([old, d]))
        out_new = self._evaluate(new)  # raises ArithmeticOverflow before any state change
        out_old = self._evaluate(old)
        state.insert_updates(d)
        both = pa.concat_tables([
            out_old.append_column(W, pa.array(np.full(out_old.num_rows, -1, np.int64))),
            out_new.append_column(W, pa.array(np.ones(out_new.num_rows, np.int64)))])
        return consolidate_rows(both, self.out_codec)

    # ---- evaluation over whole partitions ---------------------------------------------
    def _evaluate(self, z: pa.Table) -> pa.Table:
        """The output rows (input columns + function values, one per copy of a row) of the
        partitions in ``z`` (key, val, w), each partition complete."""
        w = np.asarray(z["w"].to_numpy(), np.int64) if z.num_rows else np.zeros(0, np.int64)
        keep = w > 0  # a net-negative row (state from before apply checked) is in none
        if not keep.all():
            z, w = z.filter(pa.array(keep)), w[keep]
        total = int(w.sum())
        if total > MAX_ROWS:
            raise InvalidInput(f"window operator: the touched partitions hold {total} rows "
                               f"in one batch, over the limit of {MAX_ROWS}")
        if total == 0:
            return self.output_schema.empty_table()
        distinct = self.row_codec.decode(z["val"])
        # sort the distinct rows, then expand copies in place (copies are adjacent ties)
        _, part = dense_ids(z["key"])
        order_ranks = [self._order_rank(distinct[o.column], o) for o in self.order_by]
        perm = np.lexsort([*reversed(order_ranks), part])
        tied = np.zeros(len(perm), bool)  # rows equal to a neighbour on every sort key
        same = np.ones(len(perm) - 1, bool)
        for r in [part, *order_ranks]:
            rs = r[perm]
            same &= rs[1:] == rs[:-1]
        tied[1:] |= same
        tied[:-1] |= same
        if tied.any():  # only such rows need their encodings compared
            tie = np.zeros(len(perm), np.int64)
            rows_tied = perm[tied]
            tie[rows_tied] = dense(as_array(z["val"]).take(pa.array(rows_tied)))
            perm = np.lexsort([tie, *reversed(order_ranks), part])
        rep = w[perm]
        idx = np.repeat(perm, rep)
        n = len(idx)
        part_s = part[idx]
        new_part = np.r_[True, part_s[1:] != part_s[:-1]]
        peer_change = new_part.copy()
        for r in order_ranks:
            rs = r[idx]
            peer_change[1:] |= rs[1:] != rs[:-1]
        pos = np.arange(n, dtype=np.int64)
        part_start = np.maximum.accumulate(np.where(new_part, pos, 0))
        part_end = run_ends(new_part)
        peer_start = np.maximum.accumulate(np.where(peer_change, pos, 0))
        peer_end = run_ends(peer_change)
        rows = distinct.take(pa.array(idx))
        cols = list(rows.columns)
        for fn in self.funcs:
            if fn.func == "row_number":
                cols.append(pa.array((pos - part_start + 1).astype(np.int32)))
            elif fn.func == "rank":
                cols.append(pa.array((peer_start - part_start + 1).astype(np.int32)))
            elif fn.func == "dense_rank":
                c = np.cumsum(peer_change)
                cols.append(pa.array((c - c[part_start] + 1).astype(np.int32)))
            elif fn.func == "ntile":
                cols.append(pa.array(ntile(pos - part_start, part_end - part_start + 1,
                                           fn.buckets()).astype(np.int32)))
            elif fn.func in ("percent_rank", "cume_dist"):
                size = (part_end - part_start + 1).astype(np.float64)
                if fn.func == "cume_dist":
                    cols.append(pa.array((peer_end - part_start + 1) / size))
                else:
                    rank = (peer_start - part_start).astype(np.float64)
                    cols.append(pa.array(np.where(size > 1, rank / np.maximum(size - 1, 1),
                                                  0.0)))
            elif fn.func in OFFSETS:
                cols.append(self._offset(fn, as_array(rows[fn.column]), pos, part_start,
                                         part_end))
            else:
                kind, lower, upper = fn.bounds()
                lo, hi = self._frame_rows(fn, kind, lower, upper, rows, part_s, pos,
                                          (part_start, part_end, peer_start, peer_end))
                col = None if fn.column is None else as_array(rows[fn.column])
                if fn.func in VALUES:
                    cols.append(self._value(fn, col, lo, hi))
                else:
                    cols.append(self._frame_agg(fn, col, lo, hi, new_part, lower is None))
        return pa.Table.from_arrays(cols, schema=self.output_schema)

    def _frame_rows(self, fn: WindowFn, kind: str, lower, upper, rows: pa.Table,
                    part: np.ndarray, pos: np.ndarray, ends: tuple) -> tuple:
        """(lo, hi) of each sorted row's frame; an empty frame as lo = pos, hi = pos - 1."""
        part_start, part_end, peer_start, peer_end = ends
        if kind == "rows" or all(b in (None, 0) for b in (lower, upper)):
            return frame_bounds(kind, lower, upper, pos, part_start, part_end, peer_start,
                                peer_end)
        o = self.order_by[0]
        col = as_array(rows[o.column])
        where = (f"window function {fn.name!r}: RANGE frame bound over order column "
                 f"{o.column!r}")
        try:
            lo_t, hi_t = (None if b is None else range_targets(col, b, o.descending, where)
                          for b in (lower, upper))
            targets = (lo_t, hi_t)
        except OverflowError as e:
            raise ArithmeticOverflow(f"{e}; Spark in ANSI mode raises here too "
                                     "(ARITHMETIC_OVERFLOW)") from None
        lo, hi = range_bounds(col, o.descending, o.nulls_go_first, part, targets,
                              (part_start, part_end))
        empty = lo > hi
        return np.where(empty, pos, lo), np.where(empty, pos - 1, hi)

    @staticmethod
    def _value(fn: WindowFn, col: pa.Array, lo: np.ndarray, hi: np.ndarray) -> pa.Array:
        """first / last / nth_value: the n-th row of the frame (from its end for last),
        NULL where the frame holds fewer rows (non-NULL rows, with IGNORE NULLS)."""
        _, n, ignore_nulls = fn.value_spec()
        valid = (np.ones(len(col), bool) if col.null_count == 0 else
                 np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool))
        p, found = nth_position(valid, lo, hi, n, fn.func == "last", ignore_nulls)
        taken = col.take(pa.array(np.where(found, p, 0)))
        return as_array(pc.if_else(pa.array(found), taken, pa.scalar(None, col.type)))

    @staticmethod
    def _offset(fn: WindowFn, col: pa.Array, pos: np.ndarray, part_start: np.ndarray,
                part_end: np.ndarray) -> pa.Array:
        """lag/lead: the value ``n`` rows back/ahead in the partition (NULL if that row's is),
        the default where no such row is; the frame plays no part, as in Spark."""
        off, default = fn.offset()
        src = pos + off
        inside = (src >= part_start) & (src <= part_end)
        taken = col.take(pa.array(np.where(inside, src, pos)))
        return as_array(pc.if_else(pa.array(inside), taken, pa.scalar(default, col.type)))

    @staticmethod
    def _order_rank(col, o: OrderKey) -> np.ndarray:
        """An int64 per row whose order is Spark's order of the column under ``o``."""
        arr = as_array(col)
        r = value_rank(arr)
        if o.descending:
            r = -r
        if arr.null_count:
            valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
            r = np.where(valid, r, (r.min() - 1) if o.nulls_go_first else (r.max() + 1))
        return r

    def _frame_agg(self, fn: WindowFn, col: pa.Array | None, lo: np.ndarray, hi: np.ndarray,
                   new_part: np.ndarray, from_start: bool) -> pa.Array:
        """count/sum/avg/min/max over the rows lo..hi (inclusive) of the sorted rows
        (``from_start``: every frame starts at its partition's first row)."""
        n = len(hi)
        valid = (np.ones(n, bool) if col is None or col.null_count == 0 else
                 np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool))
        count = frame_sum(valid.astype(np.int64), lo, hi)
        if fn.func == "count":
            return pa.array(count, pa.int64())
        assert col is not None, "only count(*) reads no column"
        empty = count == 0
        if fn.func in ("min", "max"):
            return frame_extreme(col, valid, lo, hi, fn.func, empty)
        if fn.func == "sum" and pa.types.is_integer(col.type):
            v = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64)
            limbs = [frame_sum(part, lo, hi) for part in (v & _M24, (v >> 24) & _M24, v >> 48)]
            for i in range(2):  # carry: the low limbs into [0, 2^24)
                limbs[i + 1] += limbs[i] >> 24
                limbs[i] &= _M24
            bad = ~empty & ((limbs[2] < -(1 << 15)) | (limbs[2] >= (1 << 15)))
            if bad.any():
                raise ArithmeticOverflow(
                    f"sum({fn.column}) over the window as {fn.name!r} overflows bigint; Spark "
                    "in ANSI mode raises here too (ARITHMETIC_OVERFLOW); cast the column to "
                    "a wider type to sum it")
            with np.errstate(over="ignore"):
                total = (limbs[2] << 48) + (limbs[1] << 24) + limbs[0]
            return pa.array(total, pa.int64(), mask=empty)
        v = np.asarray(col.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False),
                       np.float64)
        if pa.types.is_integer(col.type) and np.abs(v).sum() < 2.0 ** 53:
            # avg of integers: every partial sum is an integer below 2^53, so Spark's double
            # fold is exact in any order and prefix sums give it bit for bit
            total = frame_sum(v.astype(np.int64), lo, hi).astype(np.float64)
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN as Spark's
                total = fold(v, lo, hi, new_part, from_start)
        if fn.func == "avg":
            with np.errstate(divide="ignore", invalid="ignore"):
                total = total / np.maximum(count, 1).astype(np.float64)
        return pa.array(total, pa.float64(), mask=empty)
