"""headrace.shard with real PySpark: batch read, stream read, and an exactly-once stream sink."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pytest

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


def test_stream_sink_exactly_once_across_restarts(shard_spark, tmp_path):
    url = str(tmp_path / "store")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    ckpt = tmp_path / "ckpt"
    replayed = None
    for round_no in range(3):  # three interrupted runs, then a final one
        _write_inputs(inputs, round_no * 2, 2)
        _run(shard_spark, inputs, url, "out", ckpt)
        if replayed is not None:
            assert (ckpt / "commits" / str(replayed)).exists()  # Spark did rerun that batch
        # crash after the sink's commit but before Spark's commit log: Spark replays the batch
        last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
        (ckpt / "commits" / str(last)).unlink()
        shutil.rmtree(ckpt / "commits" / f".{last}.crc", ignore_errors=True)
        (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
        replayed = last
    _run(shard_spark, inputs, url, "out", ckpt)  # replays the last batch: must be a no-op
    assert PersistClient(url).upper("out") == 6
    assert _history(url, "out") == _expected(6)  # same updates at the same times, none twice
    client = PersistClient(url)
    referenced = {p.key for p in client.state("out").parts}
    assert {m.key for m in client.store.list("persist/shards/out/parts/")} == referenced
