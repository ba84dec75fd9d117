"""ReservoirStorage end to end on the local store and on S3 (moto): the acceptance figures."""

from __future__ import annotations

import os
import pickle

import pytest

from headrace.reservoir import (
    PageNotFound,
    PageRunWriter,
    ReservoirFailed,
    ReservoirOptions,
    ReservoirReader,
    ReservoirStorage,
)
from headrace.store import CountingStore, FaultyStore, LocalStore, open_store

SMALL = ReservoirOptions(max_file_size=256 * 1024, snapshot_interval=20)


class KeyCountingStore(CountingStore):
    """Counts deleted *keys* (CountingStore counts DeleteObjects requests)."""

    def reset(self):
        super().reset()
        self.deleted_keys = 0

    def delete(self, key):
        self.deleted_keys += 1
        super().delete(key)

    def delete_many(self, keys):
        keys = list(keys)
        self.deleted_keys += len(keys)
        super().delete_many(keys)


@pytest.fixture(params=["local", "s3"])
def any_store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store", fsync=False)
    return open_store(request.getfixturevalue("s3_url"))


def _fill(storage, pages: dict[int, bytes]) -> None:
    s = storage.session()
    for pid, data in pages.items():
        s.write(pid, data)
    s.commit()


def test_write_commit_checkpoint_reopen(any_store, tmp_path):
    pages = {i: os.urandom(100 + i) for i in range(50)}
    with ReservoirStorage.open(any_store, options=SMALL, cache_dir=tmp_path / "c") as st:
        s = st.session()
        s.write(1, b"uncommitted")
        assert s.read(1) == b"uncommitted"
        with pytest.raises(PageNotFound):
            st.read(1)  # not committed yet
        for pid, data in pages.items():
            s.write(pid, data)
        s.delete(7)
        s.commit()
        del pages[7]
        assert st.read(3) == pages[3]  # read-your-own-writes before any upload
        assert st.checkpoint() == 1
        assert st.read(3) == pages[3]
    with ReservoirStorage.open(any_store, options=SMALL) as st:
        assert st.version == 1
        for pid, data in pages.items():
            assert st.read(pid) == data
        assert not st.contains(7)


def test_bundle_is_one_put(any_store):
    store = CountingStore(any_store)
    with ReservoirStorage.open(store, options=SMALL) as st:
        for round_ in range(3):
            _fill(st, {i: os.urandom(2000) for i in range(10 * round_, 10 * round_ + 10)})
            store.reset()
            st.checkpoint()
            c = store.counts()
            # one PUT; the LIST proves no other writer is ahead (docs/reservoir.md)
            assert (c["puts"], c["gets"], c["lists"]) == (1, 0, 1), c
            assert st.metrics()["bundles"] == round_ + 1


@pytest.mark.parametrize("bundle,expected", [(True, (20, 20)), (False, (40, 40))])
def test_seed_cost_table_20_checkpoints(tmp_path, bundle, expected):
    """Seed table: over 20 checkpoints, bundles cost 20 writes + 20 deletes = 40 operations;
    separate data + checkpoint files cost 40 writes + 40 deletes = 80."""
    store = KeyCountingStore(LocalStore(tmp_path, fsync=False))
    opts = ReservoirOptions(max_file_size=256 * 1024, snapshot_interval=20, bundle=bundle,
                            registry="bundled")
    with ReservoirStorage.open(store, options=opts) as st:
        for v in range(1, 41):
            if v == 21:
                store.reset()  # steady state: measure checkpoints 21..40
            _fill(st, {i: os.urandom(1000) for i in range(4)})
            st.checkpoint()
        writes, deletes = store.counts()["puts"], store.deleted_keys
    assert (writes, deletes) == expected
    assert writes + deletes == (40 if bundle else 80)


