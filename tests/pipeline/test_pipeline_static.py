"""The static plan (driver/static_plan.py): a one-table pipeline is planned once, its batches' parameters
reach the tasks through a Spark local property, and the tasks keep only the batch's range."""

from __future__ import annotations

import random

import pytest

from headrace.testing.queries import batch_result, encode_entries, produce_entries, rows_equal

pytestmark = pytest.mark.spark

SCHEMA = "k long, v long"


def _rows(seed: int, n: int) -> list[dict]:
    rnd = random.Random(seed)
    return [{"k": rnd.choice([None, *range(8)]), "v": rnd.choice([None, rnd.randint(-50, 50)])}
            for _ in range(n)]


def _define(spark, root: str, ckpt: str, *, static: bool = True, per_trigger=None, store=None):
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name="st", partitions=2, buckets=4, checkpoint_dir=ckpt,
                 batches_per_trigger=per_trigger, retain_batches=4, static_plan=static,
                 store=store)
    t = p.read_queue("in", {"t": SCHEMA})["t"]
    p.write_shard(p.aggregate(t, by=["k"], aggs={"n": "count", "s": "sum(v)", "c": "count(v)"},
                              name="agg"), "st.out")
    return p


def _expected(spark, rows):
    from pyspark.sql import functions as F

    return batch_result(spark, {"t": SCHEMA}, {"t": rows}, lambda s: s["t"].groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v").alias("s"), F.count("v").alias("c")))


def test_static_plan_equals_spark_and_skips_what_a_lost_spark_checkpoint_redelivers(spark,
                                                                                    tmp_path):
    """Three queue batches (one with retractions) run on the static plan, one batch per
    trigger. Spark's checkpoint is then lost: the new query re-reads every batch the queue
    still holds (retain_batches) in one Spark batch with a new one; its tasks keep only the
    new batch's entries. The shard equals Spark batch SQL over the net input at each step
    (NULL keys and values, retractions)."""
    root = str(tmp_path / "store")
    a, b, c, d = _rows(1, 40), _rows(2, 40), _rows(3, 40), _rows(4, 40)
    produce_entries(root, "in", encode_entries("t", a))
    produce_entries(root, "in", encode_entries("t", b))
    produce_entries(root, "in", encode_entries("t", c) + encode_entries("t", a[:10], weight=-1))
    p = _define(spark, root, str(tmp_path / "ck1"), per_trigger=1)
    p.run(until_idle=True)
    assert p.metrics["static_batches"] == p.metrics["batches"] == 3
    net = a[10:] + b + c
    equal, why = rows_equal(p.read_shard("st.out"), _expected(spark, net))
    assert equal, why

    produce_entries(root, "in", encode_entries("t", d))
    p = _define(spark, root, str(tmp_path / "ck2"))  # a new Spark checkpoint, same progress
    p.run(until_idle=True)
    assert p.metrics["static_batches"] == p.metrics["batches"] == 1
    assert p.last_batch["input_rows"] == len(d)  # the re-read batches were not counted again
    equal, why = rows_equal(p.read_shard("st.out"), _expected(spark, net + d))
    assert equal, why


def test_static_shape_is_a_chain_of_operators_over_one_or_two_tables():
    """What the static plan runs, and what stays on the per-batch job."""
    from test_pipeline_evolve import Plan  # noqa: I001  (tests/pipeline is on sys.path)

    from headrace.pipeline.driver.static_plan import static_shape

    def plan(build, **kw):
        p = Plan()
        p.dead_letter_shard, p.state_backend = kw.get("dead_letter"), kw.get("backend",
                                                                           "reservoir")
        build(p)
        return static_shape(p.nodes, p.queues, streams=False,
                            dead_letter=p.dead_letter_shard is not None,
                            backend=p.state_backend)

    def agg(p):
        t = p.read_queue("in", {"t": SCHEMA})["t"]
        p.write_shard(p.aggregate(t, by=["k"], aggs={"n": "count"}, name="agg"), "o")

    def join_then_agg(p):
        src = p.read_queue("in", {"t": SCHEMA, "u": "k long, u long"})
        j = p.join(src["t"], src["u"], on=["k"], name="j")
        p.write_shard(j, "joined")
        p.write_shard(p.aggregate(j, by=["k"], aggs={"n": "count"}, name="a"), "o")

    def two_readers(p):
        t = p.read_queue("in", {"t": SCHEMA})["t"]
        p.write_shard(p.aggregate(t, by=["k"], aggs={"n": "count"}, name="a"), "o")
        p.write_shard(p.aggregate(t, by=["v"], aggs={"n": "count"}, name="b"), "o2")

    def fan_out(p):
        t = p.read_queue("in", {"t": SCHEMA})["t"]
        a = p.aggregate(t, by=["k"], aggs={"n": "count"}, name="a")
        p.write_shard(p.aggregate(a, by=["n"], aggs={"m": "count"}, name="b"), "o")
        p.write_shard(p.aggregate(a, by=["k"], aggs={"m": "count"}, name="c"), "o2")

    assert [op.name for op in plan(agg)] == ["agg"]
    assert [op.name for op in plan(join_then_agg)] == ["j", "a"]
    assert plan(agg, dead_letter="p.dead_letter") is None
    assert plan(agg, backend="local+backup") is None
    assert plan(two_readers) is None  # the table read twice: a second branch
    assert plan(fan_out) is None  # an operator read twice: Spark would run it twice


def test_static_plan_runs_a_join_then_an_aggregate_equal_to_spark(spark, tmp_path):
    """Two tables joined, the join's rows to one shard and a count per key of them to another:
    both operators on the static plan (the join's control rows pass through the aggregate's
    shuffle), bad entries counted, each shard equal to Spark batch SQL."""
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    root = str(tmp_path / "store")
    rnd = random.Random(7)
    orders = [{"k": rnd.choice([None, *range(5)]), "v": rnd.randint(1, 9)} for _ in range(60)]
    users = [{"k": k, "u": rnd.randint(100, 999)} for k in range(4)]
    produce_entries(root, "in", encode_entries("u", users) + encode_entries("t", orders[:30]))
    produce_entries(root, "in", encode_entries("t", orders[30:])
                    + encode_entries("t", orders[:5], weight=-1))
    p = Pipeline(spark, root, name="sj", partitions=2, buckets=4,
                 checkpoint_dir=str(tmp_path / "ck"), batches_per_trigger=1)
    src = p.read_queue("in", {"t": SCHEMA, "u": "k long, u long"})
    j = p.join(src["t"], src["u"], on=["k"], name="j")
    p.write_shard(j, "sj.joined")
    p.write_shard(p.aggregate(j, by=["k"], aggs={"n": "count", "s": "sum(v)"}, name="a"),
                  "sj.per_key")
    p.run(until_idle=True)
    assert p.metrics["static_batches"] == p.metrics["batches"] == 2
    schemas = {"t": SCHEMA, "u": "k long, u long"}
    rows = {"t": orders[5:], "u": users}

    def joined(s):
        return s["t"].join(s["u"], on="k").select("k", "v", "u")

    def per_key(s):
        return joined(s).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))

    for shard, query in (("sj.joined", joined), ("sj.per_key", per_key)):
        equal, why = rows_equal(p.read_shard(shard), batch_result(spark, schemas, rows, query))
        assert equal, f"{shard}: {why}"


