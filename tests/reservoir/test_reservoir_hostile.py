"""Hostile bytes get typed errors and bounded memory; the cache heals itself and never makes
every read fail (issue 15: hostile bytes, reservoir cache)."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from headrace.errors import ChecksumMismatch, FormatError
from headrace.reservoir import CacheTooSmall, ReservoirOptions, ReservoirReader, ReservoirStorage
from headrace.reservoir.cache import LocalCache
from headrace.reservoir.formats import checkpoint as ckfmt
from headrace.reservoir.formats import datafile
from headrace.reservoir.formats.datafile import BlobFileWriter
from headrace.store import CountingStore, LocalStore


def _zstd_frame_declaring(content_size: int, payload: bytes) -> bytes:
    """A zstd frame whose header declares ``content_size`` bytes but holds one raw block."""
    descriptor = 0b10100000  # 4-byte content size field, single segment, no checksum
    block = ((len(payload) << 3) | 1).to_bytes(3, "little")  # last block, raw
    return (struct.pack("<IB", 0xFD2FB528, descriptor) + struct.pack("<I", content_size)
            + block + payload)


def test_compressed_checkpoint_declaring_4_gib_is_refused_without_allocating():
    raw_len = 0xFFFFFFFF  # what the HRCZ header and the zstd frame both claim
    obj = struct.pack("<4sI", b"HRCZ", raw_len) + _zstd_frame_declaring(raw_len, b"\0" * 1000)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError) as ei:
            ckfmt.decompress(obj, "s/v/default/ckpt/x.checkpoint", 4 << 30, base=100)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ei.value.key == "s/v/default/ckpt/x.checkpoint" and ei.value.offset == 104
    assert peak < 16 << 20, f"peak {peak} bytes while refusing a 4 GiB claim"


def _bundle_bytes(tmp_path) -> tuple[bytes, str]:
    store = LocalStore(tmp_path / "s", fsync=False)
    with ReservoirStorage.open(store, options=ReservoirOptions(registry="bundled")) as st:
        s = st.session()
        s.write(1, b"x" * 100)
        s.commit()
        st.checkpoint()
    (m,) = list(store.list("default/v/default/ckpt/"))
    return store.get(m.key).data, m.key


@pytest.mark.parametrize("field_at", [24, 32, 40])
def test_data_file_section_offset_2_pow_63_is_refused(tmp_path, field_at):
    data, key = _bundle_bytes(tmp_path)
    datafile.parse_header(data, key)  # the genuine bundle parses
    bad = bytearray(data)
    bad[field_at:field_at + 8] = struct.pack("<Q", 1 << 63)
    with pytest.raises(FormatError) as ei:
        datafile.parse_header(bytes(bad), key)
    assert ei.value.key == key and ei.value.offset == field_at


def test_every_data_file_header_offset_is_bounded(tmp_path):
    data, key = _bundle_bytes(tmp_path)
    for at in range(8, 48, 4):
        for value in (0xFFFFFFFF, 1 << 31):
            bad = bytearray(data)
            width = 8 if at >= 24 else 4
            bad[at:at + width] = value.to_bytes(width, "little")
            try:
                datafile.parse_index(bytes(bad), key)
            except FormatError as e:
                assert e.key == key and e.offset is not None
            # not refused: the value happened to be valid where it was put (none here)
            else:
                pytest.fail(f"header value {value:#x} at byte {at} was accepted")


def _small_files_stream(store, opts):
    """Three checkpoints, each leaving one small file: all compaction candidates."""
    for round_ in range(3):
        with ReservoirStorage.open(store, options=opts) as st:
            s = st.session()
            s.write(round_, bytes([round_]) * 1000)
            s.commit()
            st.checkpoint()


def test_compaction_heals_a_corrupt_cached_copy(tmp_path):
    store = LocalStore(tmp_path / "s", fsync=False)
    opts = ReservoirOptions(max_file_size=64 * 1024)
    _small_files_stream(store, opts)
    cache = tmp_path / "c"
    with ReservoirStorage.open(store, options=opts, cache_dir=cache) as st:
        assert [st.read(i) for i in range(3)] == [bytes([i]) * 1000 for i in range(3)]
        for cached in cache.glob("*.dat"):  # every cached copy goes bad on disk
            raw = bytearray(cached.read_bytes())
            raw[70] ^= 0xFF  # in the page-id index: only the file's crc64 sees it
            cached.write_bytes(raw)
        assert st.compact() is not None
        assert st.metrics()["cache_healed"] >= 1
        assert [st.read(i) for i in range(3)] == [bytes([i]) * 1000 for i in range(3)]
    with ReservoirReader.open(store, options=opts) as r:
        assert [r.read(i) for i in range(3)] == [bytes([i]) * 1000 for i in range(3)]


def _one_file(store, size=4000):
    w = BlobFileWriter(1 << 20)
    _rel, psize, pcrc = w.add(1, b"p" * size)
    enc = w.finalize()
    store.put("d/1", enc.data)
    return len(enc.data), enc.crc64, int(enc.offsets[0]), psize, pcrc


def test_a_cache_disk_that_corrupts_is_named_not_the_store_key(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "s", fsync=False)
    size, crc, off, psize, pcrc = _one_file(store)
    opts = ReservoirOptions(max_cache_size_bytes=1 << 20)
    cache = LocalCache(tmp_path / "cache", store, opts, lambda fid: f"d/{fid}")
    real_write = LocalCache._write

    def bad_disk(self, file_id, crc_, data):  # every file lands with a flipped page byte
        path = real_write(self, file_id, crc_, data)
        raw = bytearray(path.read_bytes())
        raw[off + 5] ^= 0xFF
        path.write_bytes(raw)
        return path

    monkeypatch.setattr(LocalCache, "_write", bad_disk)
    with pytest.raises(ChecksumMismatch) as ei:
        cache.read_page(1, size, crc, off, psize, pcrc)
    assert ei.value.key.startswith(str(tmp_path / "cache")), ei.value.key
    assert "d/1" in str(ei.value)  # which object's copy it was
    assert cache.metrics()["healed"] == 1
    cache.close()


def test_cache_smaller_than_a_data_file_is_refused_at_open(tmp_path):
    store = LocalStore(tmp_path / "s", fsync=False)
    opts = ReservoirOptions(max_file_size=64 * 1024, max_cache_size_bytes=16 * 1024)
    with pytest.raises(CacheTooSmall, match="max_cache_size_bytes"):
        ReservoirStorage.open(store, options=opts, cache_dir=tmp_path / "c")
    with pytest.raises(ValueError):  # CacheTooSmall is also a ValueError
        ReservoirReader.open(store, options=opts, cache_dir=tmp_path / "c")


def test_a_file_larger_than_the_cache_is_read_around_it(tmp_path):
    store = CountingStore(LocalStore(tmp_path / "s", fsync=False))
    size, crc, off, psize, pcrc = _one_file(store, size=8000)
    opts = ReservoirOptions(max_cache_size_bytes=4096, cache_wait_timeout_s=0.2)
    cache = LocalCache(tmp_path / "cache", store, opts, lambda fid: f"d/{fid}")
    for _ in range(3):
        assert cache.read_page(1, size, crc, off, psize, pcrc) == b"p" * 8000
    assert cache.metrics()["downloads"] == 0  # a ranged GET per read, no whole-file download
    assert store.counts()["gets"] == 3
    cache.close()


@pytest.mark.parametrize("stream", ["../x", "/abs", "a/b", ".hidden", "", "x" * 200, 7])
def test_a_bad_stream_name_is_invalid_input_naming_it_and_writes_nothing(tmp_path, stream):
    """Torture case reservoir_stream_dotdot: was a plain ValueError."""
    from headrace.errors import InvalidInput
    from headrace.reservoir.options import check_stream_name

    store = LocalStore(tmp_path / "s")
    with pytest.raises(InvalidInput, match="stream") as ei:
        ReservoirStorage.open(store, stream=stream)
    assert repr(stream)[:60] in str(ei.value)
    with pytest.raises(InvalidInput, match="stream"):
        check_stream_name(stream)
    assert list(store.list("")) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # nothing beside the store


def test_run_ids_versions_and_options_are_invalid_input_naming_the_field(tmp_path):
    from headrace.errors import InvalidInput
    from headrace.reservoir.runs import PageRunWriter

    store = LocalStore(tmp_path / "s")
    for bad in ("", None, 5):
        with pytest.raises(InvalidInput, match="run_id"):
            PageRunWriter(store, "s", run_id=bad)
    with pytest.raises(InvalidInput, match="version"):
        ReservoirStorage.open(store, stream="s", version=3)
    with pytest.raises(InvalidInput, match=r"ReservoirOptions\.max_file_size"):
        ReservoirOptions(max_file_size=1)
