"""Producer and consumer end to end: durability, metadata ranges, flush triggers, backpressure,
failed flushes, acks, resume, GC — on the local store and on S3 (moto)."""

from __future__ import annotations

import time

import pytest

from headrace.buffer import (
    Consumer,
    ConsumerConfig,
    GarbageCollector,
    Metadata,
    OutOfOrderAck,
    Producer,
    ProducerConfig,
    read_entries,
)
from headrace.buffer.manifest_format import read_footer
from headrace.codec import ManualClock, new_ulid
from headrace.errors import FormatError, InvalidInput
from headrace.retry import RetryPolicy
from headrace.store import FaultyStore, MemoryStore, open_store

M = "ingest/manifest"


@pytest.fixture(params=["local", "s3"])
def url(request, tmp_path):
    return str(tmp_path / "q") if request.param == "local" else request.getfixturevalue("s3_url")


def consumer_for(store_or_url, **kw) -> Consumer:
    key = "url" if isinstance(store_or_url, str) else "store"
    c = Consumer(ConsumerConfig(**{key: store_or_url}, gc_interval_s=0, **kw))
    c.initialize()
    return c


def test_produce_then_consume_with_metadata_ranges(url):
    with Producer(ProducerConfig(url=url, flush_interval_s=60)) as p:
        h1 = p.produce([b"a", b"b"], b"first")
        h2 = p.produce([b"c"], b"second")
        assert h1.watcher.result() is None  # nothing flushed yet
        p.flush()
        assert h1.watcher.result() is True and h2.watcher.sequence == h1.watcher.sequence == 0
        h3 = p.produce([b"d", b"e", b"f"])
    h3.watcher.await_durable(1)  # close() flushed it
    c = consumer_for(url)
    b0, b1 = c.next_batch(), c.next_batch()
    assert c.next_batch() is None
    assert b0.entries == [b"a", b"b", b"c"] and b1.entries == [b"d", b"e", b"f"]
    assert [(m.start_index, m.payload) for m in b0.metadata] == [(0, b"first"), (2, b"second")]
    assert b1.sequence == 1 and b1.location == h3.watcher.location
    c.ack(0)
    c.ack(1)
    c.flush()
    assert c.metrics()["records_consumed"] == 6
    assert "headrace_buffer_consumer_records_consumed 6\n" in c.prometheus()
    c.close()
    assert read_entries(open_store(url), M, None, 10) == []


def test_flush_on_size_and_on_timer():
    store = MemoryStore("flush-triggers")
    with Producer(ProducerConfig(store=store, flush_interval_s=60, flush_size_bytes=100)) as p:
        handles = [p.produce([b"x" * 30]) for _ in range(10)]  # 34 bytes each: flush every 3
        handles[8].watcher.await_durable(5)
        assert handles[9].watcher.result() is None
    with Producer(ProducerConfig(store=store, flush_interval_s=0.05)) as p:
        t0 = time.monotonic()
        p.produce([b"timer"]).watcher.await_durable(5)
        assert time.monotonic() - t0 < 2
        assert p.metrics()["batches_flushed"] == 1
        assert "headrace_buffer_producer_batches_flushed 1\n" in p.prometheus()
    batches = read_entries(store, M, None)
    assert [len(b.entries) for b in batches] == [3, 3, 3, 1, 1]


def test_flush_size_is_exceeded_not_reached():
    """RFC 0001: a batch flushes when its size *exceeds* flush_size_bytes, not at exactly it."""
    store = MemoryStore("flush-exceeds")
    with Producer(ProducerConfig(store=store, flush_interval_s=60, flush_size_bytes=100)) as p:
        p.produce([b"a" * 96])  # 96 + 4-byte length prefix = exactly 100: stays open
        joined = p.produce([b"b" * 97])  # 201 > 100: both go out together
        joined.watcher.await_durable(5)
        alone = p.produce([b"c" * 97])  # 101 > 100: flushed on its own, no timer, no close
        alone.watcher.await_durable(5)
        assert p.metrics()["batches_flushed"] == 2
    assert [[len(e) for e in b.entries] for b in read_entries(store, M, None)] == \
        [[96, 97], [97]]


