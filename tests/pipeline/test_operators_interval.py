"""IntervalJoinKernel against Spark SQL: every join type (inner, left, right, full outer, left
semi, left anti) of ``ON l.k = r.k AND r.rt BETWEEN l.lt + lower AND l.lt + upper``, through the
conformance class (random weighted inserts and retractions in random batches, restarts) and a
fixed stream through the awkward cases: padding retracted at the first match and restored when
the last match leaves, NULL keys and NULL times that never match, both bounds inclusive."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pyarrow as pa
import pytest
from conformance import (  # noqa: I001  (tests/pipeline is on sys.path)
    NAN,
    NEG_NAN,
    KernelConformance,
    canon_row,
    fixed_stream,
)
from test_operators_join import SQL_HOW, key_of

from headrace.pipeline.operators.interval import IntervalJoinKernel

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000_000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LEFT = pa.schema([("k", pa.float64()), ("lt", TS), ("a", pa.int64())])
RIGHT = pa.schema([("k", pa.float64()), ("rt", TS), ("b", pa.string())])
K_VALUES = [0.0, -0.0, NAN, NEG_NAN, None, 1.0]
T_VALUES = [-3 * SEC, 0, SEC, 3 * SEC, 4 * SEC, 4 * SEC + 1, None]
A_VALUES = [1, 2, None]
B_VALUES = ["x", "\x00", None]


def _ts(us):
    return None if us is None else EPOCH + dt.timedelta(microseconds=us)


def _utc(v):
    """Spark's collect gives naive local datetimes: the same instants, aware, in UTC."""
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return v.astimezone(dt.UTC)
    return v


def _distinct(rows: list[tuple]) -> list[tuple[tuple, int]]:
    """(row, multiplicity) of each distinct row (by value: -0.0 and 0.0 apart)."""
    seen: dict = {}
    for r in rows:
        c = canon_row(r)
        seen[c] = (r, seen[c][1] + 1 if c in seen else 1)
    return list(seen.values())


class IntervalJoin(KernelConformance):
    """``JOIN ... ON l.k = r.k AND r.rt BETWEEN ...`` with the kernel's ``on=["k"]`` layout:
    the key (the right's for a right join, either for a full one), the other left columns,
    then the other right columns (none for semi/anti)."""

    schemas = [LEFT, RIGHT]
    how = "inner"
    lower, upper = -2 * SEC, 3 * SEC
    max_examples = 40
    spark_examples = 1

    @property
    def sql(self):
        key = {"right": "r.k", "full": "coalesce(l.k, r.k)"}.get(self.how, "l.k")
        cols = "" if self.how in ("left_semi", "left_anti") else ", r.rt, r.b"
        return (f"SELECT {key} AS k, l.lt, l.a{cols} FROM in0 l {SQL_HOW[self.how]} JOIN in1 r "
                f"ON l.k = r.k AND r.rt BETWEEN l.lt + INTERVAL '{self.lower}' MICROSECOND "
                f"AND l.lt + INTERVAL '{self.upper}' MICROSECOND")

    def make_kernel(self):
        return IntervalJoinKernel(LEFT, RIGHT, self.how, on=["k"], interval={
            "left": "lt", "right": "rt", "lower_us": self.lower, "upper_us": self.upper})

    def matches(self, lrow, rrow) -> bool:
        lk = key_of(lrow, [0])
        return (lk is not None and lk == key_of(rrow, [0]) and lrow[1] is not None
                and rrow[1] is not None and lrow[1] + self.lower <= rrow[1] <= lrow[1] + self.upper)

    def layout(self, lrow, rrow):
        keysrc = rrow if self.how == "right" or lrow is None else lrow
        row = (keysrc[0], _ts(lrow[1]) if lrow else None, lrow[2] if lrow else None)
        if self.how in ("left_semi", "left_anti"):
            return row
        return row + ((_ts(rrow[1]), rrow[2]) if rrow else (None, None))

    def model(self, net) -> Counter:
        left, right = (_distinct(rows) for rows in net)
        by_key: dict = {}
        for j, (rrow, _) in enumerate(right):
            by_key.setdefault(key_of(rrow, [0]), []).append(j)
        out: Counter = Counter()
        lmatched, rmatched = [0] * len(left), [0] * len(right)
        for i, (lrow, ln) in enumerate(left):
            for j in by_key.get(key_of(lrow, [0]), []) if key_of(lrow, [0]) else []:
                rrow, rn = right[j]
                if self.matches(lrow, rrow):
                    lmatched[i] += rn
                    rmatched[j] += ln
                    if self.how not in ("left_semi", "left_anti"):
                        out[canon_row(self.layout(lrow, rrow))] += ln * rn
        for i, (lrow, ln) in enumerate(left):
            if (self.how in ("left", "full", "left_anti") and not lmatched[i]) or (
                    self.how == "left_semi" and lmatched[i]):
                out[canon_row(self.layout(lrow, None))] += ln
        if self.how in ("right", "full"):
            for j, (rrow, rn) in enumerate(right):
                if not rmatched[j]:
                    out[canon_row(self.layout(None, rrow))] += rn
        return out

    def value_lists(self, input_index, spark):
        return [K_VALUES, T_VALUES, A_VALUES if input_index == 0 else B_VALUES]

    def run_spark(self, spark, net):
        got = super().run_spark(spark, net)
        if got == "overflow":
            return got
        names, rows = got
        return names, Counter({tuple(_utc(v) for v in row): n for row, n in rows.items()})

    def awkward_stream(self):
        left = [(0.0, 0, 1),            # 0: partners at rt in [-2 s, 3 s]
                (-0.0, 3 * SEC, 2),     # 1: -0.0 = 0.0; partners in [1 s, 6 s]
                (None, 0, 1),           # 2: NULL key: never matches
                (0.0, None, 2),         # 3: NULL time: never matches
                (NAN, -3 * SEC, None),  # 4: partners in [-5 s, 0]
                (1.0, 0, 1)]            # 5
        right = [(0.0, 3 * SEC, "x"),       # 0: upper bound of left 0 exactly, in left 1's
                 (0.0, 3 * SEC + 1, "\x00"),  # 1: one µs past left 0's, in left 1's
                 (None, 0, None),           # 2: NULL key
                 (0.0, None, "x"),          # 3: NULL time
                 (NEG_NAN, -5 * SEC, "x"),  # 4: NaN = NaN, lower bound of left 4 exactly
                 (1.0, -2 * SEC - 1, None)]   # 5: one µs before left 5's lower bound
        return fixed_stream([left, right], [
            [[(0, 1), (2, 1), (3, 1), (5, 1)], [(2, 1), (3, 1), (5, 1)]],  # alone: padded
            [[], [(0, 2)]],  # first match of left 0: its padding goes
            [[(1, 1), (4, 2)], [(1, 1), (4, 1)]],  # both sides in one batch
            [[], []],  # an empty batch
            [[], [(0, -1)]],  # one of two matches leaves: nothing changes for left 0's padding
            [[(4, -1)], [(0, -1), (4, -1)]],  # the last match leaves: padding comes back
            [[(0, -1), (2, -1), (1, 1), (1, -1)], [(1, -1), (2, -1)]],
        ], restarts=[False, True, False, False, True, False, False])


