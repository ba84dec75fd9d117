"""Corruption: one flipped byte in each region of each file type fails loudly, naming the object;
a corrupt cached file heals from the store."""

from __future__ import annotations

import os
import struct

import pytest

from headrace.errors import ChecksumMismatch, FormatError
from headrace.reservoir import ReservoirOptions, ReservoirReader, ReservoirStorage
from headrace.reservoir.formats import checkpoint as ckfmt
from headrace.reservoir.formats import datafile
from headrace.reservoir.verify import verify_stream
from headrace.store import FaultyStore, LocalStore

OPTS = ReservoirOptions(max_file_size=64 * 1024)
PAGES = {i: bytes([i]) * (300 + i) for i in range(10)}


def _build(store, opts=OPTS):
    """Checkpoint 2 is a bundle whose 15 checkpoint columns are all non-empty."""
    with ReservoirStorage.open(store, options=opts) as st:
        s = st.session()
        for pid, data in PAGES.items():
            s.write(pid, data)
        s.commit()
        st.checkpoint()
        s = st.session()
        for pid in range(9):
            s.write(pid, PAGES[pid])
        s.delete(9)
        s.commit()
        st.checkpoint()


def _flip(store, key, offset):
    data = bytearray(store.get(key).data)
    data[offset] ^= 0x5A
    store.put(key, bytes(data))


def _regions_of_bundle(data: bytes) -> dict[str, int]:
    h, ids, offs = datafile.parse_index(data, "b")
    out = {"header": 8, "page ids": 64 + 3, "page offsets": h.offsets_offset + 2,
           "page data": int(offs[1]) + 5}
    c = h.checkpoint_offset
    vals = struct.unpack_from("<4sHH QQQQ Q 15Q QQ", data, c)
    for i, name in enumerate(ckfmt.COLUMN_NAMES):
        out[f"checkpoint column {name}"] = c + vals[8 + i]
    out["checkpoint header"] = c + 10
    r = h.registry_offset
    _m, _v, _f, n, o_v, o_s, o_b, o_c, o_f = struct.unpack_from("<4sHHI5I", data, r)
    out.update({"registry header": r + 8, "registry versions": r + o_v,
                "registry snapshot bitmap": r + o_s, "registry bundle bitmap": r + o_b,
                "registry crc64s": r + o_c, "registry footer": r + o_f})
    return out


def _expect_loud(fn, key):
    with pytest.raises(FormatError) as ei:
        fn()
    assert ei.value.key == key, (ei.value, key)


@pytest.mark.parametrize("region", [
    "header", "page ids", "page offsets", "page data", "checkpoint header",
    *[f"checkpoint column {n}" for n in ckfmt.COLUMN_NAMES],
    "registry header", "registry versions", "registry snapshot bitmap",
    "registry bundle bitmap", "registry crc64s", "registry footer"])
def test_flip_each_region_of_a_bundle(tmp_path, region):
    store = LocalStore(tmp_path / "s", fsync=False)
    _build(store)
    key = "default/v/default/ckpt/00000000000000000002.bundle"
    original = store.get(key).data
    offset = _regions_of_bundle(original)[region]
    _flip(store, key, offset)

    def open_and_read_all():
        with ReservoirReader.open(store, cache_dir=tmp_path / f"c{os.urandom(4).hex()}") as r:
            for pid in range(9):
                assert r.read(pid) == PAGES[pid]

    _expect_loud(open_and_read_all, key)
    rep = verify_stream(store)
    assert not rep.ok and any(key in p for p in rep.problems), rep.problems


