"""Silent wrong reads (issue 15, torture corruption sweep): producers write zstd batches by
default, whose frame carries the content checksum, so a damaged batch is an error and never
reads as different records. RFC 0001's uncompressed batches are still read (they carry no
checksum: docs/formats/buffer-batch.md)."""

from __future__ import annotations

import pytest

from headrace.buffer import (
    Consumer,
    ConsumerConfig,
    Producer,
    ProducerConfig,
    read_entries,
    read_manifest,
)
from headrace.buffer.batch_format import COMPRESSION_NONE, COMPRESSION_ZSTD, read_footer
from headrace.errors import FormatError, HeadraceError
from headrace.store import LocalStore

M = "ingest/manifest"


def _produce(store, **cfg) -> list[bytes]:
    entries = [f"entry {i} ".encode() * (i + 1) for i in range(12)]
    with Producer(ProducerConfig(store=store, flush_interval_s=0.01, **cfg)) as p:
        p.produce(entries, metadata=b"m").watcher.await_durable(timeout=30)
    return entries


def _read(store):
    return [list(b.entries) for b in read_entries(store, M, None, data_path_prefix="ingest")]


def test_default_producer_batches_are_zstd_and_no_flipped_byte_reads_as_other_data(tmp_path):
    """Old code wrote uncompressed batches by default: 13 of 30 flips in the torture sweep
    decoded to different records without an error."""
    store = LocalStore(tmp_path / "s", fsync=False)
    entries = _produce(store)
    (entry,) = read_manifest(store, M).entries
    orig = store.get(entry.location).data
    assert read_footer(orig).compression == COMPRESSION_ZSTD
    assert _read(store) == [entries]
    outcomes = {"right": 0, "error": 0}
    for off in range(len(orig)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(orig)
            bad[off] ^= mask
            store.put(entry.location, bytes(bad))
            try:
                got = _read(store)
            except HeadraceError:
                outcomes["error"] += 1
                continue
            assert got == [entries], f"flip {mask:#x} at byte {off} read as different records"
            outcomes["right"] += 1
    assert outcomes["error"] > len(orig) * 2  # nearly every flip is caught


def test_uncompressed_batches_are_still_read_and_can_be_asked_for(tmp_path):
    """RFC compatibility: a "none" batch (this producer's, or another RFC implementation's)."""
    store = LocalStore(tmp_path / "s", fsync=False)
    entries = _produce(store, batch_compression="none")
    (entry,) = read_manifest(store, M).entries
    assert read_footer(store.get(entry.location).data).compression == COMPRESSION_NONE
    assert _read(store) == [entries]


@pytest.mark.parametrize("bad", ["lz4", "", None, 1])
def test_an_unknown_compression_is_refused_naming_the_field(bad):
    from headrace.errors import InvalidInput

    with pytest.raises(InvalidInput, match="batch_compression"):
        ProducerConfig(url="memory://x", batch_compression=bad)


def test_a_damaged_start_index_in_the_manifest_is_an_error_not_shifted_ranges(tmp_path):
    """The manifest has no checksum (RFC 0001): a flipped start_index used to come back as
    metadata ranges over records that do not exist (the torture sweep's silent wrong reads)."""
    store = LocalStore(tmp_path / "s", fsync=False)
    with Producer(ProducerConfig(store=store, flush_interval_s=60)) as p:
        p.produce([b"a", b"b", b"c"], metadata=b"first")
        p.produce([b"d", b"e", b"f"], metadata=b"second")
    orig = store.get(M).data
    (entry,) = read_manifest(store, M).entries
    assert [m.start_index for m in entry.metadata] == [0, 3]
    first = 4 + 8 + 2 + len(entry.location) + 4  # entry_len, sequence, location, md count
    second = first + 16 + len(b"first")  # start u32, time i64, payload_len u32, payload
    cases = [(first, 0x80, "item 0 has start_index 128"),   # the first range must start at 0
             (second + 1, 0x08, "item 1 has start_index 2051"),  # past the 6 records
             (second, 0x04, "item 1 has start_index 7")]
    for off, mask, what in cases:
        bad = bytearray(orig)
        bad[off] ^= mask
        store.put(M, bytes(bad))
        with pytest.raises(FormatError, match=f"sequence 0 .*metadata {what}"):
            _read(store)
        c = Consumer(ConsumerConfig(store=store, gc_interval_s=0))
        c.initialize()
        with pytest.raises(FormatError, match=what):
            c.next_batch()
        c.close()
    store.put(M, orig)
    assert _read(store) == [[b"a", b"b", b"c", b"d", b"e", b"f"]]
