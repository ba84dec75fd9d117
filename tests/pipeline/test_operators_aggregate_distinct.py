"""DISTINCT aggregates' edge cases: count(DISTINCT a, b), sum/avg(DISTINCT x) under retraction.

The random-stream conformance against Spark is in test_operators_aggregate.py (its AGGS hold
these aggregates); here each rule is pinned by a fixed sequence a user would notice."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest
from conformance import (  # noqa: I001  (tests/pipeline is on sys.path)
    I64_MAX,
    INF,
    NAN,
    NEG_NAN,
    DictZSet,
    canon,
    canon_row,
    out_counter,
    table,
)

from headrace.errors import InvalidInput
from headrace.pipeline.errors import ArithmeticOverflow
from headrace.pipeline.operators import build
from headrace.pipeline.operators.aggregate import ACC, DISTINCT, Agg, AggregateKernel

SCHEMA = pa.schema([("k", pa.string()), ("x", pa.int64()), ("d", pa.float64()),
                    ("s", pa.string())])


class Running:
    """A kernel over one state, integrating its output deltas (the visible result)."""

    def __init__(self, aggs, by=("k",)):
        self.kernel = AggregateKernel(SCHEMA, list(by), aggs)
        self.state = DictZSet()
        self.total: Counter = Counter()
        self.last: Counter = Counter()

    def step(self, rows, ws):
        self.state.looked_up.clear()
        out = self.kernel.apply([table(rows, ws, SCHEMA)], [self.state])
        self.last = out_counter(out)
        for row, n in self.last.items():
            self.total[row] += n
        self.total = +self.total
        return set(self.total)


def x_rows(*xs, k="a"):
    return [(k, x, None, None) for x in xs]


def d_rows(*ds, k="a"):
    return [(k, None, d, None) for d in ds]


def test_sum_and_avg_distinct_count_a_value_until_its_last_copy_leaves():
    r = Running([Agg("sum_distinct", "x", "s"), Agg("avg_distinct", "x", "a"),
                 Agg("count_distinct", "x", "c"), Agg("sum", "x", "plain")])
    assert r.step(x_rows(5, 3, None), [2, 1, 1]) == {("a", 8, canon(4.0), 2, 13)}
    r.step(x_rows(5), [-1])  # one copy of 5 stays: the DISTINCT outputs keep their values
    assert r.total == Counter({("a", 8, canon(4.0), 2, 8): 1})
    assert r.step(x_rows(5), [-1]) == {("a", 3, canon(3.0), 1, 3)}  # the last copy left
    assert r.step(x_rows(5), [1]) == {("a", 8, canon(4.0), 2, 8)}  # and came back
    # a value added and removed within one batch changes nothing, and is not stored
    r.step(x_rows(7, 7), [1, -1])
    assert r.last == Counter()
    # a group of NULLs only: sum/avg(DISTINCT) NULL, counts 0 (as Spark)
    assert ("b", None, None, 0, None) in r.step(x_rows(None, k="b"), [1])


def test_distinct_reads_only_the_values_in_the_delta_and_stores_one_row_per_value():
    r = Running([Agg("sum_distinct", "x", "s")])
    r.step(x_rows(*range(50)), [1] * 50)
    r.step(x_rows(3, 3), [1, 1])
    read = [key for key in r.state.looked_up if key.startswith(DISTINCT)]
    assert len(read) == 1  # the one value of the delta, not the group's 50
    stored = [key for key in r.state.rows if key.startswith(DISTINCT)]
    assert len(stored) == 50 and r.state.rows[read[0]] == {b"": 3}  # value 3: 3 copies
    r.step(x_rows(3), [-3])
    assert len([key for key in r.state.rows if key.startswith(DISTINCT)]) == 49


def test_distinct_doubles_zero_signs_and_nans_are_one_value_each():
    r = Running([Agg("sum_distinct", "d", "s"), Agg("avg_distinct", "d", "a"),
                 Agg("count_distinct", "d", "c")])
    assert r.step(d_rows(0.0, -0.0, NAN, NEG_NAN, 1.5), [1] * 5) == {
        ("a", canon(NAN), canon(NAN), 3)}
    assert r.step(d_rows(NAN), [-1]) == {("a", canon(NAN), canon(NAN), 3)}  # -NaN remains
    assert r.step(d_rows(NEG_NAN), [-1]) == {("a", canon(1.5), canon(0.75), 2)}
    r.step(d_rows(0.0), [-1])  # -0.0 is still there: the same distinct value
    assert r.last == Counter()
    assert r.step(d_rows(-0.0), [-1]) == {("a", canon(1.5), canon(1.5), 1)}
    assert r.step(d_rows(-0.0), [1]) == {("a", canon(1.5), canon(0.75), 2)}
    # non-finite values enter and leave the set like any other
    assert r.step(d_rows(INF, -INF, INF), [1, 1, 1]) == {("a", canon(NAN), canon(NAN), 4)}
    assert r.step(d_rows(-INF), [-1]) == {("a", canon(INF), canon(INF), 3)}
    assert r.step(d_rows(INF), [-1]) == {("a", canon(INF), canon(INF), 3)}  # one copy left
    assert r.step(d_rows(INF), [-1]) == {("a", canon(1.5), canon(0.75), 2)}
    # 1e308 + 1e308 over DISTINCT is one 1e308, exact after a retraction
    assert r.step(d_rows(1e308, 1e308, -1.5), [1, 1, 1]) == {
        ("a", canon(1e308), canon(1e308 / 4), 4)}  # {0, 1.5, 1e308, -1.5}
    assert r.step(d_rows(1e308), [-2]) == {("a", canon(0.0), canon(0.0), 3)}


def test_count_distinct_of_several_columns_skips_tuples_with_a_null():
    r = Running([Agg("count_distinct", ("d", "s"), "c"), Agg("count", ("d", "s"), "n")])
    rows = [("a", None, 0.0, "p"), ("a", None, -0.0, "p"), ("a", None, 0.0, None),
            ("a", None, None, "p"), ("a", None, 1.0, "p"), ("a", None, 0.0, "q")]
    assert r.step(rows, [1] * 6) == {("a", 3, 4)}  # (0,p) (1,p) (0,q); 4 rows without NULL
    assert r.step(rows[:1], [-1]) == {("a", 3, 3)}  # (-0.0, p) still stands for (0, p)
    assert r.step(rows[1:2], [-1]) == {("a", 2, 2)}


def test_sum_distinct_overflow_raises_on_the_distinct_total_only():
    r = Running([Agg("sum_distinct", "x", "s")])
    assert r.step(x_rows(I64_MAX), [2]) == {("a", I64_MAX)}  # sum(x) would overflow here
    before = r.state.snapshot()
    with pytest.raises(ArithmeticOverflow, match=r"sum\(DISTINCT x\) as 's' overflows int64"):
        r.step(x_rows(1), [1])
    assert r.state.snapshot() == before
    with pytest.raises(ArithmeticOverflow):  # one copy of I64_MAX is still in the set
        r.step(x_rows(I64_MAX, 1), [-1, 1])
    assert r.step(x_rows(I64_MAX, 1), [-2, 1]) == {("a", 1)}


class ScanZSet(DictZSet):
    """DictZSet with the scan and key deletion that event-time expiry uses."""

    def scan(self, lo, hi):
        keys = sorted(k for k in self.rows if lo <= k < hi)
        if keys:
            yield self.lookup_many(pa.array(keys, pa.binary()))

    def delete_keys(self, keys) -> None:
        for k in keys.to_pylist():
            self.rows.pop(k, None)


def test_expiry_drops_a_closed_windows_distinct_values_and_emits_its_final_row():
    schema = pa.schema([("t", pa.int64()), ("x", pa.int64()), ("s", pa.string())])
    kernel = AggregateKernel(schema, ["t"], [Agg("sum_distinct", "x", "sx"),
                                             Agg("count_distinct", ("x", "s"), "c")])
    state = ScanZSet()
    rows = [(1, 5, "a"), (1, 5, "b"), (1, 7, None), (2, 5, "a"), (2, 9, "c")]
    kernel.apply([table(rows, [1] * 5, schema)], [state])
    below = kernel.group_codec.encode(pa.table({"t": pa.array([2], pa.int64())})).to_pylist()[0]
    final = kernel.expire([state], below, emit=True)
    assert out_counter(final) == Counter({(1, 12, 2): 1})
    open_ = kernel.group_codec.encode(pa.table({"t": pa.array([2], pa.int64())}))[0].as_py()
    assert [k for k in state.rows if k[:1] != DISTINCT] == [ACC + open_]
    # window 2's values are left: 5 and 9 for sx, (5, a) and (9, c) for c; window 1's gone
    assert sorted(k[3:3 + len(open_)] for k in state.rows if k[:1] == DISTINCT) == [open_] * 4
    # the window that stays open goes on from its state
    out = kernel.apply([table([(2, 9, "c"), (2, 4, "c")], [-1, 1], schema)], [state])
    assert out_counter(out) == Counter({(2, 14, 2): -1, (2, 9, 2): 1})


@pytest.mark.parametrize("agg, match", [
    (Agg("sum_distinct", "s", "m"), r"sum\(DISTINCT\) of string"),
    (Agg("avg_distinct", "s", "m"), r"avg\(DISTINCT\) of string"),
    (Agg("sum_distinct", ("x", "d"), "m"), "takes one column"),
    (Agg("max", ("x", "d"), "m"), "takes one column"),
    (Agg("count_distinct", ("x", "nope"), "m"), "unknown column 'nope'"),
])
def test_bad_distinct_definitions_are_refused(agg, match):
    with pytest.raises(InvalidInput, match=match):
        AggregateKernel(SCHEMA, ["k"], [agg])


def test_avg_distinct_of_decimal_is_refused_and_sum_distinct_is_decimal():
    schema = pa.schema([("m", pa.decimal128(10, 2))])
    with pytest.raises(InvalidInput, match=r"avg\(DISTINCT\) of decimal128"):
        AggregateKernel(schema, [], [Agg("avg_distinct", "m", "a")])
    k = AggregateKernel(schema, [], [Agg("sum_distinct", "m", "s")])
    assert k.output_schema.field("s").type == pa.decimal128(20, 2)


def test_params_survive_json_as_the_pipeline_stores_them():
    params = json.loads(json.dumps({"by": ["k"], "aggs": {
        "c": ["count_distinct", ["d", "s"]], "s": ["sum_distinct", "x"],
        "a": "avg_distinct(d)", "n": ["count", ["x", "s"]]}}))
    k = build("aggregate", [SCHEMA], params)
    assert [a.columns for a in k.aggs] == [("d", "s"), ("x",), ("d",), ("x", "s")]
    assert [a.func for a in k.aggs] == ["count_distinct", "sum_distinct", "avg_distinct",
                                        "count"]


@pytest.mark.spark
def test_sum_distinct_overflow_and_zero_signs_match_spark(spark):
    rows = [("a", I64_MAX, -0.0, None), ("a", I64_MAX, 0.0, None), ("a", 1, NAN, None)]

    def batch(n: int):
        spark.createDataFrame(table(rows[:n], None, SCHEMA)).createOrReplaceTempView("in0")
        return spark.sql("SELECT k, sum(DISTINCT x) AS s, avg(DISTINCT d) AS a FROM in0 "
                         "GROUP BY k").collect()

    r = Running([Agg("sum_distinct", "x", "s"), Agg("avg_distinct", "d", "a")])
    assert r.step(rows[:2], [1, 1]) == {("a", I64_MAX, canon(0.0))}
    assert Counter(canon_row(tuple(row)) for row in batch(2)) == r.total
    with pytest.raises(ArithmeticOverflow):
        r.step(rows[2:], [1])
    with pytest.raises(Exception, match="ARITHMETIC_OVERFLOW"):
        batch(3)


@pytest.mark.spark
def test_fluent_distinct_aggregates_stream_equal_to_spark_batch(spark, tmp_path):
    """F.count_distinct(a, b), F.sum_distinct, avg(DISTINCT expr) through a running pipeline
    (inserts, then retractions of some rows and more inserts after a restart)."""
    import random

    from pyspark.sql import functions as F

    from headrace.testing.queries import batch_result, encode_entries, rows_equal, stream_result

    schemas = {"t": "k long, x long, d double, s string"}
    rnd = random.Random(19)
    rows = [{"k": rnd.choice([1, 2, None]), "x": rnd.choice([1, 2, 3, None]),
             "d": rnd.choice([0.0, -0.0, float("nan"), 1.5, None]),
             "s": rnd.choice(["a", "b", None])} for _ in range(60)]
    more = rows[:5]
    waves = [encode_entries("t", rows),
             encode_entries("t", rows[:25], weight=-1) + encode_entries("t", more)]

    def aggs():
        return [F.count_distinct("d", "s").alias("cds"), F.sum_distinct("x").alias("sx"),
                F.expr("avg(DISTINCT x * 2)").alias("ax2"), F.sum_distinct("d").alias("sd"),
                F.expr("count(x, s)").alias("nxs"), F.avg("x").alias("plain")]

    plans = []

    def build_query(p, src):
        out = src["t"].group_by("k").agg(*aggs())
        plans.append(next(n.params for n in p.nodes if getattr(n, "kind", "") == "aggregate"))
        return out

    streamed = stream_result(spark, str(tmp_path / "s"), schemas, waves, build_query,
                             checkpoint_dir=str(tmp_path / "ck"))
    assert plans[0]["aggs"] == {
        "cds": ["count_distinct", ["d", "s"]], "sx": ["sum_distinct", "x"],
        "ax2": ["avg_distinct", "_avg_arg"], "sd": ["sum_distinct", "d"],
        "nxs": ["count", ["x", "s"]], "plain": ["avg", "x"]}
    batch = batch_result(spark, schemas, {"t": rows[25:] + more},
                         lambda s: s["t"].groupBy("k").agg(*aggs()))
    equal, why = rows_equal(streamed, batch)
    assert equal, why


@pytest.mark.spark
def test_fluent_refusals_name_the_aggregate(spark, tmp_path):
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    p = Pipeline(spark, str(tmp_path / "s"), name="bad", checkpoint_dir=str(tmp_path / "ck"))
    t = p.read_queue("q", {"t": "k long, m decimal(10,2), x long"})["t"]
    with pytest.raises(InvalidInput, match=r"avg\(DISTINCT\) of decimal128"):
        t.group_by("k").agg(F.expr("avg(DISTINCT m)").alias("a"))
    with pytest.raises(InvalidInput, match="'sk'.*not supported"):
        t.group_by("k").agg(F.expr("skewness(DISTINCT x)").alias("sk"))
