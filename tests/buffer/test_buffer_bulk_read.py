"""The consumer's bulk read: a batch's records in place (``ConsumedBatch.records``), and the
read-ahead that reads the next batch while the caller works on this one."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import test_buffer_formats
from hookstore import HookStore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.buffer import (
    Consumer,
    ConsumerConfig,
    Fenced,
    InvalidLocation,
    MissingBatch,
    Producer,
    ProducerConfig,
    read_entries,
)
from headrace.buffer import manifest_format as mf
from headrace.buffer.batch_format import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    DecodedBlock,
    decode_block,
    encode_batch,
)
from headrace.buffer.types import Metadata
from headrace.errors import FormatError, InvalidInput, StoreError
from headrace.store import MemoryStore

M = "ingest/manifest"
COMPRESSIONS = [COMPRESSION_NONE, COMPRESSION_ZSTD]


# -- DecodedBlock: records in place ------------------------------------------------------------

@pytest.mark.parametrize("comp", COMPRESSIONS)
def test_equal_length_records_read_in_place(comp):
    entries = [b"ab\x00", b"\x00\x00\x00", b"xyz", b"q\x00r"]  # trailing zeros are data
    block = decode_block(encode_batch(entries, comp), key="k")
    assert block.width == 3 and len(block) == 4 and block.nbytes == 12
    assert block.entries() == entries == list(block) == block
    assert [block[i] for i in range(4)] == entries and block[-1] == b"q\x00r"
    assert block[1:3] == entries[1:3] and block[::-2] == entries[::-2]
    view = block.view(2)
    assert view.readonly and bytes(view) == b"xyz" and view.obj is block.block  # no copy
    rows = block.fixed_width()
    assert rows.shape == (4, 3) and not rows.flags.writeable
    assert [r.tobytes() for r in rows] == entries
    assert np.shares_memory(rows, np.frombuffer(block.block, dtype=np.uint8))
    with pytest.raises(IndexError):
        block[4]
    with pytest.raises(IndexError):
        block.view(-5)


@pytest.mark.parametrize("comp", COMPRESSIONS)
def test_records_of_different_lengths_read_in_place(comp):
    entries = [b"a", b"", b"bcd", b"\x00\x00"]
    block = decode_block(encode_batch(entries, comp))
    assert block.width is None and block.fixed_width() is None
    assert block.entries() == entries == block and block.nbytes == 6
    assert [bytes(block.view(i)) for i in range(4)] == entries


def test_empty_and_zero_width_blocks():
    assert DecodedBlock.empty("k") == [] and len(DecodedBlock.empty()) == 0
    assert DecodedBlock.empty().fixed_width() is None and DecodedBlock.empty().nbytes == 0
    zero = decode_block(encode_batch([b"", b"", b""]))
    assert zero.entries() == [b"", b"", b""] and zero.fixed_width().shape == (3, 0)
    assert decode_block(encode_batch([b"a"])) != [b"b"]
    assert decode_block(encode_batch([b"a"])) != b"a"  # a sequence of records, not bytes


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.lists(st.binary(max_size=40), max_size=20),
                 st.integers(0, 9).flatmap(lambda w: st.lists(st.binary(min_size=w, max_size=w),
                                                              max_size=20))),
       st.sampled_from(COMPRESSIONS))
def test_every_way_of_reading_records_agrees(entries, comp):
    block = decode_block(encode_batch(entries, comp))
    assert block.entries() == entries == list(block) == [block[i] for i in range(len(block))]
    assert [bytes(block.view(i)) for i in range(len(block))] == entries
    assert block.entry_array().to_pylist() == entries
    assert block.nbytes == sum(map(len, entries))
    rows = block.fixed_width()
    if len(entries) and len(set(map(len, entries))) == 1:
        assert [r.tobytes() for r in rows] == entries
    else:
        assert rows is None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(test_buffer_formats.manifests(), st.one_of(st.just([]), test_buffer_formats.ops_st),
       st.integers(-1, 2**41))
def test_location_after_agrees_with_entry_after_or_raises_format_error(m, ops, after):
    """The read-ahead finds the next batch without decoding its metadata; on any bytes it
    names what the full decode names, or refuses them as the decode would (FormatError)."""
    data = test_buffer_formats._mutate(mf.encode_manifest(m), ops) if ops else \
        mf.encode_manifest(m)
    try:
        entry = mf.entry_after(data, after, key="m")
    except FormatError:
        entry = "refused"
    try:
        where = mf.location_after(data, after, key="m")
    except FormatError:
        assert entry == "refused"
        return
    if entry != "refused":
        assert where == (None if entry is None else (entry.sequence, entry.location))


@pytest.mark.parametrize("payloads", [[b""] * 300, [b"abc"] * 300,
                                      [b"abc"] * 150 + [b"ab"] + [b"abc"] * 149])
def test_many_metadata_items_decode_exactly(payloads):
    items = tuple(Metadata(i * 7, -(2**63) + i, pl) for i, pl in enumerate(payloads))
    data = mf.encode_entry(5, "ingest/x.batch", items) + mf.encode_footer(1, 6, 0)
    assert mf.decode_manifest(data).entries[0].metadata == items
    assert mf.entry_after(data, 4).metadata == items
    bad = bytearray(data)
    bad[4 + 8 + 2 + 14 + 4 + 3 * (16 + len(payloads[0])) + 12] ^= 1  # item 3's payload_len
    with pytest.raises(FormatError, match="metadata|entry_len"):
        mf.decode_manifest(bytes(bad), key="m")


# -- ConsumedBatch ----------------------------------------------------------------------------

def _queue(store, batches: list[list[bytes]]) -> None:
    with Producer(ProducerConfig(store=store, flush_interval_s=60)) as p:
        for entries in batches:
            p.produce(entries, b"m")
            p.flush()


def _consumer(store, **kw) -> Consumer:
    c = Consumer(ConsumerConfig(store=store, gc_interval_s=0, **kw))
    c.initialize()
    return c


@pytest.mark.parametrize("read_ahead", [False, True])
def test_consumed_batches_hold_records_in_place_and_as_a_list(read_ahead):
    store = MemoryStore("bulk")
    batches = [[b"a" * 8, b"b" * 8], [b"c", b"dd", b"eee"], [b"f" * 1000]]
    _queue(store, batches)
    c = _consumer(store, read_ahead=read_ahead)
    got = []
    while (b := c.next_batch()) is not None:
        assert b.records == b.entries and b.entries is b.entries  # built once
        got.append(list(b.records))
        c.ack(b.sequence)
    assert got == batches
    m = c.metrics()
    assert (m["records_consumed"], m["bytes_consumed"]) == (6, 16 + 6 + 1000)
    c.close()


# -- read-ahead -------------------------------------------------------------------------------

def _counting(store) -> tuple[HookStore, dict[str, int], threading.Condition]:
    """A store that counts batch GETs; the condition is notified after each one."""
    gets: dict[str, int] = {}
    done = threading.Condition()

    def before(verb: str, key: str) -> None:
        if verb == "get" and key.endswith(".batch"):
            with done:
                gets[key] = gets.get(key, 0) + 1

    def after(verb: str, key: str) -> None:
        with done:
            done.notify_all()

    return HookStore(store, before=before, after=after), gets, done


def test_read_ahead_reads_each_batch_once_and_delivers_the_same_batches():
    inner = MemoryStore("ahead")
    batches = [[f"{i}-{j}".encode() for j in range(i + 1)] for i in range(6)]
    _queue(inner, batches)
    assert [b.entries for b in read_entries(inner, M, None)] == batches
    locations = [e.location for e in mf.decode_manifest(inner.get(M).data).entries]
    store, gets, done = _counting(inner)
    c = _consumer(store, read_ahead=True)
    got = []
    while (b := c.next_batch()) is not None:
        got.append(b.entries)
        if b.sequence + 1 < len(locations):  # the next batch is read before it is asked for
            with done:
                assert done.wait_for(lambda: locations[b.sequence + 1] in gets, timeout=30)
        c.ack(b.sequence)
    c.close()
    assert got == batches
    assert sorted(gets.values()) == [1] * 6  # every batch fetched exactly once
    assert not any(t.name.startswith("headrace-buffer-ahead") and t.is_alive()
                   for t in threading.enumerate())  # close() stopped the reader


def test_a_failed_read_ahead_leaves_the_typed_error_and_the_cursor_as_without_it():
    store = MemoryStore("missing")
    _queue(store, [[b"zero"], [b"one"], [b"two"]])
    loc1 = mf.decode_manifest(store.get(M).data).entries[1].location
    data1 = store.get(loc1).data
    store.delete(loc1)
    c = _consumer(store, read_ahead=True)
    assert c.next_batch().entries == [b"zero"]  # starts reading sequence 1 in the background
    for _ in range(2):  # the cursor stays at the missing batch
        with pytest.raises(MissingBatch) as ei:
            c.next_batch()
        assert (ei.value.sequence, ei.value.location) == (1, loc1)
    store.put(loc1, data1)
    assert c.next_batch().entries == [b"one"]
    assert c.next_batch().entries == [b"two"]
    c.close()


def test_a_transient_read_ahead_failure_is_retried_by_the_plain_read():
    inner = MemoryStore("flaky")
    _queue(inner, [[b"zero"], [b"one"]])
    loc1 = mf.decode_manifest(inner.get(M).data).entries[1].location
    failed = []

    def before(verb: str, key: str) -> None:
        if verb == "get" and key == loc1 and not failed:
            failed.append(key)
            raise StoreError("503 slow down", key=key, retryable=True)

    c = _consumer(HookStore(inner, before=before), read_ahead=True)
    assert c.next_batch().entries == [b"zero"]
    assert c.next_batch().entries == [b"one"] and failed == [loc1]
    c.close()


def test_read_ahead_refuses_a_bad_location_before_reading_it():
    inner = MemoryStore("poisoned")
    good = "ingest/01AAAAAAAAAAAAAAAAAAAAAAAA.batch"
    inner.put(good, encode_batch([b"good"]))
    inner.put("other/x.batch", encode_batch([b"someone else's data"]))
    inner.put(M, mf.encode_entry(0, good, []) + mf.encode_entry(1, "other/x.batch", [])
              + mf.encode_footer(2, 2, 0))
    store, gets, _ = _counting(inner)
    c = _consumer(store, read_ahead=True)
    assert c.next_batch().entries == [b"good"]
    with pytest.raises(InvalidLocation) as ei:
        c.next_batch()
    assert (ei.value.sequence, ei.value.location) == (1, "other/x.batch")
    assert "other/x.batch" not in gets  # never fetched, not even in the background
    c.close()


def test_read_ahead_serves_only_the_batch_the_manifest_names_now():
    """A read-ahead started from an older manifest read is used only if the epoch-checked
    read at next_batch names the same sequence and location, and its metadata still has to
    tile the batch."""
    store = MemoryStore("swapped")
    _queue(store, [[b"zero"], [b"one", b"uno"]])
    entries = mf.decode_manifest(store.get(M).data).entries
    other = "ingest/01BBBBBBBBBBBBBBBBBBBBBBBB.batch"
    store.put(other, encode_batch([b"replacement"]))
    c = _consumer(store, read_ahead=True)
    assert c.next_batch().entries == [b"zero"]  # read-ahead of entries[1] starts

    def manifest(location: str, metadata) -> bytes:
        footer = mf.read_footer(store.get(M).data)
        return (mf.encode_entry(0, entries[0].location, entries[0].metadata)
                + mf.encode_entry(1, location, metadata)
                + mf.encode_footer(2, 2, footer.epoch))

    store.put(M, manifest(other, [Metadata(0, 1)]))
    assert c.next_batch().entries == [b"replacement"]
    c.close()

    store.put(M, manifest(entries[1].location, entries[1].metadata))
    c = _consumer(store, read_ahead=True)  # again, now damaging the metadata of the entry
    assert c.next_batch().entries == [b"zero"]
    store.put(M, manifest(entries[1].location, [Metadata(0, 1), Metadata(7, 1)]))
    with pytest.raises(FormatError, match="start_index 7"):
        c.next_batch()
    c.close()


def test_a_fenced_consumer_gets_nothing_from_its_read_ahead():
    store = MemoryStore("fenced")
    _queue(store, [[b"zero"], [b"one"]])
    old = _consumer(store, read_ahead=True)
    assert old.next_batch().entries == [b"zero"]
    new = _consumer(store)
    with pytest.raises(Fenced):
        old.next_batch()
    old.close()
    assert new.next_batch().entries == [b"zero"]
    new.close()


def test_read_ahead_must_be_a_bool():
    with pytest.raises(InvalidInput, match="read_ahead"):
        ConsumerConfig(url="memory://x", read_ahead="yes")