def test_backpressure_blocks_produce():
    slow = FaultyStore(MemoryStore("slow"), latency_s=0.1)
    with Producer(ProducerConfig(store=slow, max_buffered_inputs=1, flush_size_bytes=1)) as p:
        t0 = time.monotonic()
        for _ in range(5):
            p.produce([b"x"])
        blocked = time.monotonic() - t0
    assert blocked > 0.3  # each flush is a put + get + put at 0.1 s; the inbox holds one input


def test_failed_flush_fails_every_handle_and_nothing_is_enqueued():
    faulty = FaultyStore(MemoryStore("fail"), seed=0)
    cfg = ProducerConfig(store=faulty, flush_interval_s=60,
                         retry=RetryPolicy(max_attempts=2, base_delay_s=0.001))
    with Producer(cfg) as p:
        faulty.set_faults(fail_rate=1.0, verbs={"put"})
        hs = [p.produce([b"lost"]), p.produce([b"also lost"])]
        p.flush()
        for h in hs:
            with pytest.raises(Exception, match="failed after 2 attempts"):
                h.watcher.result()
        faulty.clear()
        p.produce([b"kept"]).watcher.result()
        p.flush()
        assert p.metrics()["failed_flushes"] == 1
    assert [b.entries for b in read_entries(faulty.inner, M, None)] == [[b"kept"]]


def test_input_and_config_validation():
    store = MemoryStore("validation")
    with Producer(ProducerConfig(store=store)) as p:
        with pytest.raises(InvalidInput):
            p.produce([])
        with pytest.raises(InvalidInput):
            p.produce([1, 2])
    for bad, field in [(dict(flush_interval_s=0), "flush_interval_s"),
                       (dict(max_buffered_inputs=0), "max_buffered_inputs"),
                       (dict(batch_compression="lz4"), "batch_compression"),
                       (dict(manifest_path="../x"), "manifest_path")]:
        with pytest.raises(ValueError, match=field):
            ProducerConfig(store=store, **bad)
    with pytest.raises(ValueError, match="url"):
        ConsumerConfig()
    assert ConsumerConfig(url="memory://defaults").manifest_path == M


def test_acks_in_order_dequeue_batching_and_resume():
    store = MemoryStore("acks")
    with Producer(ProducerConfig(store=store, flush_size_bytes=1,
                                 batch_compression="zstd")) as p:
        for i in range(8):
            p.produce([f"e{i}".encode()])
    c = Consumer(ConsumerConfig(store=store, gc_interval_s=0, acks_per_dequeue=3))
    c.initialize()
    batches = [c.next_batch() for _ in range(4)]  # read-ahead beyond acks is allowed
    with pytest.raises(OutOfOrderAck):
        c.ack(1)
    c.ack(0)
    c.ack(1)
    assert read_footer(store.get(M).data).entry_count == 8  # not dequeued yet
    c.ack(2)
    assert read_footer(store.get(M).data).entry_count == 5  # third ack dequeued 0..2
    with pytest.raises(OutOfOrderAck, match="no entry 99"):
        c.ack_through(99)
    c.ack_through(3)
    c.ack_through(2)  # already acked: no-op
    assert [b.entries for b in batches][3] == [b"e3"]
    # a new consumer resuming after 5 reads 6 next, though 4 and 5 are still queued
    c2 = Consumer(ConsumerConfig(store=store, gc_interval_s=0))
    c2.initialize(last_acked_sequence=5)
    assert c2.next_batch().sequence == 6
    with pytest.raises(OutOfOrderAck):
        c2.ack(5)
    c2.ack(6)
    c2.close()
    assert read_footer(store.get(M).data).entry_count == 1  # close() dequeued through 6


