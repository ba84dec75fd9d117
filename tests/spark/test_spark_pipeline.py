"""The pipeline on real PySpark: output equals a from-scratch recomputation, exactly once,
through crashes at every step of the micro-batch protocol and without Spark's checkpoint."""

from __future__ import annotations

import shutil

import pytest

from headrace.pipeline.errors import PipelineError
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
from headrace.store import FaultyStore, LocalStore

pytestmark = pytest.mark.spark

SPEC = DemoSpec(seed=3, customers=30, orders=600, update_every=20, cancel_every=15)


def produce_waves(root: str, waves: int = 3) -> list[dict]:
    """Events in separate waves, so the queue holds several batches (several micro-batches)."""
    events = generate_events(SPEC)
    payloads = encode(events)
    step = -(-len(payloads) // waves)
    for i in range(0, len(payloads), step):
        produce(root, payloads[i : i + step])
    return events


@pytest.fixture(scope="module")
def expected(spark):
    return normalize_totals(expected_totals(spark, generate_events(SPEC)))


def test_pipeline_matches_batch_recomputation(spark, tmp_path, expected):
    root = str(tmp_path / "store")
    produce_waves(root)
    p = build_pipeline(spark, root, partitions=3, checkpoint_dir=str(tmp_path / "ckpt"),
                       batches_per_trigger=1)
    puts = track_puts(p)
    batches = p.run(until_idle=True, max_runs=1)
    assert batches >= 3
    assert normalize_totals(p.read_shard(OUTPUT_SHARD)) == expected
    # state changes of all partitions reach the store as one bundle per micro-batch: after
    # the first batch (which also registers the shards' writers, one CAS each), the driver makes
    # exactly 5 PUTs a batch (state bundle, progress part + CAS, output part + CAS)
    assert puts[1:] == [5] * (batches - 1)
    assert p.metrics["task_puts"] == 0


def track_puts(p) -> list[int]:
    """PUTs made by each committed batch (driver and tasks)."""
    per_batch, last = [], [0]

    def on_batch(info):
        now = p.store.counts()["puts"] + p.metrics["task_puts"]
        per_batch.append(now - last[0])
        last[0] = now

    p.on_batch = on_batch
    return per_batch


CRASH_POINTS = {
    "state-checkpoint": lambda k: k.startswith("demo.state"),
    "progress-cas": lambda k: "demo.progress" in k and "consensus" in k,
    "output-cas": lambda k: OUTPUT_SHARD in k and "consensus" in k,
}


def test_crash_at_each_protocol_step_then_restart(spark, tmp_path, expected):
    """A permanent failure at each durable step of the micro-batch protocol, one after another;
    each time a fresh Pipeline (new process state, same store) takes over — the last time also
    without Spark's checkpoint folder. The output equals an uninterrupted run's."""
    root = str(tmp_path / "store")
    produce_waves(root, waves=6)
    ckpt = tmp_path / "ckpt"
    replayed = 0
    for crash_at, keys in CRASH_POINTS.items():
        faulty = FaultyStore(LocalStore(root), seed=1)
        p = build_pipeline(spark, root, partitions=3, checkpoint_dir=str(ckpt),
                           batches_per_trigger=1, store=faulty)
        start = p.recover()
        # let one batch through, then fail the first matching PUT of the next one
        p.on_batch = lambda info, keys=keys, faulty=faulty, start=start: (
            info["time"] == start and faulty.set_faults(fail_calls=[1], verbs={"put"},
                                                        keys=keys, retryable=False))
        with pytest.raises(PipelineError, match="injected fault"):
            p.run(until_idle=True)
        assert p.time == start + 1, crash_at
        replayed += int(p.metrics["replayed_batches"])
    shutil.rmtree(ckpt)  # and Spark's own offsets and commits are gone too
    last = build_pipeline(spark, root, partitions=3, checkpoint_dir=str(ckpt),
                          batches_per_trigger=1)
    last.run(until_idle=True, max_runs=1)
    # the output-cas crash left batch t committed but unpublished: rebuilt on restart
    assert last.metrics["replayed_batches"] == 1
    assert normalize_totals(last.read_shard(OUTPUT_SHARD)) == expected


@pytest.mark.parametrize("crash_at", ["progress-cas", "output-cas"])
def test_a_crash_right_after_a_snapshot_checkpoint_is_recovered(spark, tmp_path, expected,
                                                                 crash_at):
    """The reservoir's snapshot checkpoint (every 20th version) drops every earlier one. A
    crash between it and the progress CAS re-runs the batch from the version before; one
    between the progress CAS and the output CAS replays the output from it. Both need that
    version readable after the snapshot (``checkpoint(keep_from=...)``); before, the restart
    failed: the chain of that version was deleted ("checkpoint 1 not found or no longer
    retained")."""
    from headrace.reservoir import ReservoirOptions, ReservoirStorage

    root = str(tmp_path / "store")
    produce_waves(root, waves=3)
    interval = ReservoirOptions().snapshot_interval
    with ReservoirStorage.open(root, stream="demo.state") as st:  # batch 1 writes a snapshot
        for _ in range(interval - 2):
            st.checkpoint()
    ckpt = str(tmp_path / "ckpt")
    faulty = FaultyStore(LocalStore(root), seed=1)
    p = build_pipeline(spark, root, partitions=2, checkpoint_dir=ckpt, batches_per_trigger=1,
                       store=faulty)
    p.on_batch = lambda info: info["time"] == 0 and faulty.set_faults(
        fail_calls=[1], verbs={"put"}, keys=CRASH_POINTS[crash_at], retryable=False)
    with pytest.raises(PipelineError, match="injected fault"):
        p.run(until_idle=True)
    with ReservoirStorage.open(root, stream="demo.state") as st:
        assert st.version == interval  # the snapshot landed
    moved = str(tmp_path / "moved")  # a new host: no worker has a reader of the old version
    shutil.copytree(root, moved)
    last = build_pipeline(spark, moved, partitions=2, checkpoint_dir=ckpt, batches_per_trigger=1)
    last.run(until_idle=True, max_runs=1)
    assert last.metrics["replayed_batches"] == (crash_at == "output-cas")
    assert normalize_totals(last.read_shard(OUTPUT_SHARD)) == expected


def test_pipeline_on_s3(spark, s3_url, expected):
    """The same pipeline with every byte on a real S3 endpoint (moto): queue, state, shards."""
    produce_waves(s3_url, waves=2)
    p = build_pipeline(spark, s3_url, partitions=3, batches_per_trigger=1)
    puts = track_puts(p)
    assert p.run(until_idle=True, max_runs=1) >= 2
    assert normalize_totals(p.read_shard(OUTPUT_SHARD)) == expected
    assert puts[1:] == [5] * (p.time - 1)


def test_local_backup_backend_crash_and_new_host(spark, tmp_path, expected):
    """state_backend='local+backup': spines on executor disk, a backup snapshot per changed
    bucket. A crash at the commit point, then a restart on a 'new host' (empty local disk):
    the state comes back from the backups and the output equals an uninterrupted run's."""
    root = str(tmp_path / "store")
    produce_waves(root, waves=4)
    faulty = FaultyStore(LocalStore(root), seed=2)
    p1 = build_pipeline(spark, root, partitions=3, batches_per_trigger=1, store=faulty,
                        state_backend="local+backup", local_root=str(tmp_path / "host-a"))
    p1.on_batch = lambda info: info["time"] == 1 and faulty.set_faults(
        fail_calls=[1], verbs={"put"}, retryable=False,
        keys=lambda k: "demo.progress" in k and "consensus" in k)
    with pytest.raises(PipelineError, match="injected fault"):
        p1.run(until_idle=True)
    assert p1.time == 2
    assert any(m.key.startswith("demo.backup/") for m in LocalStore(root).list("demo.backup/"))
    p2 = build_pipeline(spark, root, partitions=3, batches_per_trigger=1,
                        state_backend="local+backup", local_root=str(tmp_path / "host-b"))
    p2.run(until_idle=True, max_runs=1)
    assert normalize_totals(p2.read_shard(OUTPUT_SHARD)) == expected
    # the same store refuses the other backend: the state layout is part of the fingerprint
    p3 = build_pipeline(spark, root, partitions=3)
    with pytest.raises(PipelineError, match="different operator graph"):
        p3.recover()