def test_static_plan_runs_stateless_steps_before_the_operator(spark, tmp_path, caplog):
    """A filter and a computed column before a group-by: on the static plan, the entries are
    checked before the steps (which may drop any row) and counted aside, so the batch's input
    count is every entry, and a bad entry still fails the batch naming it."""
    import json

    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline
    from headrace.pipeline.errors import PipelineError

    def define(root, ckpt):
        p = Pipeline(spark, root, name="ss", partitions=2, buckets=4, checkpoint_dir=ckpt,
                     batches_per_trigger=1)
        t = p.read_queue("in", {"t": SCHEMA})["t"]
        (t.filter(F.col("v") > 0).with_column("v2", F.col("v") * 2)
         .group_by("k").agg(F.count("*").alias("n"), F.sum("v2").alias("s"))
         .write_shard("ss.out"))
        return p

    root = str(tmp_path / "store")
    a, b = _rows(21, 50), _rows(22, 50)
    produce_entries(root, "in", encode_entries("t", a))
    produce_entries(root, "in", encode_entries("t", b) + encode_entries("t", a[:7], weight=-1))
    p = define(root, str(tmp_path / "ck"))
    p.run(until_idle=True, max_runs=1)
    assert p.metrics["static_batches"] == p.metrics["batches"] == 2
    assert p.last_batch["input_rows"] == len(b) + 7  # filtered-out rows are entries too
    # Spark's own account of the query's batches (Pipeline.spark_progress)
    assert [x["input_rows"] for x in p.spark_progress if x["input_rows"]] == [len(a), len(b) + 7]
    assert all(x["trigger_s"] > 0 for x in p.spark_progress)
    expected = batch_result(spark, {"t": SCHEMA}, {"t": a[7:] + b}, lambda s: s["t"].filter(
        F.col("v") > 0).withColumn("v2", F.col("v") * 2).groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v2").alias("s")))
    equal, why = rows_equal(p.read_shard("ss.out"), expected)
    assert equal, why

    bad_root = str(tmp_path / "bad")
    # the bad entry is one the filter would drop: it is checked before the steps
    produce_entries(bad_root, "in", encode_entries("t", a[:3]) + [
        json.dumps({"table": "t", "k": "x", "v": -5}).encode()])
    q = define(bad_root, str(tmp_path / "ck2"))
    with pytest.raises(PipelineError, match=r"sequence 0 entry 3, table 't', field 'k'"):
        q.run(until_idle=True, max_runs=1)
    assert q.time == 0  # nothing committed
    # run again: the batch Spark planned runs first, before the query (the restart's path)
    with caplog.at_level("INFO", logger="headrace.pipeline"), \
            pytest.raises(PipelineError, match=r"sequence 0 entry 3, table 't', field 'k'"):
        q.run(until_idle=True, max_runs=1)
    assert "running the interrupted batch" in caplog.text
    assert q.time == 0


def test_a_batch_whose_tasks_ran_with_other_parameters_is_refused():
    """The tasks echo their batch's run prefix; one from another batch fails the batch before
    anything is committed (static_plan.check)."""
    import pyarrow as pa

    from headrace.pipeline.driver.static_plan import check
    from headrace.pipeline.errors import PipelineError
    from headrace.pipeline.exec.control import CONTROL_SCHEMA, control_rows

    def rows(*prefixes):
        return pa.Table.from_batches([control_rows(
            [("rows", b"3")] + [("batch", x.encode()) for x in prefixes], CONTROL_SCHEMA)])

    check(rows("t4-aa", "t4-aa"), "t4-aa")
    check(None, "t4-aa")
    with pytest.raises(PipelineError, match="t3-bb"):
        check(rows("t4-aa", "t3-bb"), "t4-aa")


_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[3])  # tests/pipeline
from headrace.store import FaultyStore, open_store
from headrace.testing.spark import local_spark
from test_pipeline_static import _define
spark = local_spark("static-child", master="local[2]", shuffle_partitions=2)
committed = {"n": 0}

