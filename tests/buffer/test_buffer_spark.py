"""The headrace.queue streaming source on real PySpark: restart is exactly once, fencing works."""

from __future__ import annotations

import time

import pytest

from headrace.buffer import Fenced, Producer, ProducerConfig, list_entries
from headrace.pipeline.exec.queue_source import QueueStreamReader, batch_to_arrow, register
from headrace.store import open_store

pytestmark = pytest.mark.spark


def produce(url: str, start: int, count: int, per_call: int = 3) -> list[tuple[int, bytes]]:
    rows = []
    with Producer(ProducerConfig(url=url, flush_size_bytes=1)) as p:  # one batch per call
        for i in range(start, start + count):
            entries = [f"r{i}-{j}".encode() for j in range(per_call)]
            p.produce(entries, f"call{i}".encode())
            rows += [(j, e) for j, e in enumerate(entries)]
    return rows


def run_query(spark, url: str, checkpoint: str, sink: dict, **opts):
    def record(df, batch_id):  # idempotent per batch_id, as an exactly-once sink must be
        sink[batch_id] = [(r.sequence, r["index"], bytes(r.entry), bytes(r.metadata),
                           r.ingestion_time_ms) for r in df.collect()]

    reader = spark.readStream.format("headrace.queue").option("url", url).option(
        "gc_interval_s", "0")
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return (reader.load().writeStream.foreachBatch(record)
            .option("checkpointLocation", checkpoint))


def test_stop_between_micro_batches_and_restart_is_exactly_once(spark, tmp_path):
    register(spark)
    url, ckpt = str(tmp_path / "q"), str(tmp_path / "ckpt")
    produced = produce(url, 0, 4)
    sink: dict = {}
    # run 1: one queue batch per micro-batch, stopped once two micro-batches have committed
    q = run_query(spark, url, ckpt, sink, max_batches_per_trigger=1).trigger(
        processingTime="100 milliseconds").start()
    deadline = time.monotonic() + 120
    while (q.lastProgress or {}).get("batchId", -1) < 1:
        assert time.monotonic() < deadline and q.exception() is None, q.exception()
        time.sleep(0.05)
    q.stop()
    assert 2 <= len(sink) < 4
    produced += produce(url, 4, 3)
    # run 2: same checkpoint, availableNow drains the rest and ends; each queue batch read by
    # two tasks (splits_per_batch) — still each row once
    q = run_query(spark, url, ckpt, sink, splits_per_batch=2).trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert q.exception() is None
    sink = [row for rows in sink.values() for row in rows]
    got = sorted((r[0], r[1], r[2]) for r in sink)
    assert len(sink) == len(set(got)) == len(produced), "each row exactly once"
    assert sorted((r[1], r[2]) for r in sink) == sorted(produced)
    assert {r[0] for r in sink} == set(range(7))
    assert all(r[3] == f"call{r[0]}".encode() and r[4] > 0 for r in sink)
    # the source dequeued what Spark committed to it (commit(end) of a batch arrives when the
    # next one is planned, so the last micro-batch of a run stays queued until the next run)
    left = [e.sequence for e in list_entries(open_store(url), "ingest/manifest", None)]
    assert left == list(range(left[0], 7)) and 1 <= left[0] <= 3


def test_a_second_reader_fences_the_running_query(spark, tmp_path):
    register(spark)
    url, ckpt = str(tmp_path / "q"), str(tmp_path / "ckpt")
    produce(url, 0, 1)
    sink: dict = {}
    q = run_query(spark, url, ckpt, sink).trigger(processingTime="100 milliseconds").start()
    deadline = time.monotonic() + 120
    while not sink:
        assert time.monotonic() < deadline and q.exception() is None, q.exception()
        time.sleep(0.05)
    second = QueueStreamReader({"url": url, "gc_interval_s": "0"})  # what a second query does
    assert second.initialOffset()["sequence"] in (0, 1)  # its consumer bumped the epoch
    produce(url, 1, 1)
    with pytest.raises(Exception, match="Fenced|fenced"):
        q.awaitTermination(60)
    second.stop()


def test_batch_to_arrow_maps_metadata_ranges():
    from headrace.buffer.batch_format import decode_block, encode_batch

    block = decode_block(encode_batch([b"a", b"b", b"c"]), "ingest/x.batch")
    rb = batch_to_arrow(block, 9, "ingest/x.batch",
                        [(1, 5, b"m1"), (2, 6, b"m2")])
    assert rb.column("entry").to_pylist() == [b"a", b"b", b"c"]
    assert rb.column("sequence").to_pylist() == [9, 9, 9]
    assert rb.column("ingestion_time_ms").to_pylist() == [None, 5, 6]
    assert rb.column("metadata").to_pylist() == [None, b"m1", b"m2"]
    assert Fenced.__mro__[1].__name__ == "HeadraceError"


def test_a_batch_split_over_tasks_is_read_whole_once_each_entry_keeping_its_index(tmp_path):
    """splits_per_batch=k: k partitions per queue batch, whose reads together are the batch,
    each entry once and with its index in the batch (dead letters name it)."""
    url = str(tmp_path / "q")
    produce(url, 0, 1, per_call=10)
    produce(url, 1, 1, per_call=1)  # fewer entries than splits: some splits read nothing
    for k in (1, 3):
        reader = QueueStreamReader({"url": url, "gc_interval_s": "0", "splits_per_batch": k})
        parts = reader.partitions({"sequence": 0}, {"sequence": 2})
        assert len(parts) == 2 * k
        rows = [(s, i, e) for part in parts for rb in reader.read(part)
                for s, i, e in zip(rb.column("sequence").to_pylist(),
                                   rb.column("index").to_pylist(),
                                   rb.column("entry").to_pylist(), strict=True)]
        assert sorted(rows) == [(0, j, f"r0-{j}".encode()) for j in range(10)] + [(1, 0, b"r1-0")]
        assert len(rows) == 11
        if k == 3:  # the first batch's entries spread over its three splits
            sizes = [sum(len(rb) for rb in reader.read(part)) for part in parts[:3]]
            assert sizes == [3, 3, 4]
        reader.stop()
    with pytest.raises(ValueError, match="splits_per_batch"):
        QueueStreamReader({"url": url, "splits_per_batch": "0"})


def test_retain_batches_keeps_the_newest_consumed_batches_in_the_queue(tmp_path):
    """retain_batches=N: a committed micro-batch leaves its newest N queue batches in the
    queue (a pipeline part added later replays them), older ones are dequeued as before; the
    next micro-batch starts after them. Without the option every consumed batch goes."""
    for retain, left, after in ((0, [], []), (2, [3, 4], [4, 5])):
        url = str(tmp_path / f"q{retain}")
        produce(url, 0, 5, per_call=1)
        reader = QueueStreamReader({"url": url, "gc_interval_s": "0",
                                    "retain_batches": retain})
        end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
        reader.commit(end)
        assert [e.sequence for e in list_entries(open_store(url), "ingest/manifest",
                                                 None)] == left
        produce(url, 5, 1, per_call=1)
        nxt = reader.latestOffset(end, reader.getDefaultReadLimit())
        assert [p.batches[0][0] for p in reader.partitions(end, nxt)] == [5]
        reader.commit(nxt)
        assert [e.sequence for e in list_entries(open_store(url), "ingest/manifest",
                                                 None)] == after
        reader.stop()
    with pytest.raises(ValueError, match="retain_batches"):
        QueueStreamReader({"url": url, "retain_batches": "-1"})