def test_recovery_reads_latest_snapshot_and_at_most_19_incrementals(tmp_path):
    store = CountingStore(LocalStore(tmp_path, fsync=False))
    with ReservoirStorage.open(store, options=SMALL) as st:
        for v in range(1, 120):
            _fill(st, {v % 7: v.to_bytes(4, "little")})
            st.checkpoint()
            if v in (100, 119):
                store.reset()
                with ReservoirStorage.open(store, options=SMALL) as again:
                    gets = store.counts()["gets"]
                    assert again.version == v
                    assert again.read(v % 7) == v.to_bytes(4, "little")
                assert gets == (1 if v == 100 else 20), (v, store.counts())


def test_registry_file_mode_needs_no_list(tmp_path):
    store = CountingStore(LocalStore(tmp_path, fsync=False))
    opts = ReservoirOptions(max_file_size=256 * 1024, snapshot_interval=5, registry="file")
    with ReservoirStorage.open(store, options=opts) as st:
        for v in range(1, 8):
            _fill(st, {v: b"x" * v})
            store.reset()
            st.checkpoint()
            # the leftovers' data file, the checkpoint, the registry (the commit point): a bundle
            # is only written where its key is the commit point (registry="bundled")
            assert store.counts()["puts"] == 3
    store.reset()
    with ReservoirStorage.open(store, options=opts) as st:
        assert st.version == 7 and st.read(6) == b"x" * 6
    assert store.counts()["lists"] == 0


def test_full_files_upload_in_parallel_and_stay_readable(any_store, tmp_path):
    opts = ReservoirOptions(max_file_size=64 * 1024, in_flight_capacity=2)
    pages = {i: os.urandom(3000) for i in range(200)}  # ~600 KB: about ten full files
    with ReservoirStorage.open(any_store, options=opts, cache_dir=tmp_path / "c") as st:
        s = st.session()
        for pid, data in pages.items():
            s.write(pid, data)
            assert s.read(pid) == data
        s.commit()
        for pid in (0, 77, 199):
            assert st.read(pid) == pages[pid]
        st.checkpoint()
        assert st.metrics()["uploaded_files"] >= 8
    with ReservoirReader.open(any_store, options=opts) as r:
        assert all(r.read(pid) == data for pid, data in pages.items())


def test_page_runs_cross_process_absorb(any_store, tmp_path):
    opts = ReservoirOptions(max_file_size=64 * 1024)
    url_or_store = any_store
    runs, model = [], {}
    for task in range(4):
        w = PageRunWriter(url_or_store, run_id=f"batch1-task{task}", options=opts)
        for i in range(task * 100, task * 100 + (50 if task else 3)):
            data = os.urandom(1500)
            w.write(i, data)
            model[i] = data
        w.write(task * 100, b"rewritten")  # a newer copy supersedes the one in a full file
        model[task * 100] = b"rewritten"
        runs.append(pickle.loads(pickle.dumps(w.finish())))
    assert sum(len(r.files) for r in runs) >= 3  # big tasks uploaded their own full files
    store = CountingStore(any_store)
    with ReservoirStorage.open(store, options=opts) as st:
        st.absorb(runs)
        assert st.read(100) == b"rewritten"
        store.reset()
        v = st.checkpoint()
        assert store.counts()["puts"] == 1  # all leftovers of all tasks: one bundle
    with ReservoirReader.open(any_store, version=v, options=opts,
                              cache_dir=tmp_path / "rc") as r:
        assert r.version == v
        for pid, data in model.items():
            assert r.read(pid) == data
        assert r.contains(100) and not r.contains(5000)


def test_orphans_of_failed_tasks_are_swept_after_grace(tmp_path):
    store = LocalStore(tmp_path, fsync=False)
    opts = ReservoirOptions(max_file_size=8192)
    w = PageRunWriter(store, run_id="doomed", options=opts)
    for i in range(10):
        w.write(i, os.urandom(3000))
    lost = w.finish()  # never absorbed: its files are orphans
    assert lost.files
    with ReservoirStorage.open(store, options=opts) as st:
        _fill(st, {1: b"kept"})
        st.checkpoint()
        assert st.sweep_orphans(grace_s=3600) == []  # too young
        swept = st.sweep_orphans(grace_s=0)
        assert len(swept) == len(lost.files)
        assert st.read(1) == b"kept"
    with ReservoirStorage.open(store, options=opts) as st:
        assert st.read(1) == b"kept"


