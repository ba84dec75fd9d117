"""OverKernel: RANGE frames (peers, value offsets), aggregates over the whole partition (no
orderBy), nth_value and the range bounds' edge cases (split from test_operators_over.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conformance import (  # (tests/pipeline is on sys.path)
    I64_MAX,
    INF,
    NAN,
    DictZSet,
    fixed_stream,
    out_counter,
    table,
)
from over_model import Model, OverCase
from test_operators_over import (
    O_VALUES,
    P_VALUES,
    ROLL,
    S_VALUES,
    SIMPLE,
    V_MODEL,
    _rows,
    _simple,
)

from headrace.pipeline.errors import ArithmeticOverflow
from headrace.pipeline.operators.over import OrderKey, OverKernel, WindowFn

# ---- conformance: RANGE frames over ties (peers) ---------------------------------------

PEERS = pa.schema([("p", pa.int64()), ("o", pa.int64()), ("x", pa.int64()), ("s", pa.string())])
PEER_ORDER = [OrderKey("o", descending=True)]
PEER_FUNCS = [WindowFn("sum", "x", "run", ["range", None, 0]),
              WindowFn("count", None, "n", ["range", None, 0]),
              WindowFn("avg", "x", "rest", ["range", 0, None]),
              WindowFn("min", "s", "peer_min", ["range", 0, 0]),
              WindowFn("max", "x", "all_max", ["range", None, None]),
              WindowFn("rank", None, "rk"),
              # value offsets under DESC: -1 PRECEDING reaches o + 1
              WindowFn("sum", "x", "near", ["range", -1, 0]),
              WindowFn("count", "x", "below", ["range", 1, 2]),
              WindowFn("max", "s", "upto", ["range", None, -1]),
              WindowFn("min", "x", "from", ["range", -2, None]),
              WindowFn("percent_rank", None, "pr"), WindowFn("cume_dist", None, "cd")]
_PW = "PARTITION BY p ORDER BY o DESC"
PEER_SQL = (f"SELECT *, sum(x) OVER ({_PW}) AS run, count(*) OVER ({_PW}) AS n, "
            f"avg(x) OVER ({_PW} RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS rest, "
            f"min(s) OVER ({_PW} RANGE BETWEEN CURRENT ROW AND CURRENT ROW) AS peer_min, "
            f"max(x) OVER ({_PW} RANGE BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) "
            "AS all_max, "
            f"rank() OVER ({_PW}) AS rk, "
            f"sum(x) OVER ({_PW} RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) AS near, "
            f"count(x) OVER ({_PW} RANGE BETWEEN 1 FOLLOWING AND 2 FOLLOWING) AS below, "
            f"max(s) OVER ({_PW} RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS upto, "
            f"min(x) OVER ({_PW} RANGE BETWEEN 2 PRECEDING AND UNBOUNDED FOLLOWING) AS from, "
            f"percent_rank() OVER ({_PW}) AS pr, cume_dist() OVER ({_PW}) AS cd FROM in0")


class TestOverPeers(OverCase):
    """Spark's default frame and RANGE frames: ties in ORDER BY (NULLs tie with NULLs) are in
    each other's frames. The values are integers and strings, so no result depends on the
    order among peers (which Spark leaves open)."""

    schemas = [PEERS]
    sql = PEER_SQL
    spec = (PEERS, ["p"], PEER_ORDER, PEER_FUNCS)
    test_matches_spark = None  # the awkward stream is this class's one Spark check (budget)

    def value_lists(self, input_index, spark):
        return [[1, 2, None], [0, 1, 1, None], [5, -3, None, 7], ["a", "b", None]]

    def test_bulk_matches_model(self):  # smaller: the model scans the partition per row
        self.check_stream(self.bulk_stream(seed=14, rows=150, ops=700))

    def awkward_stream(self):
        pool = [[(1, 1, 5, "b"), (1, 1, -3, "a"), (1, None, 7, None), (1, 0, None, "c"),
                 (1, None, 2, "d"), (2, 1, I64_MAX, "x"), (2, 1, 1, "y")]]
        return fixed_stream(pool, [
            [[(0, 1), (1, 1), (2, 1)]],  # two peers at o = 1, NULL last (DESC)
            [[(3, 1), (4, 2)]],  # NULL order keys are peers of each other
            [[(1, -1), (4, -1)]],  # a retracted peer changes every peer's running total
            [[(5, 1), (6, 1)]],  # I64_MAX + 1 among peers: the running sum overflows
        ], restarts=[False, True, False, False])


# ---- conformance: RANGE frames with value offsets over a double ----------------------

VRANGE = pa.schema([("p", pa.int64()), ("t", pa.float64()), ("x", pa.int64())])
VRANGE_ORDER = [OrderKey("t")]
VRANGE_FUNCS = [WindowFn("sum", "x", "near", ["range", -1.5, 0.5]),
                WindowFn("count", None, "before", ["range", None, -1]),
                WindowFn("max", "x", "after", ["range", 1, None]),
                WindowFn("min", "x", "ahead", ["range", 0.5, 2]),
                WindowFn("count", "x", "all", ["range", None, None]),
                # double folds over value frames (peers hold equal values: order-free)
                WindowFn("avg", "t", "mean", ["range", -1.5, 0.5]),
                WindowFn("sum", "t", "upto", ["range", None, 1])]
_VW = "PARTITION BY p ORDER BY t"
VRANGE_SQL = (f"SELECT *, sum(x) OVER ({_VW} RANGE BETWEEN 1.5 PRECEDING AND 0.5 FOLLOWING) "
              "AS near, "
              f"count(*) OVER ({_VW} RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) "
              "AS before, "
              f"max(x) OVER ({_VW} RANGE BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) "
              "AS after, "
              f"min(x) OVER ({_VW} RANGE BETWEEN 0.5 FOLLOWING AND 2 FOLLOWING) AS ahead, "
              f"count(x) OVER ({_VW} RANGE BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED "
              "FOLLOWING) AS all, "
              f"avg(t) OVER ({_VW} RANGE BETWEEN 1.5 PRECEDING AND 0.5 FOLLOWING) AS mean, "
              f"sum(t) OVER ({_VW} RANGE BETWEEN UNBOUNDED PRECEDING AND 1 FOLLOWING) AS upto "
              "FROM in0")


class TestOverValueRange(OverCase):
    """RANGE BETWEEN a AND b with value offsets over one ascending double order column: the
    frame is the rows whose t lies in [t + a, t + b]; NULL t (first) reaches only the NULLs on
    a bounded side, -0.0 = 0.0, NaN above +inf (NaN + a is NaN: its peers), inf + a = inf.
    Integer results, so the order among peers plays no part."""

    schemas = [VRANGE]
    sql = VRANGE_SQL
    spec = (VRANGE, ["p"], VRANGE_ORDER, VRANGE_FUNCS)
    test_matches_spark = None  # the awkward stream is this class's one Spark check (budget)

    def value_lists(self, input_index, spark):
        return [[1, 2, None], [0.0, -0.0, 1.0, 1.5, 2.5, NAN, INF, -INF, None, 1e308],
                [5, -3, None, 7]]

    def test_bulk_matches_model(self):  # smaller: the model scans the partition per row
        self.check_stream(self.bulk_stream(seed=14, rows=150, ops=700))

    def awkward_stream(self):
        pool = [[(1, 0.0, 1), (1, -0.0, 2), (1, 1.5, 4), (1, 2.0, 8), (1, NAN, 16),
                 (1, INF, 32), (1, None, 64), (1, -INF, 128), (1, 1e308, None),
                 (2, 3.0, 256), (None, 0.5, 512)]]
        return fixed_stream(pool, [
            [[(0, 1), (1, 1), (2, 1), (3, 1)]],  # 0.0 and -0.0 are one value
            [[(4, 1), (5, 1), (6, 2), (7, 1), (8, 1)]],  # NaN, inf, NULL, 1e308 + 2 = 1e308
            [[(2, -1), (9, 1), (10, 1)]],  # a retraction in the middle moves the frames
            [[(0, -1), (4, -1), (6, -1)]],
        ], restarts=[False, True, False, True])


# ---- conformance: an aggregate over the whole partition (no orderBy) ------------------

WHOLE_FUNCS = [WindowFn("sum", "o", "total", ["rows", None, None]),
               WindowFn("count", None, "n", ["rows", None, None]),
               WindowFn("max", "s", "top", ["range", None, None]),
               WindowFn("avg", "v", "mean", ["rows", None, None])]


class TestOverWholePartition(OverCase):
    """``F.sum("o").over(Window.partitionBy("p"))``: Spark's frame is every row of the
    partition (ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING); checked against
    Spark through the pipeline test below."""

    schemas = [ROLL]
    sql = ""
    spec = (ROLL, ["p"], [], WHOLE_FUNCS)
    test_matches_spark = test_awkward_values_spark = None

    def value_lists(self, input_index, spark):
        return [P_VALUES, O_VALUES, S_VALUES, V_MODEL]

    def awkward_stream(self):
        pool = [[(1, 0, "a", 1e308), (1, 1, "a", 1e308), (1, 2, None, NAN), (None, 3, "b", -0.0),
                 (None, I64_MAX, "c", 1.0), (None, 1, None, None), (2, None, None, None)]]
        return fixed_stream(pool, [
            [[(0, 1), (1, 1), (6, 1)]],  # 1e308 + 1e308 = inf; a partition of NULLs only
            [[(3, 1), (4, 1), (2, 1)]],
            [[(0, -1), (2, -1)]],  # every row of the partition changes
            [[(5, 1)]],  # I64_MAX + 3 + 1: the sum overflows (Spark raises too)
        ], restarts=[False, True, False, False])


# ---- edge cases ------------------------------------------------------------------------

def test_a_range_bound_past_the_long_range_raises_and_leaves_state_untouched():
    """t + 5 for t near I64_MAX leaves bigint: Spark's ANSI addExact raises on that bound."""
    k = _simple([WindowFn("sum", "x", "s", ["range", -5, 5])])
    state = DictZSet()
    out = k.apply([table([("a", I64_MAX - 10, 1), ("b", 1, 2)], [1, 1], SIMPLE)], [state])
    assert _rows(out) == {("a", I64_MAX - 10, 1, 1): 1, ("b", 1, 2, 2): 1}
    before = state.snapshot()
    with pytest.raises(ArithmeticOverflow, match="order column 't'"):
        k.apply([table([("a", I64_MAX - 2, 4)], [1], SIMPLE)], [state])
    assert state.snapshot() == before
    # an int column adds in int, as Spark's: 2^31 - 3 + 5 overflows although a long would not
    small = pa.schema([("k", pa.string()), ("t", pa.int32()), ("x", pa.int64())])
    k = OverKernel(small, ["k"], [OrderKey("t", descending=True)],
                   [WindowFn("sum", "x", "s", ["range", -5, 0])])  # DESC: t .. t + 5
    state = DictZSet()
    out = k.apply([table([("a", 2**31 - 9, 1), ("a", 2**31 - 6, 2)], [1, 1], small)], [state])
    assert _rows(out) == {("a", 2**31 - 9, 1, 3): 1, ("a", 2**31 - 6, 2, 2): 1}
    with pytest.raises(ArithmeticOverflow, match="int32"):
        k.apply([table([("a", 2**31 - 3, 4)], [1], small)], [state])


