"""Issue 15, items 6 and 7: a producer stalled past the GC grace never reports a collected batch
durable; a missing batch is a typed, skippable (and recorded) error; queue locations outside the
queue are refused at enqueue and by every reader. Interleavings are forced with HookStore."""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner
from hookstore import HookStore

from headrace.buffer import (
    Consumer,
    ConsumerConfig,
    GarbageCollector,
    InvalidLocation,
    MissingBatch,
    Producer,
    ProducerConfig,
    QueueProducer,
    read_entries,
    read_manifest,
    read_skips,
    skip_batch,
)
from headrace.buffer import manifest_format as mf
from headrace.buffer.batch_format import encode_batch
from headrace.buffer.skips import MAX_SKIP_LOG_BYTES, skip_log_path
from headrace.buffer.types import Metadata
from headrace.cli.main import cli
from headrace.codec import ManualClock, new_ulid
from headrace.errors import FormatError, InvalidInput, NotFound
from headrace.store import MemoryStore, open_store

M = "ingest/manifest"


@pytest.fixture(params=["local", "s3"])
def url(request, tmp_path):
    return str(tmp_path / "q") if request.param == "local" else request.getfixturevalue("s3_url")


def consumer_for(store) -> Consumer:
    c = Consumer(ConsumerConfig(store=store, gc_interval_s=0))
    c.initialize()
    return c


# -- item 6: producer stalled past the GC grace -------------------------------------------------

def test_producer_stalled_past_gc_grace_reuploads_before_appending(url):
    clock = ManualClock(start_ms=1_800_000_000_000)
    inner = open_store(url)
    gc = GarbageCollector(inner, grace_period_s=600, clock=clock)
    collected: list[str] = []

    def after(verb: str, key: str) -> None:
        # between the batch upload and the manifest append: the producer stalls past the
        # grace period and the collector deletes the (still unreferenced) file
        if verb == "put" and key.endswith(".batch") and not collected:
            clock.advance(601)
            collected.extend(gc.run_once().deleted)

    store = HookStore(inner, after=after)
    with Producer(ProducerConfig(store=store, flush_interval_s=60), clock=clock) as p:
        h = p.produce([b"a", b"b"], b"meta")
        p.flush()
        h.watcher.await_durable(5)
        reuploads = p.metrics()["batches_reuploaded"]
    assert len(collected) == 1 and not inner.exists(collected[0])  # the race really happened
    c = consumer_for(inner)
    batch = c.next_batch()
    assert batch.entries == [b"a", b"b"] and batch.metadata[0].payload == b"meta"
    assert (batch.sequence, batch.location) == (h.watcher.sequence, h.watcher.location)
    assert batch.location != collected[0]  # appended under a fresh name, not the collected one
    assert c.next_batch() is None and reuploads == 1
    assert [e.location for e in read_manifest(inner, M).entries] == [h.watcher.location]


def test_batch_collected_while_its_append_is_in_flight_is_put_back_before_durable(url):
    clock = ManualClock(start_ms=1_800_000_000_000)
    inner = open_store(url)
    # a collector whose clock runs an hour ahead: the producer's own age check cannot see it
    gc = GarbageCollector(inner, grace_period_s=600,
                          clock=ManualClock(start_ms=clock.now_ms() + 3_600_000))
    collected: list[str] = []

    def before(verb: str, key: str) -> None:
        if verb == "put" and key == M and not collected:  # right before the manifest append
            collected.extend(gc.run_once().deleted)

    with Producer(ProducerConfig(store=HookStore(inner, before=before)), clock=clock) as p:
        h = p.produce([b"late"])
        h.watcher.await_durable(5)
        reuploads = p.metrics()["batches_reuploaded"]
    assert len(collected) == 1 and collected[0] == h.watcher.location
    batch = consumer_for(inner).next_batch()
    assert batch.entries == [b"late"] and batch.location == collected[0]
    assert reuploads == 1


def test_gc_spares_a_file_enqueued_while_it_was_listing():
    clock = ManualClock(start_ms=1_800_000_000_000)
    inner = MemoryStore("gc-recheck")
    location = f"ingest/{new_ulid(clock)}.batch"
    inner.put(location, encode_batch([b"x"]))
    clock.advance(700)

    def after(verb: str, key: str) -> None:
        if verb == "list":  # a late append lands between the manifest read and the delete
            QueueProducer(inner, M).enqueue(location, [])

    result = GarbageCollector(HookStore(inner, after=after), grace_period_s=600,
                              clock=clock).run_once()
    assert result.deleted == [] and inner.exists(location)
    assert consumer_for(inner).next_batch().entries == [b"x"]


def _three_batches(store) -> list[str]:
    with Producer(ProducerConfig(store=store, flush_size_bytes=1)) as p:
        handles = [p.produce([f"e{i}".encode()]) for i in range(3)]
    return [h.watcher.location for h in handles]


