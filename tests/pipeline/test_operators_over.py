"""OverKernel (window functions over partitions) against Spark SQL (conformance) and its own
edge cases."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from conformance import (  # (tests/pipeline is on sys.path)
    I64_MAX,
    INF,
    NAN,
    DictZSet,
    canon,
    fixed_stream,
    out_counter,
    table,
)
from over_model import Model, OverCase

from headrace.errors import InvalidInput
from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.errors import ArithmeticOverflow
from headrace.pipeline.operators import build
from headrace.pipeline.operators.over import OrderKey, OverKernel, WindowFn

# ---- conformance: row_number and rolling aggregates over a total order ------------------

ROLL = pa.schema([("p", pa.int64()), ("o", pa.int64()), ("s", pa.string()),
                  ("v", pa.float64())])
ROLL_ORDER = [OrderKey("o"), OrderKey("s", descending=True), OrderKey("v")]
ROLL_FUNCS = [WindowFn("row_number", None, "rn"), WindowFn("sum", "o", "so", 2),
              WindowFn("avg", "v", "av", 1), WindowFn("min", "v", "mn", 2),
              WindowFn("max", "s", "mx"), WindowFn("sum", "v", "sv"),
              WindowFn("count", "v", "cv", 1), WindowFn("count", None, "n", 3),
              # frames ending after the current row, Spark's default (RANGE) frame, lag/lead
              WindowFn("sum", "o", "sf", ["rows", -1, 2]),
              WindowFn("max", "v", "mf", ["rows", 1, None]),
              WindowFn("sum", "v", "sb", ["rows", -2, -1]),
              WindowFn("min", "s", "mu", ["rows", None, None]),
              WindowFn("avg", "v", "ad", ["range", None, 0]),
              WindowFn("count", None, "nf", ["range", 0, None]),
              WindowFn("lag", "s", "lg", [2, "zz"]), WindowFn("lead", "v", "ld", [1, None]),
              # first / last / nth_value (IGNORE NULLS both ways) and the distribution functions
              WindowFn("first", "v", "fv", [["range", None, 0], 1, False]),
              WindowFn("first", "s", "fs", [["rows", -1, 1], 1, True]),
              WindowFn("last", "v", "lv", [["rows", None, None], 1, True]),
              WindowFn("last", "s", "ls", [["rows", -2, -1], 1, False]),
              WindowFn("nth_value", "v", "n2", [["range", None, 0], 2, False]),
              WindowFn("nth_value", "s", "n3", [["rows", -1, None], 3, True]),
              WindowFn("ntile", None, "nt", 3), WindowFn("percent_rank", None, "pr"),
              WindowFn("cume_dist", None, "cd")]
_W = "PARTITION BY p ORDER BY o, s DESC, v"
ROLL_SQL = (f"SELECT *, row_number() OVER ({_W}) AS rn, "
            f"sum(o) OVER ({_W} ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS so, "
            f"avg(v) OVER ({_W} ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS av, "
            f"min(v) OVER ({_W} ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS mn, "
            f"max(s) OVER ({_W} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS mx, "
            f"sum(v) OVER ({_W} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS sv, "
            f"count(v) OVER ({_W} ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS cv, "
            f"count(*) OVER ({_W} ROWS BETWEEN 3 PRECEDING AND CURRENT ROW) AS n, "
            f"sum(o) OVER ({_W} ROWS BETWEEN 1 PRECEDING AND 2 FOLLOWING) AS sf, "
            f"max(v) OVER ({_W} ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS mf, "
            f"sum(v) OVER ({_W} ROWS BETWEEN 2 PRECEDING AND 1 PRECEDING) AS sb, "
            f"min(s) OVER ({_W} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) "
            "AS mu, "
            f"avg(v) OVER ({_W}) AS ad, "
            f"count(*) OVER ({_W} RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS nf, "
            f"lag(s, 2, 'zz') OVER ({_W}) AS lg, lead(v) OVER ({_W}) AS ld, "
            f"first(v) OVER ({_W}) AS fv, "
            f"first(s, true) OVER ({_W} ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS fs, "
            f"last(v) IGNORE NULLS OVER ({_W} ROWS BETWEEN UNBOUNDED PRECEDING AND "
            "UNBOUNDED FOLLOWING) AS lv, "
            f"last(s) OVER ({_W} ROWS BETWEEN 2 PRECEDING AND 1 PRECEDING) AS ls, "
            f"nth_value(v, 2) OVER ({_W}) AS n2, "
            f"nth_value(s, 3) IGNORE NULLS OVER ({_W} ROWS BETWEEN 1 PRECEDING AND "
            "UNBOUNDED FOLLOWING) AS n3, "
            f"ntile(3) OVER ({_W}) AS nt, percent_rank() OVER ({_W}) AS pr, "
            f"cume_dist() OVER ({_W}) AS cd FROM in0")
P_VALUES = [1, 2, None]
O_VALUES = [0, 1, 2, -3, None]
S_VALUES = ["a", "b", "", None, "\x00"]
V_MODEL = [1.5, -0.0, 0.0, NAN, INF, -INF, None, 1e308, 0.1, 1e-300]
# no -0.0 beside 0.0: Spark orders them as peers, so two such rows would tie
V_SPARK = [1.5, 0.0, NAN, INF, -INF, None, 1e308, 0.1, -2.0]


class TestOverRolling(OverCase):
    schemas = [ROLL]
    sql = ROLL_SQL
    spec = (ROLL, ["p"], ROLL_ORDER, ROLL_FUNCS)

    def value_lists(self, input_index, spark):
        return [P_VALUES, O_VALUES, S_VALUES, V_SPARK if spark else V_MODEL]

    def awkward_stream(self):
        pool = [[(1, 0, "a", 1e308), (1, 1, "a", 1e308), (1, 2, "a", -0.0),
                 (1, 3, None, NAN), (None, 0, "\x00", INF), (None, 1, "\x00", -INF),
                 (None, None, None, None), (2, I64_MAX, "z", 0.1),
                 (2, -5, "é", 0.2), (1, 1, "b", 0.1), (2, 7, "q", 1.0)]]
        return fixed_stream(pool, [
            [[(0, 1), (1, 1), (2, 1), (3, 1)]],  # 1e308 + 1e308 = inf in the rolling avg
            [[(9, 1), (4, 1), (5, 1), (6, 2)]],  # a row in the middle shifts the rest
            [[]],
            [[(1, -1), (7, 1), (8, 1)]],  # its retraction shifts them back
            [[(3, -1), (0, -1), (6, -1)]],
            [[(10, 1)]],  # -5 + 7 + I64_MAX: the long sum overflows (Spark raises too)
        ], restarts=[False, True, False, True, False, False])


# ---- conformance: rank and dense_rank over ties ----------------------------------------

RANKS = pa.schema([("d", pa.float64()), ("o", pa.int64()), ("s", pa.string())])
RANK_ORDER = [OrderKey("o", descending=True, nulls_first=True), OrderKey("s", nulls_first=False)]
RANK_FUNCS = [WindowFn("rank", None, "rk"), WindowFn("dense_rank", None, "dr")]
_RW = "PARTITION BY d ORDER BY o DESC NULLS FIRST, s ASC NULLS LAST"
RANK_SQL = f"SELECT *, rank() OVER ({_RW}) AS rk, dense_rank() OVER ({_RW}) AS dr FROM in0"


class TestOverRanks(OverCase):
    """Ties are exact for rank/dense_rank; NULL, -0.0/0.0 and NaN partition keys."""

    schemas = [RANKS]
    sql = RANK_SQL
    spec = (RANKS, ["d"], RANK_ORDER, RANK_FUNCS)

    def value_lists(self, input_index, spark):
        return [[0.0, -0.0, NAN, None, 1.5], [1, 2, None, 2], ["a", None, "b"]]

    def awkward_stream(self):
        pool = [[(0.0, 1, "a"), (-0.0, 1, "a"), (NAN, None, None), (-NAN, 2, "a"),
                 (None, 2, None), (None, 2, "b"), (None, None, "a")]]
        return fixed_stream(pool, [
            [[(0, 1), (1, 1), (2, 1), (3, 1)]],  # 0.0/-0.0 one partition, the NaNs one
            [[(4, 1), (5, 2), (6, 1)]],  # NULL partition keys form one partition
            [[(0, -1), (6, -1)]],
            [[]],
        ], restarts=[False, True, False, False])


# ---- edge cases ------------------------------------------------------------------------

SIMPLE = pa.schema([("k", pa.string()), ("t", pa.int64()), ("x", pa.int64())])


def _simple(funcs, order=(OrderKey("t"),)):
    return OverKernel(SIMPLE, ["k"], list(order), funcs)


def _rows(out) -> dict:
    return dict(out_counter(out))


def test_a_retraction_in_the_middle_shifts_the_rows_after_it():
    k = _simple([WindowFn("row_number", None, "rn"), WindowFn("sum", "x", "s2", 1)])
    state = DictZSet()
    rows = [("a", t, 10 * t) for t in (1, 2, 3, 4)]
    k.apply([table(rows, [1] * 4, SIMPLE)], [state])
    out = k.apply([table([("a", 2, 20)], [-1], SIMPLE)], [state])
    assert _rows(out) == {
        ("a", 2, 20, 2, 30): -1,
        ("a", 3, 30, 3, 50): -1, ("a", 3, 30, 2, 40): 1,
        ("a", 4, 40, 4, 70): -1, ("a", 4, 40, 3, 70): 1}
    assert ("a", 1, 10, 1, 10) not in _rows(out)  # the row before it is untouched


def test_the_default_frame_includes_the_current_rows_peers():
    """Spark's frame for ``orderBy`` without ``rowsBetween``: RANGE BETWEEN UNBOUNDED
    PRECEDING AND CURRENT ROW, so rows tied on t share one running total."""
    k = _simple([WindowFn("sum", "x", "run", ["range", None, 0])])
    state = DictZSet()
    rows = [("a", 1, 10), ("a", 2, 20), ("a", 2, 30), ("a", 3, 40)]
    out = k.apply([table(rows, [1] * 4, SIMPLE)], [state])
    assert _rows(out) == {("a", 1, 10, 10): 1, ("a", 2, 20, 60): 1, ("a", 2, 30, 60): 1,
                          ("a", 3, 40, 100): 1}
    out = k.apply([table([("a", 2, 30)], [-1], SIMPLE)], [state])
    assert _rows(out) == {("a", 2, 30, 60): -1, ("a", 2, 20, 60): -1, ("a", 2, 20, 30): 1,
                          ("a", 3, 40, 100): -1, ("a", 3, 40, 70): 1}


def test_a_retraction_changes_the_frames_that_end_after_it():
    """Frames reaching past the current row: retracting t=3 changes the rows before it."""
    k = _simple([WindowFn("sum", "x", "s_next", ["rows", 0, 1]),
                 WindowFn("count", None, "after", ["rows", 1, None])])
    state = DictZSet()
    out = k.apply([table([("a", t, 10 * t) for t in (1, 2, 3, 4)], [1] * 4, SIMPLE)], [state])
    assert _rows(out) == {("a", 1, 10, 30, 3): 1, ("a", 2, 20, 50, 2): 1,
                          ("a", 3, 30, 70, 1): 1, ("a", 4, 40, 40, 0): 1}
    out = k.apply([table([("a", 3, 30)], [-1], SIMPLE)], [state])
    assert _rows(out) == {("a", 1, 10, 30, 3): -1, ("a", 1, 10, 30, 2): 1,
                          ("a", 2, 20, 50, 2): -1, ("a", 2, 20, 60, 1): 1,
                          ("a", 3, 30, 70, 1): -1}


def test_lag_and_lead_take_the_value_n_rows_away_or_the_default():
    """A NULL n rows away is NULL (not the default); the default only past the partition."""
    k = _simple([WindowFn("lag", "x", "prev", [1, -1]), WindowFn("lead", "x", "next2", [2, None])])
    state = DictZSet()
    rows = [("a", 1, 10), ("a", 2, None), ("a", 3, 30), ("b", 1, 5)]
    out = k.apply([table(rows, [1] * 4, SIMPLE)], [state])
    assert _rows(out) == {("a", 1, 10, -1, 30): 1, ("a", 2, None, 10, None): 1,
                          ("a", 3, 30, None, None): 1, ("b", 1, 5, -1, None): 1}
    out = k.apply([table([("a", 0, 7)], [1], SIMPLE)], [state])
    assert _rows(out) == {("a", 0, 7, -1, None): 1,
                          ("a", 1, 10, -1, 30): -1, ("a", 1, 10, 7, 30): 1}


def test_only_the_touched_partitions_are_read():
    k = _simple([WindowFn("row_number", None, "rn")])
    state = DictZSet()
    k.apply([table([("a", 1, 0), ("b", 1, 0), ("c", 1, 0)], [1, 1, 1], SIMPLE)], [state])
    state.looked_up.clear()
    out = k.apply([table([("b", 0, 0)], [1], SIMPLE)], [state])
    assert state.looked_up == [keys.RowCodec(SIMPLE, ["k"], normalize=True).encode(
        table([("b", 0, 0)], None, SIMPLE))[0].as_py()]
    assert _rows(out) == {("b", 0, 0, 1): 1, ("b", 1, 0, 1): -1, ("b", 1, 0, 2): 1}


def test_copies_of_a_row_take_consecutive_positions():
    k = _simple([WindowFn("row_number", None, "rn"), WindowFn("rank", None, "rk")])
    state = DictZSet()
    out = k.apply([table([("a", 1, 5)], [3], SIMPLE)], [state])
    assert _rows(out) == {("a", 1, 5, 1, 1): 1, ("a", 1, 5, 2, 1): 1, ("a", 1, 5, 3, 1): 1}
    out = k.apply([table([("a", 1, 5)], [-1], SIMPLE)], [state])
    assert _rows(out) == {("a", 1, 5, 3, 1): -1}


def test_long_sum_overflow_raises_and_leaves_state_untouched():
    k = _simple([WindowFn("sum", "x", "s", 1)])
    state = DictZSet()
    k.apply([table([("a", 1, I64_MAX), ("a", 3, -3)], [1, 1], SIMPLE)], [state])
    before = state.snapshot()
    with pytest.raises(ArithmeticOverflow, match="sum\\(x\\)"):
        k.apply([table([("a", 2, 1)], [1], SIMPLE)], [state])  # frame {I64_MAX, 1}
    assert state.snapshot() == before
    # the same rows in frames that fit: no error (exact sums, no wrapped intermediates)
    out = k.apply([table([("a", 2, -5)], [1], SIMPLE)], [state])
    assert _rows(out)[("a", 2, -5, I64_MAX - 5)] == 1


def test_a_frame_with_only_nulls_averages_to_null():
    k = OverKernel(ROLL, ["p"], [OrderKey("o")], [WindowFn("avg", "v", "a", 0),
                                                  WindowFn("min", "v", "m", 0)])
    out = k.apply([table([(1, 1, "x", None), (1, 2, "x", 2.0)], [1, 1], ROLL)], [DictZSet()])
    assert _rows(out) == {(1, 1, "x", None, None, None): 1,
                          (1, 2, "x", canon(2.0), canon(2.0), canon(2.0)): 1}


def test_an_empty_or_weight_zero_delta_emits_nothing_and_reads_nothing():
    k = _simple([WindowFn("row_number", None, "rn")])
    state = DictZSet()
    assert k.apply([table([], [], SIMPLE)], [state]).num_rows == 0
    assert k.apply([table([("a", 1, 1), ("a", 1, 1)], [1, -1], SIMPLE)], [state]).num_rows == 0
    assert state.looked_up == [] and state.rows == {}


@pytest.mark.parametrize("params, needle", [
    ({"partition_by": ["k"], "order_by": [], "funcs": [["r", "row_number", None, None]]},
     "needs an orderBy"),
    ({"partition_by": ["nope"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "row_number", None, None]]}, "no column 'nope'"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "percentile", "x", None]]}, "'percentile' is not one of"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "nth_value", "x", None]]}, "takes \\[frame, n, ignore_nulls\\]"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "first", "x", [None, 2, False]]]}, "1 for first/last"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "ntile", None, 0]]}, "number of buckets"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None], ["x", "asc", None]],
      "funcs": [["r", "sum", "x", ["range", -5, 0]]]}, "exactly one order column"),
    ({"partition_by": ["k"], "order_by": [["k", "asc", None]],
      "funcs": [["r", "sum", "x", ["range", -5, 0]]]}, "order column 'k' is string"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "sum", "x", ["range", -1.5, 0]]]}, "not an integer within"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "sum", "x", ["range", float("nan"), 0]]]}, "not a finite number"),
    ({"partition_by": ["k"], "order_by": [],
      "funcs": [["r", "first", "x", [["rows", None, None], 1, False]]]}, "needs an orderBy"),
    ({"partition_by": ["k"], "order_by": [],
      "funcs": [["r", "sum", "x", ["rows", None, 0]]]}, "needs an orderBy"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "lag", "x", [0, None]]]}, "int n >= 1"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "lead", "x", None]]}, "takes \\[n, default\\]"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "lead", "x", [1, "zz"]]]}, "default 'zz' is not a int64"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "sum", "x", ["rows", 2, 1]]]}, "starts after it ends"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "count", None, ["groups", 0, 0]]]}, "is not None, an int"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "avg", "k", 3]]}, "avg of string"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["x", "count", None, None]]}, "repeats a column"),
    ({"partition_by": ["k"], "order_by": [["t", "up", None]],
      "funcs": [["r", "rank", None, None]]}, "asc/desc"),
    ({"partition_by": ["k"], "order_by": [["t", "asc", None]],
      "funcs": [["r", "sum", "x", -2]]}, "int >= 0"),
])
def test_bad_definitions_are_refused_naming_what(params, needle):
    with pytest.raises(InvalidInput, match=needle):
        build("over", [SIMPLE], params)


def test_bulk_unbounded_and_long_frames_match_the_model():
    """Hundreds of rows in few partitions: the sparse table's higher levels, the length
    classes of the unbounded double fold, long frames on both sides of the row (folded in
    frame order), and frames longer than some partitions."""
    import random

    rnd = random.Random(6)
    funcs = [WindowFn("max", "v", "mx"), WindowFn("min", "v", "mn", 40),
             WindowFn("sum", "v", "sv"), WindowFn("avg", "v", "av", 70),
             WindowFn("dense_rank", None, "dr"), WindowFn("sum", "v", "sf", ["rows", -20, 25]),
             WindowFn("avg", "v", "au", ["rows", 3, None]),
             WindowFn("max", "v", "mr", ["range", 0, None])]
    order = [OrderKey("o", descending=True), OrderKey("s"), OrderKey("v")]
    model = Model(ROLL, ["p"], order, funcs)
    k = OverKernel(ROLL, ["p"], order, funcs)
    state = DictZSet()
    net: list[tuple] = []
    total: Counter = Counter()
    for _ in range(3):
        batch = [(rnd.choice([1, 2, 3, None]), rnd.randrange(50), rnd.choice(["a", "b"]),
                  rnd.choice([0.1, 0.7, -3.25, 1e16, None, 2.5])) for _ in range(150)]
        gone = rnd.sample(net, min(len(net), 40))
        for r in gone:
            net.remove(r)
        net += batch
        ws = [1] * len(batch) + [-1] * len(gone)
        out = k.apply([table(batch + gone, ws, ROLL)], [state])
        total += out_counter(out)
        total = Counter({r: n for r, n in total.items() if n})
        assert total == model.rows(net)


# ---- through the pipeline (the fluent API) ---------------------------------------------

BIDS = {"bid": "auction long, bidder long, price long, dateTime timestamp, channel string"}


def _bids(seed: int, n: int) -> list[dict]:
    import datetime as dt
    import random

    rnd = random.Random(seed)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [{"auction": rnd.choice([1, 2, 3, None]), "bidder": rnd.randint(1, 4),
             "price": rnd.choice([None, rnd.randint(1, 50)]),
             "dateTime": base + dt.timedelta(milliseconds=rnd.randint(0, 10**6)),
             "channel": rnd.choice(["web", "app", None])} for _ in range(n)]


def _both(bid):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    top = Window.partitionBy("auction").orderBy(F.desc("price"), "bidder", "dateTime",
                                                "channel")
    last3 = (Window.partitionBy("bidder").orderBy("dateTime", "auction", "price", "channel")
             .rowsBetween(-2, 1))  # a frame ending after the current row
    add = bid.with_column if hasattr(bid, "with_column") else bid.withColumn
    ranked = add("rn", F.row_number().over(top))
    out = ranked
    for name, col in [
            ("avg3", F.avg("price").over(last3)),
            # the whole partition (no orderBy), a timestamp RANGE with an interval offset,
            # nth_value IGNORE NULLS over a total order
            ("total", F.sum("price").over(Window.partitionBy("auction"))),
            ("recent", F.expr("count(price) OVER (PARTITION BY bidder ORDER BY dateTime RANGE "
                              "BETWEEN INTERVAL 100 SECONDS PRECEDING AND CURRENT ROW)")),
            ("second", F.nth_value("channel", 2, True).over(top))]:
        out = out.with_column(name, col) if hasattr(out, "with_column") else out.withColumn(
            name, col)
    return out.filter(F.col("rn") <= 2)


@pytest.mark.spark
def test_window_functions_through_the_pipeline_equal_spark_batch(spark, tmp_path):
    """Two chained window operators, two runs (a restart between): inserts, then retractions
    in the middle of partitions and more inserts."""
    from headrace.testing.queries import (
        batch_result,
        encode_entries,
        rows_equal,
        stream_result,
    )

    first, more = _bids(3, 120), _bids(4, 40)
    gone = first[10:40]
    waves = [encode_entries("bid", first),
             encode_entries("bid", gone, weight=-1) + encode_entries("bid", more)]
    streamed = stream_result(spark, str(tmp_path / "store"), BIDS, waves,
                             lambda p, src: _both(src["bid"]), name="over",
                             checkpoint_dir=str(tmp_path / "ck"))
    net = first[:10] + first[40:] + more
    batch = batch_result(spark, BIDS, {"bid": net}, lambda s: _both(s["bid"]))
    assert batch.num_rows > 0
    ok, why = rows_equal(streamed, batch)
    assert ok, why


@pytest.mark.spark
def test_window_definitions_are_checked_when_written(spark, tmp_path):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    p = Pipeline(spark, str(tmp_path / "s"), name="bad", checkpoint_dir=str(tmp_path / "ck"))
    bid = p.read_queue("bids", BIDS)["bid"]
    w = Window.partitionBy("auction").orderBy("dateTime")
    refused = [
        (F.expr("sum(price) OVER (PARTITION BY auction ORDER BY dateTime RANGE BETWEEN "
                "INTERVAL 1 MONTH PRECEDING AND CURRENT ROW)"), "day-time intervals"),
        (F.expr("sum(price) OVER (PARTITION BY auction ORDER BY CAST(price AS DECIMAL(9, 2)) "
                "RANGE BETWEEN 2.5 PRECEDING AND CURRENT ROW)"), "decimal"),
        (F.first("price").over(Window.partitionBy("auction")), "needs an orderBy"),
        (F.expr("lag(price) IGNORE NULLS OVER (PARTITION BY auction ORDER BY dateTime)"),
         "IGNORE NULLS"),
        (F.percentile_approx("price", 0.5).over(w), "not supported"),
        (F.lag("price", -1).over(w), "literal >= 1"),
        (F.row_number().over(w) + 1, "whole column"),
        (F.row_number().over(Window.partitionBy(F.col("auction") % 2).orderBy("price")),
         "is an expression"),
        (F.sum("price").over(Window.partitionBy("auction").rowsBetween(-1, 0)),
         "needs an orderBy"),
        (F.count_distinct("price").over(w.rowsBetween(-1, 0)), "DISTINCT"),
    ]
    for col, needle in refused:
        with pytest.raises(InvalidInput, match=needle):
            bid.with_column("x", col)
    with pytest.raises(InvalidInput, match="OVER"):
        bid.select("price", F.row_number().over(w).alias("rn"))
    # a replaced column keeps its place; the types are Spark's
    out = bid.with_column("price", F.max("price").over(w.rowsBetween(-3, 0)))
    assert out.columns == ["auction", "bidder", "price", "dateTime", "channel"]
    # Spark's default frame, frames past the current row, lag/lead: built, Spark's types
    out = bid.with_column("run", F.sum("price").over(w))
    assert out.schema.field("run").type == pa.int64()
    out = out.with_column("around", F.avg("price").over(w.rowsBetween(-1, Window.unboundedFollowing)))
    out = out.with_column("prev", F.lag("channel", 2, "none").over(w))
    assert out.schema.field("prev").type == pa.string()
    # value-offset RANGE frames, first/last/nth_value, ntile, percent_rank, cume_dist
    out = bid.with_column("near", F.max("price").over(
        Window.partitionBy("auction").orderBy(F.desc("price")).rangeBetween(-5, 3)))
    assert out.schema.field("near").type == pa.int64()
    out = out.with_column("f", F.first("channel", True).over(w.rowsBetween(-1, 1)))
    out = out.with_column("nt", F.ntile(4).over(w))
    out = out.with_column("cd", F.cume_dist().over(w))
    assert [out.schema.field(c).type for c in ("f", "nt", "cd")] == [
        pa.string(), pa.int32(), pa.float64()]
    out = bid.with_column("rn", "row_number() OVER (PARTITION BY bidder ORDER BY price)")
    assert out.schema.field("rn").type == pa.int32()
    with pytest.raises(InvalidInput, match="append"):
        out.write_shard("ranked", mode="append")


def test_rows_tied_on_every_order_key_are_numbered_alike_whatever_their_arrival():
    """-0.0 and 0.0 are peers in ORDER BY: row_number breaks the tie by the row's encoding,
    so the numbering does not depend on which row came first or in which batch."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("tag", pa.string())])
    funcs = [WindowFn("row_number", None, "rn"), WindowFn("rank", None, "rk")]
    rows = [(1, 0.0, "x"), (1, -0.0, "y"), (1, 0.0, "a")]
    results = []
    for batches in ([rows], [rows[::-1]], [[rows[2]], [rows[0]], [rows[1]]]):
        k = OverKernel(schema, ["k"], [OrderKey("v")], funcs)
        state, total = DictZSet(), Counter()
        for b in batches:
            total += out_counter(k.apply([table(b, [1] * len(b), schema)], [state]))
        results.append(Counter({r: n for r, n in total.items() if n}))
    assert results[0] == results[1] == results[2]
    assert sorted(r[3] for r in results[0]) == [1, 2, 3]
    assert {r[4] for r in results[0]} == {1}