def test_initialize_past_the_end_is_refused_and_close_still_succeeds(url):
    with Producer(ProducerConfig(url=url, flush_size_bytes=1)) as p:
        for i in range(5):
            p.produce([f"e{i}".encode()])
    store = open_store(url)
    epoch = read_footer(store.get(M).data).epoch
    c = Consumer(ConsumerConfig(url=url, gc_interval_s=0))
    # sequences 0..4 exist: 10 (or 5) was never assigned, so resuming there would skip 5..10
    with pytest.raises(InvalidInput, match=r"10 was never assigned .*below 5"):
        c.initialize(last_acked_sequence=10)
    with pytest.raises(InvalidInput, match=r"5 was never assigned"):
        c.initialize(last_acked_sequence=5)
    assert read_footer(store.get(M).data).epoch == epoch  # refused before fencing anyone
    c.close()  # nothing was read or acked: closing succeeds and dequeues nothing
    assert read_footer(store.get(M).data).entry_count == 5
    # resuming at the last assigned sequence is fine; close() acks nothing more
    c2 = Consumer(ConsumerConfig(url=url, gc_interval_s=0))
    c2.initialize(last_acked_sequence=4)
    assert c2.next_batch() is None
    c2.close()
    assert read_entries(store, M, None) == []  # close dequeued the resumed-past 0..4


def test_corrupt_batch_file_is_a_format_error():
    faulty = FaultyStore(MemoryStore("corrupt-b"), seed=2)
    with Producer(ProducerConfig(store=faulty)) as p:
        p.produce([b"payload" * 10])
    faulty.set_faults(corrupt_get="truncate", corrupt_keys=lambda k: k.endswith(".batch"))
    c = consumer_for(faulty)
    with pytest.raises(FormatError) as ei:
        c.next_batch()
    assert ei.value.key.endswith(".batch")


def test_gc_deletes_only_unreferenced_old_batch_files(url):
    clock = ManualClock(start_ms=1_800_000_000_000)
    store = open_store(url)
    old_orphan = f"ingest/{new_ulid(clock)}.batch"
    clock.advance(60)
    with Producer(ProducerConfig(store=store), clock=clock) as p:
        p.produce([b"live"])
    clock.advance(60)
    young_orphan = f"ingest/{new_ulid(clock)}.batch"
    for key in (old_orphan, young_orphan, "ingest/notes.txt", "ingest/sub/x.batch"):
        store.put(key, b"x")
    clock.advance(700)
    gc = GarbageCollector(store, grace_period_s=600, clock=clock)
    result = gc.run_once()
    # young_orphan is older than the grace period but younger than the oldest entry: kept
    assert result.deleted == [old_orphan] and result.kept == 2
    assert not store.exists(old_orphan) and store.exists(young_orphan)
    # once the queue is drained, everything past the grace period goes
    c = consumer_for(store)
    c.ack_through(c.next_batch().sequence)
    c.flush()
    remaining = sorted(k.key for k in store.list("ingest/")
                       if k.key.endswith(".batch") and "/sub/" not in k.key)
    assert len(remaining) == 2 and sorted(gc.run_once().deleted) == remaining
    assert store.exists("ingest/notes.txt") and store.exists("ingest/sub/x.batch")
    assert gc.metrics()["gc_deleted"] == 3


def test_read_entries_never_bumps_the_epoch():
    store = MemoryStore("readonly")
    with Producer(ProducerConfig(store=store)) as p:
        p.produce([b"a"])
        p.flush()
        p.produce([b"b"])
    before = store.get(M).data
    out = read_entries(store, M, after_sequence=0, max_batches=5)
    assert [b.entries for b in out] == [[b"b"]] and store.get(M).data == before
    assert out[0].metadata[0] == Metadata(0, out[0].metadata[0].ingestion_time_ms, b"")
