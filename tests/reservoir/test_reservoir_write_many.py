"""Session.write_many / PageRunWriter.write_many: a bulk write equals writing each page in order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.reservoir import PageRunWriter, ReservoirOptions, ReservoirStorage
from headrace.store import CountingStore, LocalStore, MemoryStore

SMALL = ReservoirOptions(max_file_size=16 * 1024)


def _pages(draw_sizes, seed: int) -> tuple[np.ndarray, bytes, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = np.asarray(draw_sizes, np.int64)
    return sizes, rng.bytes(int(sizes.sum())), np.cumsum(sizes) - sizes


page_lists = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5000)), min_size=0,
                      max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=page_lists, second=page_lists, pad=st.booleans(), deleted=st.sets(st.integers(0, 40)))
def test_write_many_equals_sequential_writes(first, second, pad, deleted):
    """Two bulk writes (ids repeat: the later copy wins) around deletes, across several files,
    give the same pages as the same writes one by one, live and after a reopen."""
    opts = ReservoirOptions(max_file_size=16 * 1024, pad_to_block=pad)
    store = MemoryStore()
    model: dict[int, bytes] = {}
    with ReservoirStorage.open(store, options=opts) as hr:
        s = hr.session()
        for n, batch in enumerate((first, second)):
            ids = np.asarray([p for p, _ in batch], np.int64)
            sizes, blob, offs = _pages([z for _, z in batch], n)
            s.write_many(ids, blob, sizes)
            for pid, off, size in zip(ids.tolist(), offs.tolist(), sizes.tolist(), strict=True):
                model[pid] = blob[off:off + size]
            if n == 0:
                for pid in deleted:
                    s.delete(pid)
                    model.pop(pid, None)
            for pid, data in model.items():  # read-your-own-writes inside the session
                assert s.read(pid) == data
        s.commit()
        hr.checkpoint()
        assert {p: hr.read(p) for p in model} == model
    for meta in store.list(""):  # fit_count never overfills a data file (but a lone big page)
        if "/data/" in meta.key and meta.size > opts.max_file_size:
            assert store.get_range(meta.key, 8, 12) == b"\x01\x00\x00\x00", meta.key
    with ReservoirStorage.open(store, options=opts) as hr:
        assert {int(p) for p in hr.state().ids} == set(model)
        assert {p: hr.read(p) for p in model} == model


def test_write_many_adopts_bytes_but_copies_mutable_buffers(tmp_path):
    """An immutable bytes source is referenced, not copied; a bytearray changed after the call
    does not change what was written."""
    sizes = np.full(64, 1000)
    frozen = bytes(range(256)) * 250
    mutable = bytearray(b"\x01" * 64000)
    store = CountingStore(LocalStore(tmp_path / "s", fsync=False))
    with ReservoirStorage.open(store, options=ReservoirOptions(max_file_size=32 * 1024)) as hr:
        s = hr.session()
        s.write_many(np.arange(64), frozen[:64000], sizes)
        s.write_many(np.arange(100, 164), mutable, sizes)
        mutable[:] = b"\x02" * 64000
        s.commit()
        hr.checkpoint()
        assert hr.read(3) == frozen[3000:4000]
        assert hr.read(163) == b"\x01" * 1000
    assert store.counts()["puts"] >= 4  # 128 KB of pages in 32 KiB files: several data files
    with ReservoirStorage.open(store) as hr:
        assert hr.read(63) == frozen[63000:64000]
        assert hr.read(100) == b"\x01" * 1000


@pytest.mark.parametrize(("ids", "sizes", "nbytes", "error"), [
    ([1, 2], [3], 3, ValueError),              # one size per id
    ([1, 2], [3, 4], 6, ValueError),           # sizes do not add up to the data
    ([1], [-1], 0, ValueError),                # negative size
    ([[1]], [[1]], 1, TypeError),              # not 1-d
    (["a"], [1], 1, TypeError),                # not ints
    (np.array([1 << 63], np.uint64), [1], 1, ValueError),  # outside i64
])
def test_write_many_rejects_bad_input_and_writes_nothing(ids, sizes, nbytes, error):
    store = MemoryStore()
    with ReservoirStorage.open(store, options=SMALL) as hr:
        s = hr.session()
        with pytest.raises(error):
            s.write_many(ids, bytes(nbytes), sizes)
        s.commit()
        hr.checkpoint()
        assert len(hr.state()) == 0


def test_page_run_writer_write_many_absorbs(tmp_path):
    store = LocalStore(tmp_path / "s", fsync=False)
    sizes, blob, offs = _pages([700] * 50, 7)
    with ReservoirStorage.open(store, options=SMALL) as hr:
        w = PageRunWriter(store, run_id="task-0", options=SMALL)
        w.write_many(np.arange(50), blob, sizes)
        run = w.finish()
        hr.absorb([run])
        hr.checkpoint()
        assert all(hr.read(i) == blob[offs[i]:offs[i] + 700] for i in range(50))


def test_reader_hot_page_table_bounded_and_ids_still_checked(tmp_path, monkeypatch):
    """The reader's memo stays within its bound, serves the right bytes across clears, and a
    memoised page 1 does not make ``read(True)`` (a bool) pass as a page id."""
    from headrace.reservoir import ReservoirReader
    from headrace.reservoir import reader as reader_module

    monkeypatch.setattr(reader_module, "HOT_PAGE_TABLE_ENTRIES", 4)
    store = LocalStore(tmp_path / "s", fsync=False)
    sizes, blob, offs = _pages([300] * 50, 3)
    with ReservoirStorage.open(store, options=SMALL) as hr:
        s = hr.session()
        s.write_many(np.arange(50), blob, sizes)
        s.commit()
        hr.checkpoint()
    with ReservoirReader.open(store, cache_dir=tmp_path / "c") as r:
        for _ in range(3):
            for i in (1, 7, 1, 49, 7, 30, 2, 1):
                assert r.read(i) == blob[offs[i]:offs[i] + 300]
                assert len(r._hot) <= 4
        assert r.read(np.int64(7)) == blob[offs[7]:offs[7] + 300]
        with pytest.raises(TypeError):
            r.read(True)