def test_missing_batch_is_a_typed_error_and_skip_is_recorded(url):
    store = open_store(url)
    locations = _three_batches(store)
    store.delete(locations[1])
    c = consumer_for(store)
    assert c.next_batch().entries == [b"e0"]
    for _ in range(2):  # it stays at the missing batch: nothing is skipped silently
        with pytest.raises(MissingBatch) as ei:
            c.next_batch()
        err = ei.value
        assert isinstance(err, NotFound) and isinstance(err, FileNotFoundError)
        assert (err.sequence, err.location, err.manifest_path) == (1, locations[1], M)
        assert "sequence 1" in str(err) and locations[1] in str(err)
        assert "headrace queue skip" in str(err)
    with pytest.raises(InvalidInput, match="reads fine"):
        skip_batch(store, M, 2, reason="not broken")  # a readable batch is never skipped
    with pytest.raises(InvalidInput, match="not in the queue"):
        skip_batch(store, M, 7, reason="no such entry")
    with pytest.raises(InvalidInput, match="reason"):
        skip_batch(store, M, 1, reason=" ")
    record = skip_batch(store, M, 1, reason="batch lost in incident 42")
    assert (record.sequence, record.location, record.cause) == (1, locations[1], "missing")
    assert skip_batch(store, M, 1, reason="again") == record  # idempotent, recorded once
    assert list(read_skips(store, M).values()) == [record]
    doc = json.loads(store.get(skip_log_path(M)).data)  # auditable: a plain JSON object
    assert doc["skips"][0]["reason"] == "batch lost in incident 42"
    assert doc["skips"][0]["actor"] and doc["skips"][0]["skipped_at_ms"] > 0
    skipped = c.next_batch()
    assert skipped.sequence == 1 and skipped.entries == [] and skipped.skipped == record
    c.ack(0)
    c.ack(1)
    assert c.next_batch().entries == [b"e2"]
    assert [b.entries for b in read_entries(store, M, None)] == [[b"e0"], [], [b"e2"]]


def test_skip_log_bytes_are_bounded_and_validated():
    store = MemoryStore("skip-log")
    locations = _three_batches(store)
    store.delete(locations[0])
    key = skip_log_path(M)
    bad = {
        "nested": b"[" * 100_000 + b"]" * 100_000,
        "not json": b"\xff\x00",
        "wrong type": json.dumps({"version": 1, "skips": [{"sequence": "one"}]}).encode(),
        "version": json.dumps({"version": 9, "skips": []}).encode(),
        "oversized": b" " * (MAX_SKIP_LOG_BYTES + 1),
    }
    for what, data in bad.items():
        store.put(key, data)
        with pytest.raises(FormatError) as ei:
            read_skips(store, M)
        assert ei.value.key == key, what
        with pytest.raises(FormatError):  # a consumer meeting the missing batch says so too
            consumer_for(store).next_batch()


def test_cli_queue_skip_and_verify(tmp_path):
    url = str(tmp_path / "q")
    store = open_store(url)
    locations = _three_batches(store)
    store.delete(locations[1])
    runner = CliRunner()
    res = runner.invoke(cli, ["queue", "verify", url])
    # exit 2: something named is missing (one line, with the hint of MissingBatch)
    assert res.exit_code == 2 and "sequence 1" in res.output and locations[1] in res.output
    assert "queue skip" in res.output and "restore the batch file" in res.output
    res = runner.invoke(cli, ["queue", "skip", url, "2", "--reason", "x"])
    assert res.exit_code == 1 and "reads fine" in res.output
    res = runner.invoke(cli, ["queue", "skip", url, "1", "--reason", "lost in incident 42"])
    assert res.exit_code == 0, res.output
    assert "skipped sequence 1" in res.output and locations[1] in res.output
    res = runner.invoke(cli, ["queue", "verify", url])
    assert res.exit_code == 0 and "1 skipped" in res.output, res.output
    doc = json.loads(runner.invoke(cli, ["queue", "inspect", url, "--json"]).output)
    assert doc["skipped"] == [{**doc["skipped"][0], "sequence": 1, "location": locations[1],
                               "cause": "missing", "reason": "lost in incident 42"}]


# -- item 7: queue locations -------------------------------------------------------------------

@pytest.mark.parametrize("location", [
    "../../etc/passwd", "/etc/passwd", "ingest/../../etc/passwd", "other/x.batch",
    "ingestx/a.batch", "ingest", "ingest/", "ingest/\ud800.batch", "ingest/a\x00.batch", "",
])
def test_enqueue_refuses_locations_outside_the_queue(location):
    store = MemoryStore("enqueue-refusal")
    with pytest.raises(InvalidInput) as ei:
        QueueProducer(store, M).enqueue(location, [])
    assert f"location {location!r}" in str(ei.value)
    assert not store.exists(M)  # nothing was written


def test_producer_refuses_a_prefix_it_cannot_enqueue_under():
    with pytest.raises(InvalidInput, match="data_path_prefix"):
        ProducerConfig(store=MemoryStore("p"), data_path_prefix="/abs")


def _manifest_with(locations: list[str]) -> bytes:
    body = b"".join(mf.encode_entry(i, loc, [Metadata(0, 1, b"")])
                    for i, loc in enumerate(locations))
    return body + mf.encode_footer(len(locations), len(locations), 0)


