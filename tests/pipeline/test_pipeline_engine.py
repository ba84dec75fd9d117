"""The engine on real PySpark: rows stay on executors, partitions change on restart, bad
entries never vanish, a new store never meets an old Spark checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest

from headrace.pipeline import Pipeline
from headrace.pipeline.driver import restart
from headrace.pipeline.errors import BadEntry
from headrace.spark.demo import (
    OUTPUT_SHARD,
    DemoSpec,
    build_pipeline,
    encode,
    expected_totals,
    generate_events,
    normalize_totals,
    produce,
)

pytestmark = pytest.mark.spark

SPEC = DemoSpec(seed=4, customers=20, orders=300, update_every=15, cancel_every=11)


@pytest.fixture(scope="module")
def expected(spark):
    return normalize_totals(expected_totals(spark, generate_events(SPEC)))


def _produce(root: str, waves: int) -> None:
    payloads = encode(generate_events(SPEC))
    step = -(-len(payloads) // waves)
    for i in range(0, len(payloads), step):
        produce(root, payloads[i : i + step])


def test_outputs_reach_the_shard_as_task_parts_only(spark, tmp_path, expected):
    """With inlining off, every output row is uploaded by a task: the driver collects part
    descriptors only (no output bytes), and the shard equals PySpark's answer."""
    root = str(tmp_path / "store")
    _produce(root, 2)
    p = build_pipeline(spark, root, partitions=2, checkpoint_dir=str(tmp_path / "ck"),
                       batches_per_trigger=1, output_inline_max=0)
    seen = []
    absorb = p.driver.absorb_control

    def spy(rows):
        seen.append(sorted(set(rows["__hr_kind"].to_pylist())) if rows is not None else [])
        return absorb(rows)

    p.driver.absorb_control = spy
    assert p.run(until_idle=True, max_runs=1) >= 2
    assert normalize_totals(p.read_shard(OUTPUT_SHARD)) == expected
    assert p.metrics["driver_inline_output_bytes_max"] == 0
    assert all("out" not in kinds for kinds in seen)
    assert any("part" in kinds for kinds in seen)
    assert p.metrics["task_puts"] > 0


def test_partitions_change_on_restart(spark, tmp_path, expected):
    """State is laid out in fixed buckets: a restart with another task count rescales."""
    root = str(tmp_path / "store")
    payloads = encode(generate_events(SPEC))
    half = len(payloads) // 2
    produce(root, payloads[:half])
    ckpt = str(tmp_path / "ck")
    p1 = build_pipeline(spark, root, partitions=1, checkpoint_dir=ckpt, batches_per_trigger=1)
    p1.run(until_idle=True, max_runs=1)
    assert p1.time >= 1
    produce(root, payloads[half:])
    p2 = build_pipeline(spark, root, partitions=3, checkpoint_dir=ckpt, batches_per_trigger=1)
    p2.run(until_idle=True, max_runs=1)
    assert normalize_totals(p2.read_shard(OUTPUT_SHARD)) == expected


def _bad_pipeline(spark, root, ckpt, mode):
    p = Pipeline(spark, root, name="bad", partitions=2, checkpoint_dir=ckpt,
                 on_bad_entry=mode, max_entry_bytes=200)
    src = p.read_queue("ingest", {"t": "k long, v double, s string"})
    agg = p.aggregate(src["t"], by=["k"], aggs={"n": "count"}, name="agg")
    p.write_shard(agg, "out")
    return p


GOOD = [{"table": "t", "k": 1, "v": 1.5, "s": "a"}, {"table": "t", "k": 2, "v": 2.0, "s": "b"}]
POISON = [b"not json",                                                # not JSON
          json.dumps({"table": "t", "k": "x", "v": 1.0, "s": "a"}).encode(),  # wrong type
          json.dumps({"table": "t", "k": 3, "s": "a"}).encode(),               # missing field
          json.dumps({"table": "nope", "k": 3}).encode(),                      # unknown table
          json.dumps({"table": "t", "k": 4, "v": 1.0, "s": "x" * 300}).encode(),  # huge
          json.dumps({"table": "t", "k": 5, "v": 1.0, "s": "a", "w": 0}).encode()]  # weight


