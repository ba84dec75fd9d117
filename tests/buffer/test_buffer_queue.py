"""The CAS queue and the consumer's fencing, on the local store and on S3 (moto)."""

from __future__ import annotations

import pytest

from headrace.buffer import Consumer, ConsumerConfig, Fenced, QueueConsumer, QueueProducer
from headrace.buffer.manifest_format import U64_MAX, decode_manifest, encode_footer
from headrace.buffer.types import Metadata
from headrace.errors import FormatError, InvalidInput
from headrace.store import FaultyStore, MemoryStore, open_store

M = "ingest/manifest"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(request.getfixturevalue("s3_url"))


def test_enqueue_peek_read_after_dequeue(store):
    qp = QueueProducer(store, M)
    assert [qp.enqueue(f"ingest/{i}.batch", [Metadata(0, i, b"m")]) for i in range(4)] == [0, 1,
                                                                                             2, 3]
    qc = QueueConsumer(store, M)
    assert qc.initialize() == 1
    assert qc.peek().location == "ingest/0.batch"
    assert qc.read_after(1).sequence == 2 and qc.read_after(3) is None
    assert qc.dequeue(1) == 2
    assert [e.sequence for e in qc.snapshot().entries] == [2, 3]
    assert qp.enqueue("ingest/4.batch", []) == 4  # sequences keep counting after a dequeue
    with pytest.raises(InvalidInput):
        qc.dequeue(5)
    assert qc.counters.as_dict("consumer")["consumer_manifest_writes"] == 2


def test_second_consumer_fences_the_first(store):
    QueueProducer(store, M).enqueue("ingest/a.batch", [])
    a = Consumer(ConsumerConfig(store=store, gc_interval_s=0))
    a.initialize()
    b = Consumer(ConsumerConfig(store=store, gc_interval_s=0))
    b.initialize()
    assert b.epoch == a.epoch + 1
    for call in (a.next_batch, lambda: a.ack(0), lambda: a.ack_through(0), a.flush,
                 a.pending_entries, lambda: a.initialize and a._queue.dequeue(0)):
        with pytest.raises(Fenced):
            call()
    a.close()  # a fenced consumer still closes
    assert b.pending_entries()[0].location == "ingest/a.batch"


def test_epoch_wraps_past_u64_max():
    store = MemoryStore("wrap")
    store.put(M, encode_footer(0, 7, U64_MAX))
    qc = QueueConsumer(store, M)
    assert qc.initialize() == 0
    assert decode_manifest(store.get(M).data).next_sequence == 7


def test_lost_replies_never_duplicate_an_entry():
    faulty = FaultyStore(MemoryStore("lost"), seed=3)
    faulty.set_faults(lost_reply_rate=0.5, fail_rate=0.2, keys=lambda k: k == M)
    qp = QueueProducer(faulty, M)
    sequences = [qp.enqueue(f"ingest/{i}.batch", []) for i in range(40)]
    assert faulty.injected["lost_reply"] > 5 and faulty.injected["fail"] > 5
    entries = decode_manifest(faulty.inner.get(M).data).entries
    assert [e.location for e in entries] == [f"ingest/{i}.batch" for i in range(40)]
    assert sequences == list(range(40))


def test_corrupt_manifest_is_a_format_error_naming_the_key():
    faulty = FaultyStore(MemoryStore("corrupt-m"), seed=1)
    QueueProducer(faulty, M).enqueue("ingest/a.batch", [Metadata(0, 1, b"x" * 20)])
    faulty.set_faults(corrupt_get="truncate")
    with pytest.raises(FormatError) as ei:
        QueueConsumer(faulty, M).initialize()
    assert ei.value.key == M