def test_readers_refuse_bad_locations_already_in_the_manifest():
    store = MemoryStore("poisoned")
    good = [f"ingest/{new_ulid()}.batch" for _ in range(2)]
    for loc in good:
        store.put(loc, encode_batch([loc.encode()]))
    store.put("other/x.batch", encode_batch([b"someone else's data"]))
    store.put(M, _manifest_with([good[0], "../../etc/passwd", "other/x.batch", good[1]]))
    # the manifest still decodes: inspecting it or collecting garbage is not poisoned
    assert [e.location for e in read_manifest(store, M).entries][1] == "../../etc/passwd"
    GarbageCollector(store, grace_period_s=0).run_once()
    c = consumer_for(store)
    assert c.next_batch().entries == [good[0].encode()]
    with pytest.raises(InvalidLocation) as ei:
        c.next_batch()
    assert (ei.value.sequence, ei.value.location) == (1, "../../etc/passwd")
    assert "sequence 1" in str(ei.value) and isinstance(ei.value, InvalidInput)
    with pytest.raises(InvalidLocation):
        read_entries(store, M, 0)
    assert skip_batch(store, M, 1, reason="hostile entry").cause == "invalid_location"
    assert c.next_batch().skipped is not None
    with pytest.raises(InvalidLocation) as ei:  # a valid key, but outside the queue's prefix
        c.next_batch()
    assert (ei.value.sequence, ei.value.location) == (2, "other/x.batch")
    skip_batch(store, M, 2, reason="not ours")
    assert c.next_batch().entries == []
    assert c.next_batch().entries == [good[1].encode()]


# -- config errors and bounds ------------------------------------------------------------------

@pytest.mark.parametrize("cls,bad,field", [
    (ProducerConfig, dict(flush_interval_s="fast"), "flush_interval_s"),
    (ProducerConfig, dict(flush_interval_s=float("nan")), "flush_interval_s"),
    (ProducerConfig, dict(max_buffered_inputs=1.5), "max_buffered_inputs"),
    (ProducerConfig, dict(max_buffered_inputs=True), "max_buffered_inputs"),
    (ProducerConfig, dict(flush_size_bytes=0), "flush_size_bytes"),
    (ProducerConfig, dict(batch_compression=["zstd"]), "batch_compression"),
    (ProducerConfig, dict(manifest_path="/abs/manifest"), "manifest_path"),
    (ProducerConfig, dict(data_path_prefix="../up"), "data_path_prefix"),
    (ProducerConfig, dict(retry="twice"), "retry"),
    (ProducerConfig, dict(gc_grace_period_s=0), "gc_grace_period_s"),
    (ConsumerConfig, dict(acks_per_dequeue=0), "acks_per_dequeue"),
    (ConsumerConfig, dict(max_batch_bytes="big"), "max_batch_bytes"),
    (ConsumerConfig, dict(gc_interval_s=-1), "gc_interval_s"),
    (ConsumerConfig, dict(gc_grace_period_s=None), "gc_grace_period_s"),
    (ConsumerConfig, dict(cas_retry=3), "cas_retry"),
])
def test_config_errors_are_invalid_input_naming_the_field(cls, bad, field):
    with pytest.raises(InvalidInput, match=field):
        cls(store=MemoryStore("cfg"), **bad)


def test_other_argument_errors_are_invalid_input():
    store = MemoryStore("args")
    with pytest.raises(InvalidInput, match="url"):
        ConsumerConfig(url="")
    with pytest.raises(InvalidInput, match="store"):
        ProducerConfig(store="memory://x")
    with pytest.raises(InvalidInput, match="grace_period_s"):
        GarbageCollector(store, grace_period_s=-1)
    with pytest.raises(InvalidInput, match="interval_s"):
        GarbageCollector(store, interval_s="soon")
    c = Consumer(ConsumerConfig(store=store, gc_interval_s=0))
    with pytest.raises(InvalidInput, match="last_acked_sequence"):
        c.initialize(last_acked_sequence=-5)
    c.initialize()
    for call in (lambda: c.ack("0"), lambda: c.ack_through(1.5),
                 lambda: read_entries(store, M, after_sequence="0")):
        with pytest.raises(InvalidInput, match="sequence"):
            call()


def test_manifest_counts_are_bounded_before_allocation():
    # entry_count 2**32-1 in a 22-byte manifest; a payload_len past its entry
    with pytest.raises(FormatError, match="entry_count"):
        mf.decode_manifest(mf.encode_footer(0xFFFFFFFF, 1, 0), "m")
    body = struct.pack("<QH", 0, 1) + b"a" + struct.pack("<IIqI", 1, 0, 0, 0xFFFFFFFF)
    data = struct.pack("<I", len(body)) + body + mf.encode_footer(1, 1, 0)
    with pytest.raises(FormatError, match="payload_len"):
        mf.decode_manifest(data, "m")
    with pytest.raises(FormatError, match="entry_len"):
        mf.entry_after(struct.pack("<IQH", 0xFFFFFFFF, 0, 0) + mf.encode_footer(1, 1, 0), -1)
