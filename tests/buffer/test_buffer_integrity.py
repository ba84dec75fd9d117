"""Silent wrong reads (issue 15, torture corruption sweep): producers write zstd batches by
default, whose frame carries the content checksum, so a damaged batch is an error and never
reads as different records. RFC 0001's uncompressed batches are still read (they carry no
checksum: docs/formats/buffer-batch.md)."""

from __future__ import annotations

import pytest

from headrace.buffer import Producer, ProducerConfig, read_entries, read_manifest
from headrace.buffer.batch_format import COMPRESSION_NONE, COMPRESSION_ZSTD, read_footer
from headrace.errors import HeadraceError
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