class RandomAgainstSpark:
    """A random stream big enough that every kind of row meets every other (30 rows a side,
    120 changes, 3 batches), against Spark itself rather than the model."""

    @pytest.mark.spark
    def test_random_stream_spark(self, spark):
        self.check_stream(self.bulk_stream(seed=21, rows=30, ops=120, batches=3), spark)


class TestInner(IntervalJoin):
    how = "inner"


class TestLeftOuter(IntervalJoin):
    how = "left"


class TestRightOuter(IntervalJoin):
    how = "right"


class TestFullOuter(RandomAgainstSpark, IntervalJoin):
    how = "full"


class TestLeftSemi(RandomAgainstSpark, IntervalJoin):
    how = "left_semi"


class TestLeftAnti(IntervalJoin):
    how = "left_anti"


class TestFullOuterBeforeOnly(RandomAgainstSpark, IntervalJoin):
    """Bounds both below zero (rt in [lt - 4 s, lt - 1 s]): a row's partner slots are not
    its own."""

    how = "full"
    lower, upper = -4 * SEC, -SEC


class TestLeftOuterPointInTime(IntervalJoin):
    """lower = upper (rt = lt exactly): 1 µs slots."""

    how = "left"
    lower = upper = 0


def test_left_outer_padding_leaves_at_the_first_match_and_returns_after_the_last():
    """By hand: a click-like left row alone is padded; a right row inside [lt - 2 s, lt + 3 s]
    replaces the padding with the pair; one outside the bound changes nothing; retracting the
    match brings the padding back."""
    from conformance import DictZSet, out_counter, table

    k = IntervalJoinKernel(LEFT, RIGHT, "left", on=["k"], interval={
        "left": "lt", "right": "rt", "lower_us": -2 * SEC, "upper_us": 3 * SEC})
    states = [DictZSet() for _ in range(k.state_sides)]

    def batch(left=(), right=()):
        out = k.apply([table([r for r, _ in left], [w for _, w in left], LEFT),
                       table([r for r, _ in right], [w for _, w in right], RIGHT)], states)
        return dict(out_counter(out))

    padded = canon_row((1.0, _ts(0), 7, None, None))
    pair = canon_row((1.0, _ts(0), 7, _ts(SEC), "x"))
    assert batch(left=[((1.0, 0, 7), 1)]) == {padded: 1}
    assert batch(right=[((1.0, SEC, "x"), 1)]) == {padded: -1, pair: 1}
    assert batch(right=[((1.0, 10 * SEC, "y"), 1)]) == {}  # 10 s after: outside the bound
    assert batch(right=[((1.0, SEC, "x"), -1)]) == {pair: -1, padded: 1}
