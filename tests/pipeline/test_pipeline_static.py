"""The static plan (static.py): a one-table pipeline is planned once, its batches' parameters
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
    from headrace.pipeline.runner import Pipeline

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


def test_static_shape_is_one_table_read_by_one_operator():
    """What the static plan runs, and what stays on the per-batch job."""
    from test_pipeline_evolve import Plan  # noqa: I001  (tests/pipeline is on sys.path)

    from headrace.pipeline.static import static_shape

    def plan(build, **kw):
        p = Plan()
        p.dead_letter_shard, p.state_backend = kw.get("dead_letter"), kw.get("backend",
                                                                           "reservoir")
        build(p)
        return p

    def agg(p):
        t = p.read_queue("in", {"t": SCHEMA})["t"]
        p.write_shard(p.aggregate(t, by=["k"], aggs={"n": "count"}, name="agg"), "o")

    def two_tables(p):
        src = p.read_queue("in", {"t": SCHEMA, "u": "k long, u long"})
        p.write_shard(p.join(src["t"], src["u"], on=["k"], name="j"), "o")

    def chained(p):
        t = p.read_queue("in", {"t": SCHEMA})["t"]
        a = p.aggregate(t, by=["k"], aggs={"n": "count"}, name="a")
        p.write_shard(p.aggregate(a, by=["n"], aggs={"m": "count"}, name="b"), "o")

    assert static_shape(plan(agg)) is not None
    assert static_shape(plan(agg, dead_letter="p.dead_letter")) is None
    assert static_shape(plan(agg, backend="local+backup")) is None
    assert static_shape(plan(two_tables)) is None
    assert static_shape(plan(chained)) is None


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
    import signal
    import subprocess
    import sys

    from headrace.persist import PersistClient
    from headrace.store import open_store

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    waves = [_rows(11, 30), _rows(12, 30), _rows(13, 30)]
    for w in waves:
        produce_entries(root, "in", encode_entries("t", w))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, root, ckpt,
                              os.path.dirname(os.path.abspath(__file__))], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
    out, _ = child.communicate(timeout=600)
    try:
        os.killpg(child.pid, signal.SIGKILL)  # its JVM, if still up
    except ProcessLookupError:
        pass
    assert child.returncode == -signal.SIGKILL and "not killed" not in out
    assert PersistClient(open_store(root)).upper("st.progress") == 1  # batch 0 committed

    p = _define(spark, root, ckpt, per_trigger=1)
    p.run(until_idle=True)
    assert p.metrics["batches"] == 2 and p.time == 3
    equal, why = rows_equal(p.read_shard("st.out"), _expected(spark, [r for w in waves
                                                                         for r in w]))
    assert equal, why