@pytest.mark.parametrize("region", ["header", "page ids", "page offsets", "page data"])
def test_flip_each_region_of_a_data_file(tmp_path, region):
    store = LocalStore(tmp_path / "s", fsync=False)
    opts = ReservoirOptions(max_file_size=4096)
    with ReservoirStorage.open(store, options=opts) as st:
        s = st.session()
        for i in range(8):
            s.write(i, bytes([i]) * 1000)  # files fill up: separate data files
        s.commit()
        st.checkpoint()
        first_file = st.state().lookup(0)[0]  # the data file holding page 0
    key = f"default/v/default/data/{first_file:016x}.dat"
    data = store.get(key).data
    h, ids, offs = datafile.parse_index(data, key)
    where = {"header": 12, "page ids": 64, "page offsets": h.offsets_offset,
             "page data": int(offs[0]) + 3}[region]
    _flip(store, key, where)
    with ReservoirReader.open(store, options=opts, cache_dir=tmp_path / "c") as r:
        _expect_loud(lambda: [r.read(i) for i in range(8)], key)
    rep = verify_stream(store, options=opts)
    assert any(key in p for p in rep.problems)


def test_flip_in_compressed_checkpoint_and_registry_file(tmp_path):
    store = LocalStore(tmp_path / "s", fsync=False)
    opts = ReservoirOptions(max_file_size=64 * 1024, registry="file", bundle=False)
    _build(store, opts)
    (ck,) = [m.key for m in store.list("default/v/default/ckpt/00000000000000000002-")]
    _flip(store, ck, 40)
    _expect_loud(lambda: ReservoirReader.open(store, options=opts), ck)
    _flip(store, ck, 40)
    reg = "default/v/default/registry"
    for off in (9, 33, len(store.get(reg).data) - 3):
        _flip(store, reg, off)
        with pytest.raises(ChecksumMismatch) as ei:
            ReservoirReader.open(store, options=opts)
        assert ei.value.key == reg
        _flip(store, reg, off)
    with ReservoirReader.open(store, options=opts) as r:
        assert r.read(3) == PAGES[3]


def test_corrupt_cached_file_heals_from_store(tmp_path):
    store = LocalStore(tmp_path / "s", fsync=False)
    _build(store)
    cache = tmp_path / "cache"
    with ReservoirReader.open(store, cache_dir=cache) as r:
        assert r.read(1) == PAGES[1]
        (cached,) = list(cache.glob("*.dat"))
        raw = bytearray(cached.read_bytes())
        raw[-200] ^= 0xFF
        raw[200] ^= 0xFF
        cached.write_bytes(raw)  # the entry's open descriptor reads the new bytes (same inode)
        assert [r.read(pid) for pid in range(9)] == [PAGES[p] for p in range(9)]
        assert r.metrics()["cache_healed"] >= 1
    with ReservoirReader.open(store, cache_dir=cache) as r:  # reopen: cached copy is reused
        assert r.read(2) == PAGES[2]


def test_bad_download_is_retried_once_then_surfaces(tmp_path):
    inner = LocalStore(tmp_path / "s", fsync=False)
    _build(inner)
    faulty = FaultyStore(inner, seed=3)
    bundle = 1 << 63 | 2
    with ReservoirReader.open(faulty, cache_dir=tmp_path / "c1") as r:
        r.source.cache.evict(bundle)  # recovery cached the bundle it read; force a download
        faulty.set_faults(corrupt_get="flip", corrupt_rate=1.0,
                          corrupt_keys=lambda k: k.endswith(".bundle"))
        faulty.injected["corrupt"] = 0
        with pytest.raises(ChecksumMismatch) as ei:
            r.read(1)
        assert ei.value.key.endswith("00000000000000000002.bundle")
        assert faulty.injected["corrupt"] == 2  # downloaded twice, then the error surfaced
    with ReservoirReader.open(faulty, cache_dir=tmp_path / "c2") as r:
        r.source.cache.evict(bundle)
        calls: list[str] = []
        faulty.set_faults(corrupt_get="flip",
                          corrupt_keys=lambda k: calls.append(k) is None and len(calls) == 1)
        assert r.read(1) == PAGES[1]  # the first download was bad, the second healed it