def test_nth_value_is_null_until_the_frame_holds_n_rows():
    k = _simple([WindowFn("nth_value", "x", "second", [["rows", None, 0], 2, False]),
                 WindowFn("nth_value", "x", "second_set", [["rows", None, 0], 2, True]),
                 WindowFn("last", "x", "last_set", [["rows", None, 0], 1, True])])
    state = DictZSet()
    out = k.apply([table([("a", 1, None), ("a", 2, 20), ("a", 3, 30)], [1, 1, 1], SIMPLE)],
                  [state])
    assert _rows(out) == {("a", 1, None, None, None, None): 1, ("a", 2, 20, 20, None, 20): 1,
                          ("a", 3, 30, 20, 30, 30): 1}
    out = k.apply([table([("a", 2, 20)], [-1], SIMPLE)], [state])  # the 2nd row leaves
    assert _rows(out) == {("a", 2, 20, 20, None, 20): -1,
                          ("a", 3, 30, 20, 30, 30): -1, ("a", 3, 30, 30, None, 30): 1}


def test_range_offsets_over_timestamps_and_dates():
    """A timestamp order column takes its offset in microseconds (Spark's day-time
    interval), a date in days; DESC flips the direction, as Spark's."""
    import datetime as dt

    schema = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")),
                        ("d", pa.date32()), ("x", pa.int64())])
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [(1, base + dt.timedelta(seconds=s), (base + dt.timedelta(days=s)).date(), 2**i)
            for i, s in enumerate([0, 5, 10, 11, 30])]
    ten_s = 10 * 10**6
    for order, funcs in [
            ([OrderKey("ts")], [WindowFn("sum", "x", "w", ["range", -ten_s, 0])]),
            ([OrderKey("d", descending=True)], [WindowFn("sum", "x", "w", ["range", 0, 10])])]:
        k = OverKernel(schema, ["k"], order, funcs)
        out = k.apply([table(rows, [1] * 5, schema)], [DictZSet()])
        got = {r[3]: r[4] for r in _rows(out)}
        # the last 10 s / the 10 days before (DESC: following = smaller)
        assert got == {1: 1, 2: 3, 4: 7, 8: 14, 16: 16}
        assert Model(schema, ["k"], order, funcs).rows(rows) == out_counter(out)