def test_upload_failure_surfaces_and_reset_recovers(tmp_path):
    inner = LocalStore(tmp_path, fsync=False)
    faulty = FaultyStore(inner, seed=1)
    opts = ReservoirOptions(max_file_size=8192)
    from headrace.retry import RetryPolicy

    with ReservoirStorage.open(faulty, options=opts,
                               retry=RetryPolicy(max_attempts=2, base_delay_s=0)) as st:
        _fill(st, {0: b"durable"})
        st.checkpoint()
        faulty.set_faults(fail_rate=1.0, verbs=["put"])
        s = st.session()
        with pytest.raises(ReservoirFailed):
            for i in range(10):
                s.write(i, os.urandom(3000))  # fills files: uploads fail in the background
            s.commit()
            st.checkpoint()
        faulty.clear()
        st.reset()
        assert st.read(0) == b"durable"
        _fill(st, {1: b"after reset"})
        assert st.checkpoint() == 2
    with ReservoirStorage.open(inner, options=opts) as st:
        assert st.read(0) == b"durable" and st.read(1) == b"after reset"


def test_compaction_repacks_sparse_files(any_store):
    store = KeyCountingStore(any_store)
    opts = ReservoirOptions(max_file_size=64 * 1024, snapshot_interval=4)
    model = {}
    with ReservoirStorage.open(store, options=opts) as st:
        for v in range(6):
            pages = {v * 10 + i: os.urandom(2000) for i in range(10)}
            model.update(pages)
            _fill(st, pages)
            st.checkpoint()
        files_before = st.metrics()["files"]
        v = st.compact()
        assert v is not None and st.metrics()["files"] < files_before
        assert st.compact() is None  # nothing left to compact
        for _ in range(4):  # the next snapshot lets the old files go
            st.checkpoint()
        assert all(st.read(pid) == data for pid, data in model.items())
    with ReservoirStorage.open(any_store, options=opts) as st:
        assert all(st.read(pid) == data for pid, data in model.items())


def test_stream_versions_keep_last(tmp_path):
    store = LocalStore(tmp_path, fsync=False)
    for i, name in enumerate(["v1", "v2", "v3"]):
        opts = ReservoirOptions(stream_version=name, keep_last_stream_versions=1)
        with ReservoirStorage.open(store, "orders", options=opts) as st:
            _fill(st, {0: name.encode()})
            st.checkpoint()
        os.utime(tmp_path / "orders" / "versions" / name, (1000 + i, 1000 + i))
    names = sorted(m.key.split("/")[-1] for m in store.list("orders/versions/"))
    assert names == ["v2", "v3"]  # v1 deleted, one previous version kept
    assert not list(store.list("orders/v/v1/"))
    with ReservoirStorage.open(store, "orders", version="v2") as st:
        assert st.read(0) == b"v2"