def test_bad_entries_fail_naming_the_entry(spark, tmp_path):
    root = str(tmp_path / "store")
    produce(root, [json.dumps(g).encode() for g in GOOD] + [POISON[1]])
    p = _bad_pipeline(spark, root, str(tmp_path / "ck"), "fail")
    with pytest.raises(Exception, match=r"sequence 0 entry 2, table 't', field 'k'"):
        p.run(until_idle=True)
    assert (p.persist.upper("bad.progress") or 0) == 0  # nothing committed


def test_bad_entries_go_to_the_dead_letter_shard(spark, tmp_path):
    root = str(tmp_path / "store")
    produce(root, [json.dumps(g).encode() for g in GOOD] + POISON)
    p = _bad_pipeline(spark, root, str(tmp_path / "ck"), "dead_letter")
    p.run(until_idle=True, max_runs=1)
    assert p.metrics["bad_entries"] == 6
    dead = p.read_shard("bad.dead_letter").sort_by("index")
    assert dead["index"].to_pylist() == [2, 3, 4, 5, 6, 7]
    assert dead["field"].to_pylist() == [None, "k", "v", "table", None, "w"]
    assert dead["entry"].to_pylist() == POISON
    out = p.read_shard("out").sort_by("k")
    assert out["k"].to_pylist() == [1, 2] and out["n"].to_pylist() == [1, 1]
    assert BadEntry.__mro__[1].__name__ == "PipelineError"


def test_a_new_store_at_an_old_root_never_meets_the_old_spark_checkpoint(spark, tmp_path,
                                                                          expected):
    root = str(tmp_path / "store")
    _produce(root, 2)
    first = build_pipeline(spark, root, partitions=2, batches_per_trigger=1)
    first.run(until_idle=True, max_runs=1)
    old_ckpt = first.checkpoint_dir
    shutil.rmtree(root)  # a new, empty store at the same root
    _produce(root, 2)
    again = build_pipeline(spark, root, partitions=2, batches_per_trigger=1)
    assert again.checkpoint_dir != old_ckpt
    again.run(until_idle=True, max_runs=1)
    assert normalize_totals(again.read_shard(OUTPUT_SHARD)) == expected
    shutil.rmtree(old_ckpt, ignore_errors=True)
    shutil.rmtree(again.checkpoint_dir, ignore_errors=True)


def test_colliding_names_are_refused_when_the_pipeline_is_defined(spark, tmp_path):
    """Names that would collide with the entry envelope, the shard's columns or the engine's
    own columns fail at definition time with a clear error, never in a micro-batch."""
    from headrace.errors import InvalidInput

    p = Pipeline(spark, str(tmp_path / "store"), name="names", partitions=1)
    for spec, what in (("k long, w long", "envelope"), ("k long, `table` string", "envelope"),
                       ("k long, __hr_w long", "reserved prefix")):
        with pytest.raises(InvalidInput, match=what):
            p.read_queue("q", {"t": spec})
    src = p.read_queue("q", {"t": "k long, diff long, v long"})
    agg = p.aggregate(src["t"], by=["k", "diff"], aggs={"n": "count"}, name="agg")
    with pytest.raises(InvalidInput, match="'time' and 'diff'"):
        p.write_shard(agg, "out")
    with pytest.raises(InvalidInput):
        p.aggregate(src["t"], by=["k"], aggs={"k": "count"}, name="agg2")  # output = group col