class KillAtCheckpoint(FaultyStore):
    def put(self, key, data, mode=None, **kw):
        if key.startswith("st.state/") and committed["n"] >= 1:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-way through batch 1's state checkpoint
        return super().put(key, data, mode, **kw) if mode is not None else \\
            super().put(key, data, **kw)

p = _define(spark, sys.argv[1], sys.argv[2], per_trigger=1,
            store=KillAtCheckpoint(open_store(sys.argv[1])))
p.on_batch = lambda info: committed.__setitem__("n", committed["n"] + 1)
p.run(until_idle=True)
print("not killed", flush=True)
"""


def test_static_plan_sigkilled_at_a_state_checkpoint_restarts_exactly_once(spark, tmp_path):
    """A child driver runs the static plan and is SIGKILLed in the second batch's state
    checkpoint (tasks done, state not committed). The restart finishes the queue: the shard
    equals Spark batch SQL over the whole input, nothing lost or counted twice."""
    import os

    from headrace.persist import PersistClient
    from headrace.store import open_store
    from headrace.testing.spark import run_sigkilled_child

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    waves = [_rows(11, 30), _rows(12, 30), _rows(13, 30)]
    for w in waves:
        produce_entries(root, "in", encode_entries("t", w))
    run_sigkilled_child(_CHILD, root, ckpt, os.path.dirname(os.path.abspath(__file__)))
    assert PersistClient(open_store(root)).upper("st.progress") == 1  # batch 0 committed

    p = _define(spark, root, ckpt, per_trigger=1)
    p.run(until_idle=True)
    assert p.metrics["batches"] == 2 and p.time == 3
    equal, why = rows_equal(p.read_shard("st.out"), _expected(spark, [r for w in waves
                                                                         for r in w]))
    assert equal, why


def test_a_stateless_query_costs_few_driver_requests_and_no_state_checkpoints(spark, tmp_path):
    """A filter + projection to a shard (Nexmark q2's shape) on the static plan: its output
    equals Spark batch SQL, and after the first batch the driver makes at most 6 store requests
    a batch (the output's parts checked and linked, the progress written) and writes no state
    checkpoint: the graph keeps no state."""
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    root = str(tmp_path / "store")
    waves = [_rows(40 + i, 60) for i in range(4)]
    for rows in waves:
        produce_entries(root, "in", encode_entries("t", rows))
    p = Pipeline(spark, root, name="sl", partitions=2, buckets=4,
                 checkpoint_dir=str(tmp_path / "ck"), batches_per_trigger=1)
    t = p.read_queue("in", {"t": SCHEMA})["t"]
    t.filter(F.col("v") > 0).select("k", (F.col("v") * 2).alias("v2")).write_shard("sl.out")
    requests = []
    p.on_batch = lambda info: requests.append(p.store.counts()["requests"])
    p.run(until_idle=True, max_runs=1)
    assert p.metrics["static_batches"] == p.metrics["batches"] == 4
    assert max(b - a for a, b in zip(requests, requests[1:], strict=False)) <= 6, requests
    assert len(list(p.store.list("sl.state/v/default/ckpt/"))) <= 1
    expected = batch_result(spark, {"t": SCHEMA}, {"t": sum(waves, [])}, lambda s: s["t"].filter(
        F.col("v") > 0).select("k", (F.col("v") * 2).alias("v2")))
    equal, why = rows_equal(p.read_shard("sl.out"), expected)
    assert equal, why