def test_options_validate_fields():
    for bad in (dict(max_file_size=10), dict(snapshot_interval=0), dict(registry="x"),
                dict(compaction_ratio_threshold=2.0), dict(stream_version="../x")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ReservoirOptions(**bad)


def test_absorbing_a_run_twice_is_refused(tmp_path):
    store = LocalStore(tmp_path, fsync=False)
    opts = ReservoirOptions(max_file_size=8192)
    w = PageRunWriter(store, run_id="r", options=opts)
    for i in range(5):
        w.write(i, os.urandom(3000))
    run = w.finish()
    with ReservoirStorage.open(store, options=opts) as st:
        st.absorb([run, None])  # a failed task shows up as None
        st.checkpoint()
        from headrace.errors import InvalidInput

        with pytest.raises(InvalidInput, match="already absorbed"):
            st.absorb([run])
    with pytest.raises(ValueError, match="stream version"):
        ReservoirStorage.open(store, version=3)


def test_padded_files_and_direct_io_reads(tmp_path):
    """Pages padded to 4096-byte blocks (readers do not care) read through O_DIRECT where the
    filesystem allows it (else the cache falls back to plain reads)."""
    store = LocalStore(tmp_path / "s", fsync=False)
    opts = ReservoirOptions(max_file_size=64 * 1024, pad_to_block=True, direct_io=True)
    pages = {i: os.urandom(100 + 977 * i) for i in range(12)}
    with ReservoirStorage.open(store, options=opts, cache_dir=tmp_path / "c") as st:
        _fill(st, pages)
        st.checkpoint()
        assert all(st.read(p) == d for p, d in pages.items())
    with ReservoirReader.open(store, options=opts, cache_dir=tmp_path / "c2") as r:
        state = r.state()
        assert all(int(o) % 4096 == 0 for o in state.offs)
        assert all(r.read(p) == d for p, d in pages.items())
        entries = list(r.source.cache._entries.values())
        assert entries and all(e.file is not None for e in entries)


@pytest.mark.parametrize("registry", ["bundled", "file"])
def test_reader_following_a_stream_reads_one_checkpoint_per_version(tmp_path, registry):
    """An executor's reader of version v+1 is built on its reader of v (``at``): it reads the
    one new checkpoint object (plus the registry file in registry="file" mode), not the chain
    back to the last snapshot — and sees exactly what a fresh reader sees, across snapshots."""
    store = CountingStore(LocalStore(tmp_path / "s", fsync=False))
    opts = ReservoirOptions(max_file_size=256 * 1024, snapshot_interval=8, registry=registry)
    expected: dict[int, bytes] = {}
    reader = None
    with ReservoirStorage.open(store, options=opts) as st:
        for v in range(1, 30):
            page = {v % 11: v.to_bytes(4, "little") * 300, 100 + v: os.urandom(50)}
            _fill(st, page)
            expected.update(page)
            st.checkpoint()
            store.reset()
            reader = (ReservoirReader.open(store, version=v, options=opts,
                                           cache_dir=tmp_path / "c") if reader is None
                      else reader.at(v))
            gets = store.counts()["gets"]
            assert reader.version == v
            assert {p: reader.read(p) for p in expected} == expected
            with ReservoirReader.open(store, version=v, options=opts) as fresh:
                assert list(fresh.page_ids()) == list(reader.page_ids())
            if v > 1:
                assert gets == (1 if registry == "bundled" else 2), (v, gets)
        back = reader.at(27)  # an older version: read from its snapshot, not built on v=29
        assert back.version == 27 and not back.contains(129)
        assert back.read(27 % 11) == (27).to_bytes(4, "little") * 300
    reader.close()


@pytest.mark.parametrize("registry", ["bundled", "file"])
def test_keep_from_keeps_the_previous_version_readable_across_a_snapshot(any_store, registry):
    """A writer whose newest checkpoint may be abandoned (the pipeline's, until its progress
    names it) redoes the work from the version before: that version must stay readable even
    when the newest is a snapshot, which drops every earlier checkpoint. Without keep_from
    the reader of v4 fails; with it, v4 (its chain and the file of a page v5 deleted) stays
    until a later checkpoint no longer keeps it, and is then collected as before."""
    opts = ReservoirOptions(max_file_size=256 * 1024, snapshot_interval=5, registry=registry)
    with ReservoirStorage.open(any_store, options=opts) as st:
        for v in range(1, 5):  # page v written at v, page v-1 deleted at v
            s = st.session()
            s.write(v, b"page %d" % v)
            if v > 1:
                s.delete(v - 1)
            s.commit()
            assert st.checkpoint(keep_from=v - 1) == v
        # both orders of the reader and the writer's cleanup: a reader of v4 opened before the
        # snapshot (a task mid-batch; no cache, so its read reaches the store) and one opened
        # after it (a restart redoing the batch)
        early = ReservoirReader.open(any_store, version=4, options=opts)
        s = st.session()
        s.write(5, b"page 5")
        s.delete(4)
        s.commit()
        assert st.checkpoint(keep_from=4) == 5  # a snapshot
        with early:
            assert early.read(4) == b"page 4"
        with ReservoirReader.open(any_store, version=4, options=opts) as r4:
            assert r4.read(4) == b"page 4"
        _fill(st, {6: b"page 6"})
        assert st.checkpoint(keep_from=5) == 6  # v4 is no longer needed: collected
        with pytest.raises(Exception, match="not found or no longer retained"):
            ReservoirReader.open(any_store, version=4, options=opts)
        with ReservoirReader.open(any_store, version=5, options=opts) as r5:
            assert r5.read(5) == b"page 5"
        _fill(st, {7: b"page 7"})
        assert st.checkpoint() == 7
    with ReservoirStorage.open(any_store, options=opts) as st:  # recovery reads the new chain
        assert [st.read(p) for p in (5, 6, 7)] == [b"page 5", b"page 6", b"page 7"]
        with pytest.raises(PageNotFound):
            st.read(4)


def _stored(store) -> int:
    return sum(m.size for m in store.list(""))


@pytest.mark.parametrize("adaptive", [False, True])
def test_snapshot_dead_ratio_bounds_the_bytes_kept_for_older_checkpoints(any_store, adaptive):
    """Every checkpoint replaces all pages of the last: the dead bundles stay as long as the
    checkpoints back to the last snapshot are retained — 20 of them by default. With
    snapshot_dead_ratio the writer snapshots once they reach that share of the live bytes (and
    outweigh what a snapshot writes): the store holds a few checkpoints' worth; every version
    it keeps reads back."""
    opts = ReservoirOptions(snapshot_dead_ratio=0.25 if adaptive else 0.0)
    with ReservoirStorage.open(any_store, options=opts) as st:
        stored = []
        for v in range(1, 31):
            _fill(st, {p: os.urandom(2000) for p in range(20)})  # 40 KB, all replaced
            assert st.checkpoint(keep_from=v - 1 or None) == v
            stored.append(_stored(any_store))
        live = 20 * 2000
        assert all(st.read(p) for p in range(20))
    if adaptive:
        assert max(stored[5:]) <= 4 * live, stored
    else:  # the seed's default: up to 20 checkpoints' bundles
        assert max(stored) >= 15 * live, stored
    with ReservoirStorage.open(any_store, options=opts) as st:
        assert st.version == 30 and len(st.state()) == 20
    with ReservoirReader.open(any_store, version=29, options=opts) as r:  # keep_from
        assert len(r.state()) == 20


def test_repack_sparse_moves_the_live_pages_of_mostly_dead_files(any_store):
    """A file whose pages later checkpoints mostly replaced is repacked into the next one:
    its live pages keep their ids and bytes, the file is collected; a file more than
    max_live_ratio live, or with nothing dead, is left alone; max_read_bytes bounds a call."""
    store = KeyCountingStore(any_store)
    opts = ReservoirOptions(snapshot_interval=2)
    model = {}
    with ReservoirStorage.open(store, options=opts) as st:
        for base in (0, 100, 200):  # three bundles of 10 pages
            pages = {base + i: os.urandom(1000) for i in range(10)}
            model.update(pages)
            _fill(st, pages)
            st.checkpoint()
        _fill(st, {i: b"new %d" % i for i in range(8)})  # bundle 1: 2 of 10 live
        _fill(st, {100 + i: b"new %d" % i for i in range(4)})  # bundle 2: 6 of 10 live
        model.update({i: b"new %d" % i for i in range(8)})
        model.update({100 + i: b"new %d" % i for i in range(4)})
        st.checkpoint()
        files = dict(st.state().files)
        assert st.repack_sparse(0.5, 1) == 1  # only the sparsest, the budget allows one
        st.checkpoint()
        gone = set(files) - set(st.state().files)
        assert len(gone) == 1 and st.state().deleted_files.keys() >= gone
        assert st.repack_sparse(0.5) == 0  # the rest is more than half live
        for _ in range(3):
            st.checkpoint()
        assert all(st.read(pid) == data for pid, data in model.items())
        with pytest.raises(Exception, match="max_live_ratio"):
            st.repack_sparse(1.0)
    with ReservoirStorage.open(any_store, options=opts) as st:
        assert all(st.read(pid) == data for pid, data in model.items())
