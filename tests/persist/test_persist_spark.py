"""headrace.shard with real PySpark: batch read, stream read, and an exactly-once stream sink."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from headrace.codec import ManualClock
from headrace.persist import PersistClient, make_updates
from headrace.spark.shard_source import register

pytestmark = pytest.mark.spark


@pytest.fixture
def shard_spark(spark):
    register(spark)
    return spark


def test_batch_and_stream_read(shard_spark, tmp_path):
    url = str(tmp_path / "store")
    w = PersistClient(url).open_writer("src")
    w.compare_and_append(make_updates({"k": ["a", "b", "a"], "v": [1, 2, 3]}, [0, 1, 2]), 0, 3)
    w.compare_and_append(make_updates({"k": ["a"], "v": [1]}, [3], [-1]), 3, 5)
    df = shard_spark.read.format("headrace.shard").option("url", url).option("shard", "src")
    got = {(r.k, r.v, r.time, r.diff) for r in df.load().collect()}
    assert got == {("b", 2, 4, 1), ("a", 3, 4, 1)}
    got1 = {(r.k, r.v, r.diff) for r in df.option("as_of", 1).load().collect()}
    assert got1 == {("a", 1, 1), ("b", 2, 1)}

    q = (shard_spark.readStream.format("headrace.shard").option("url", url)
         .option("shard", "src").load().writeStream.format("memory").queryName("shard_stream")
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    first = {(r.k, r.v, r.time, r.diff) for r in shard_spark.sql("select * from shard_stream")
             .collect()}
    assert first == {("b", 2, 4, 1), ("a", 3, 4, 1)}  # the snapshot at upper - 1


def test_restarted_stream_keeps_its_since(shard_spark, tmp_path):
    """Old code: the stream source held no capability, so after another reader advanced since a
    restarted query could not read the updates it had left and raised SinceViolation."""
    url = str(tmp_path / "store")
    client = PersistClient(url)
    w = client.open_writer("src")
    w.compare_and_append(make_updates({"k": ["a", "b"], "v": [1, 2]}, [0, 2]), 0, 3)
    got: list[tuple] = []

    def run() -> None:
        q = (shard_spark.readStream.format("headrace.shard").option("url", url)
             .option("shard", "src").load().writeStream
             .foreachBatch(lambda df, _: got.extend((r.k, r.v, r.time, r.diff)
                                                    for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None

    run()
    assert sorted(got) == [("a", 1, 2, 1), ("b", 2, 2, 1)]  # the snapshot at upper - 1
    stream_reader = [r.reader_id for r in client.state("src").leased]
    w.compare_and_append(make_updates({"k": ["c", "a"], "v": [3, 1]}, [3, 5], [1, -1]), 3, 6)
    client.open_reader("src").downgrade_since(5)  # another reader is done up to 5
    assert client.since("src") <= 2  # the stream's reader (offsets say which) holds it
    client.compact("src", max_parts=1)
    got.clear()
    run()  # a restart from the checkpoint
    assert sorted(got) == [("a", 1, 5, -1), ("c", 3, 3, 1)]
    state = client.state("src")
    assert stream_reader[0] in {r.reader_id for r in state.leased}  # the same reader, resumed


def _write_inputs(folder, first: int, count: int) -> None:
    for i in range(first, first + count):
        rows = [{"user": f"u{(i * 7 + j) % 5}", "amount": i * 10 + j} for j in range(3)]
        path = folder / f"in-{i:03d}.json"
        path.write_text("\n".join(json.dumps(r) for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source's order


def _expected(files: int) -> Counter:
    """One uninterrupted run: file i is micro-batch i, so its rows are at time i."""
    return Counter((f"u{(i * 7 + j) % 5}", i * 10 + j, i, 1) for i in range(files)
                   for j in range(3))


def _run(spark, inputs, url, shard, checkpoint) -> None:
    df = (spark.readStream.format("json").schema("user string, amount long")
          .option("maxFilesPerTrigger", 1).load(str(inputs)))
    q = (df.writeStream.format("headrace.shard").option("url", url).option("shard", shard)
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None


def _history(url, shard) -> Counter:
    client = PersistClient(url)
    ups = client.read_only(shard).updates_between(0, client.upper(shard))
    return Counter(zip(ups.column("user").to_pylist(), ups.column("amount").to_pylist(),
                       ups.column("time").to_pylist(), ups.column("diff").to_pylist(),
                       strict=True))


DRIVER = r"""
import sys
from headrace.spark.shard_source import register
from headrace.testing.spark import local_spark
inputs, url, ckpt = sys.argv[1:4]
spark = local_spark("persist-killed-driver", master="local[1]")
register(spark)
df = (spark.readStream.format("json").schema("user string, amount long")
      .option("maxFilesPerTrigger", 1).load(inputs))
(df.writeStream.format("headrace.shard").option("url", url).option("shard", "out")
   .option("checkpointLocation", ckpt).trigger(processingTime="0 seconds").start()
   .awaitTermination())
"""


def _kill_driver_mid_stream(inputs, url, ckpt) -> None:
    """Run the query in its own driver process and SIGKILL it (JVM included) mid-stream."""
    from headrace.testing.spark import child_env

    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(inputs), url, str(ckpt)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, env=child_env())
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if (PersistClient(url).upper("out") or 0) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert PersistClient(url).upper("out") >= 2
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _lose_last_commit_log_entry(ckpt) -> int:
    """A crash after the sink's commit but before Spark's commit log: Spark replays the batch."""
    last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    (ckpt / "commits" / str(last)).unlink()
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    return last


def test_stream_sink_exactly_once_across_restarts(shard_spark, tmp_path):
    url = str(tmp_path / "store")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    ckpt = tmp_path / "ckpt"
    _write_inputs(inputs, 0, 4)
    _kill_driver_mid_stream(inputs, url, ckpt)  # kill 1: SIGKILL of the whole driver
    _run(shard_spark, inputs, url, "out", ckpt)  # restart 1
    assert PersistClient(url).upper("out") == 4
    for files in (2, 0):  # kills 2 and 3: the commit log entry of the last batch is lost
        replayed = _lose_last_commit_log_entry(ckpt)
        _write_inputs(inputs, PersistClient(url).upper("out"), files)
        _run(shard_spark, inputs, url, "out", ckpt)  # restart: replays it, must be a no-op
        assert (ckpt / "commits" / str(replayed)).exists()  # Spark did rerun that batch
    assert PersistClient(url).upper("out") == 6
    assert _history(url, "out") == _expected(6)  # = one uninterrupted run: batch i = file i
    sink_writers = {w.writer_id for w in PersistClient(url).state("out").writers}
    assert len(sink_writers) == 1  # every batch of every run reused one registered writer
    # the killed driver may have left an uploaded, unlinked part: the sink writer's lease
    # (1 h) protects it, a sweep after the lease collects it
    client = PersistClient(url, clock=ManualClock(int(time.time() * 1000) + 7_200_000))
    client.sweep(grace_s=0)
    referenced = {p.key for p in client.state("out").parts}
    assert {m.key for m in client.store.list("persist/shards/out/parts/")} == referenced