def test_an_interrupted_batch_runs_before_spark_starts_and_once(spark, tmp_path, expected,
                                                                monkeypatch):
    """A batch that failed at its state checkpoint (in Spark's offset log, not in its commit log,
    not in our progress) runs again at restart from the queue range the log names, before the
    streaming query starts; Spark's own re-run of it then finds it done: counted once."""
    import os

    from headrace.store import FaultyStore, open_store

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    _produce(root, 3)

    class FailAtSecondCheckpoint(FaultyStore):
        def put(self, key, data, *args, **kw):
            if key.startswith("demo.state/") and p1.time >= 1:
                raise OSError("injected: the driver died at the state checkpoint")
            return super().put(key, data, *args, **kw)

    p1 = build_pipeline(spark, root, partitions=2, checkpoint_dir=ckpt, batches_per_trigger=1,
                        store=FailAtSecondCheckpoint(open_store(root)))
    with pytest.raises(Exception, match="injected"):
        p1.run(until_idle=True)
    assert p1.time == 1
    assert os.path.exists(os.path.join(ckpt, "offsets", "1"))
    assert not os.path.exists(os.path.join(ckpt, "commits", "1"))

    p2 = build_pipeline(spark, root, partitions=2, checkpoint_dir=ckpt, batches_per_trigger=1)
    early = restart.run_interrupted_batch
    times = []

    def spy(d):
        times.append(p2.time)
        early(d)
        times.append(p2.time)

    monkeypatch.setattr(restart, "run_interrupted_batch", spy)
    p2.run(until_idle=True, max_runs=1)
    assert times == [1, 2]  # batch 1 ran from the queue before Spark started
    assert normalize_totals(p2.read_shard(OUTPUT_SHARD)) == expected


def test_run_until_idle_starts_no_query_only_to_find_the_queue_empty(spark, tmp_path):
    """An availableNow query costs about a second to start, plan and stop: ``run`` reads the
    queue's manifest instead of starting one more query that would find nothing."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Starts(StreamingQueryListener):
        def __init__(self):
            self.started = 0

        def onQueryStarted(self, event):  # called before start() returns (Spark's contract)
            self.started += 1

        def onQueryProgress(self, event):
            pass

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    produce(root, [json.dumps(g).encode() for g in GOOD])
    starts = Starts()
    spark.streams.addListener(starts)
    try:
        p = _bad_pipeline(spark, root, ckpt, "fail")
        assert p.run(until_idle=True) == 1
        assert starts.started == 1  # the one that processed the entries, not a second
        assert p.run(until_idle=True) == 0
        assert starts.started == 1  # nothing new: no query at all
        produce(root, [json.dumps({"table": "t", "k": 9, "v": 0.5, "s": "c"}).encode()])
        assert p.run(until_idle=True) == 1
        assert starts.started == 2
    finally:
        spark.streams.removeListener(starts)
    assert p.read_shard("out").sort_by("k")["k"].to_pylist() == [1, 2, 9]


def test_each_task_gets_a_contiguous_even_range_of_buckets(spark):
    """Spark hash-partitions the shuffle key; the key ``task_of_bucket`` gives each bucket
    lands it in task b * n // B, so no task holds more than one bucket above another (by
    bucket number 32 buckets went 12 and 20 over 2 tasks). Our Murmur3 is Spark's hash()."""
    from pyspark.sql import functions as F

    from headrace.pipeline.driver.job import spark_murmur3_int, task_of_bucket
    from headrace.pipeline.names import BUCKET

    values = [0, 1, -1, 42, 2**31 - 1, -2**31, *range(100, 4000, 37)]
    got = spark.createDataFrame([(v,) for v in values], "v int") \
        .select("v", F.hash("v").alias("h")).collect()
    assert {r.v: r.h for r in got} == {v: spark_murmur3_int(v) for v in values}
    for buckets, n in [(32, 2), (32, 3), (7, 4), (64, 8), (3, 5)]:
        df = spark.range(buckets).select(F.col("id").cast("int").alias(BUCKET)) \
            .repartition(n, task_of_bucket(buckets, n)) \
            .select(BUCKET, F.spark_partition_id().alias("task"))
        placed = {r[BUCKET]: r.task for r in df.collect()}
        assert placed == {b: b * n // buckets for b in range(buckets)}, (buckets, n)
