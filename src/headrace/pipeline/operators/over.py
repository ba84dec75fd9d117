"""Window functions over partitions with retractions (``F.row_number().over(w)``, rolling
aggregates over ``rowsBetween(-n, 0)``), Spark SQL semantics.

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
position). Ordering follows Spark: ASC NULLS FIRST / DESC NULLS LAST unless said otherwise,
-0.0 and 0.0 are peers, NaN sorts above every number. Rows that tie on every order key are
ordered by their encoding, so ``row_number`` is deterministic (Spark's order among such ties
is not defined); ``rank``/``dense_rank`` are exact either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline import keys
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.operators.base import ArithmeticOverflow, StateSpine
from headrace.pipeline.operators.zset import (
    as_array,
    consolidate,
    consolidate_rows,
    dense_ids,
    weights,
    zset,
)

RANKING = ("row_number", "rank", "dense_rank")
AGGREGATES = ("count", "sum", "avg", "min", "max")
FUNCS = RANKING + AGGREGATES
MAX_ROWS = 1 << 28  # expanded rows (multiplicities) of the touched partitions, per batch
_M24 = (1 << 24) - 1
_LOW32 = (1 << 32) - 1


@dataclass(frozen=True)
class WindowFn:
    """``func`` over ``column`` (None: a ranking function or count(*)), output ``name``, over
    the ROWS frame ``preceding`` PRECEDING .. CURRENT ROW (None: UNBOUNDED PRECEDING)."""

    func: str
    column: str | None
    name: str
    preceding: int | None = None


@dataclass(frozen=True)
class OrderKey:
    column: str
    descending: bool = False
    nulls_first: bool | None = None  # None: Spark's default (first for ASC, last for DESC)

    @property
    def nulls_go_first(self) -> bool:
        return (not self.descending) if self.nulls_first is None else self.nulls_first


class OverKernel:
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
            if not self.order_by:
                raise InvalidInput(f"{where}: {fn.func} needs an orderBy (without one the "
                                   "rows' order in a partition is not defined)")
            if fn.preceding is not None and (not isinstance(fn.preceding, int)
                                             or fn.preceding < 0):
                raise InvalidInput(f"{where}: the frame starts {fn.preceding!r} rows before "
                                   "the current row; want an int >= 0 or None (unbounded)")
            if fn.func in RANKING:
                if fn.column is not None:
                    raise InvalidInput(f"{where}: {fn.func} takes no column")
                out.append(pa.field(fn.name, pa.int32()))
                continue
            if fn.column is None:
                if fn.func != "count":
                    raise InvalidInput(f"{where}: {fn.func} needs a column")
                out.append(pa.field(fn.name, pa.int64()))
                continue
            if fn.column not in schema.names:
                raise InvalidInput(f"{where}: no column {fn.column!r} in {schema.names}")
            t = schema.field(fn.column).type
            keys.check_type(t, f"{where} column {fn.column!r}")
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

    def apply(self, deltas: list[pa.Table], states: list[StateSpine]) -> pa.Table:
        delta, state = deltas[0], states[0]
        if delta.num_rows == 0:
            return self._empty()
        d = consolidate(zset(self._part_keys(delta), self.row_codec.encode(delta),
                             weights(delta)))
        if d.num_rows == 0:
            return self._empty()
        old = state.lookup_many(as_array(pc.unique(d["key"])))
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
        keep = w > 0  # a net-negative row (retracted more than inserted) is in no partition
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
            tie[rows_tied] = _dense(as_array(z["val"]).take(pa.array(rows_tied)))
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
        rows = distinct.take(pa.array(idx))
        cols = list(rows.columns)
        for fn in self.funcs:
            if fn.func == "row_number":
                cols.append(pa.array((pos - part_start + 1).astype(np.int32)))
            elif fn.func == "rank":
                peer_start = np.maximum.accumulate(np.where(peer_change, pos, 0))
                cols.append(pa.array((peer_start - part_start + 1).astype(np.int32)))
            elif fn.func == "dense_rank":
                c = np.cumsum(peer_change)
                cols.append(pa.array((c - c[part_start] + 1).astype(np.int32)))
            else:
                lo = (part_start if fn.preceding is None
                      else np.maximum(part_start, pos - fn.preceding))
                col = None if fn.column is None else as_array(rows[fn.column])
                cols.append(self._frame_agg(fn, col, lo, pos, new_part))
        return pa.Table.from_arrays(cols, schema=self.output_schema)

    @staticmethod
    def _order_rank(col, o: OrderKey) -> np.ndarray:
        """An int64 per row whose order is Spark's order of the column under ``o``."""
        arr = as_array(col)
        r = _value_rank(arr)
        if o.descending:
            r = -r
        if arr.null_count:
            valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
            r = np.where(valid, r, (r.min() - 1) if o.nulls_go_first else (r.max() + 1))
        return r

    def _frame_agg(self, fn: WindowFn, col: pa.Array | None, lo: np.ndarray, hi: np.ndarray,
                   new_part: np.ndarray) -> pa.Array:
        """count/sum/avg/min/max over the rows lo..hi (inclusive) of the sorted rows."""
        n = len(hi)
        valid = (np.ones(n, bool) if col is None or col.null_count == 0 else
                 np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool))
        count = _frame_sum(valid.astype(np.int64), lo, hi)
        if fn.func == "count":
            return pa.array(count, pa.int64())
        empty = count == 0
        if fn.func in ("min", "max"):
            return _frame_extreme(col, valid, lo, hi, fn.func, empty)
        if fn.func == "sum" and pa.types.is_integer(col.type):
            v = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64)
            limbs = [_frame_sum(part, lo, hi) for part in (v & _M24, (v >> 24) & _M24, v >> 48)]
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
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN as Spark's doubles
            total = _fold(v, lo, hi, new_part, fn.preceding)
        if fn.func == "avg":
            with np.errstate(divide="ignore", invalid="ignore"):
                total = total / np.maximum(count, 1).astype(np.float64)
        return pa.array(total, pa.float64(), mask=empty)


def _dense(arr: pa.Array) -> np.ndarray:
    """Dense ranks (0-based) of a sortable array (strings and binaries bytewise, as Spark
    compares them), NULL first."""
    r = pc.rank(arr, sort_keys="ascending", tiebreaker="dense", null_placement="at_start")
    return np.asarray(r.to_numpy(), np.int64) - 1


def _value_rank(arr: pa.Array) -> np.ndarray:
    """Dense ranks in Spark's value order (NULLs rank lowest; the callers mask them): floats
    with -0.0 = 0.0 and every NaN equal and above all numbers."""
    if not pa.types.is_floating(arr.type):
        return _dense(arr)
    v = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.float64)
    nan = np.isnan(v)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
    r = _dense(pa.array(v + 0.0, mask=~valid | nan))  # + 0.0: -0.0 -> 0.0
    return np.where(nan & valid, r.max(initial=0) + 1, r)


def _frame_sum(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Exact int64 sums of v[lo..hi] (prefix sums; each value small enough not to wrap)."""
    c = np.zeros(len(v) + 1, np.int64)
    np.cumsum(v, out=c[1:])
    return c[hi + 1] - c[lo]


def _fold(v: np.ndarray, lo: np.ndarray, hi: np.ndarray, new_part: np.ndarray,
          preceding: int | None) -> np.ndarray:
    """Spark's double sum of each frame: ``((0.0 + v[lo]) + v[lo+1]) + ... + v[hi]`` in frame
    order (NULLs given as 0.0, which cannot change a sum that starts at 0.0), so rounding
    matches Spark's bit for bit. A bounded frame: n+1 vector steps; an unbounded one: a
    running sum per partition (np.add.accumulate is a sequential fold), partitions padded
    into rows of a matrix by length class so padding costs at most 2x."""
    n = len(v)
    if preceding is not None:
        acc = np.zeros(n, np.float64)
        for k in range(min(preceding, int((hi - lo).max(initial=0))) + 1):
            j = lo + k
            inside = j <= hi
            acc = np.where(inside, acc + v[np.minimum(j, hi)], acc)
        return acc
    starts = np.flatnonzero(new_part)
    lengths = np.diff(np.r_[starts, n])
    out = np.empty(n, np.float64)
    width = np.maximum(1, 1 << np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64))
    for cls in np.unique(width):
        sel = np.flatnonzero(width == cls)
        m = np.zeros((len(sel), int(cls)), np.float64)
        rows = np.repeat(np.arange(len(sel)), lengths[sel])
        within = np.arange(len(rows)) - np.repeat(np.cumsum(lengths[sel]) - lengths[sel],
                                                  lengths[sel])
        src = starts[sel][rows] + within
        m[rows, within] = v[src]
        out[src] = np.add.accumulate(m, axis=1)[rows, within]
    return out + 0.0  # -0.0 -> 0.0: Spark's fold starts at 0.0


def _frame_extreme(col: pa.Array, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                   func: str, empty: np.ndarray) -> pa.Array:
    """min/max of col[lo..hi], the first such row in frame order on ties (Spark's
    ``greatest(max, v)`` keeps the value it has): a sparse table of (value rank, -position)."""
    n = len(hi)
    r = _value_rank(col)
    if func == "min":
        r = r.max(initial=0) - r
    pos = np.arange(n, dtype=np.int64)
    key = np.where(valid, (r << 32) | (_LOW32 - pos), -1)
    span = int((hi - lo).max(initial=0)) + 1
    levels = [key]
    step = 1
    while 2 * step <= span:
        prev = levels[-1]
        nxt = prev.copy()
        nxt[:n - step] = np.maximum(prev[:n - step], prev[step:])
        levels.append(nxt)
        step *= 2
    length = hi - lo + 1
    k = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    best = np.empty(n, np.int64)
    for level in np.unique(k):
        sel = k == level
        table = levels[int(level)]
        best[sel] = np.maximum(table[lo[sel]], table[hi[sel] - (1 << int(level)) + 1])
    winner = np.where(empty, 0, _LOW32 - (best & _LOW32))
    out = col.take(pa.array(winner))
    return as_array(pc.if_else(pa.array(empty), pa.scalar(None, col.type), out))
