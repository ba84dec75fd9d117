"""The local+backup state backend (pipeline/state/local_backup.py), without Spark: round trips on a
new host and on the same host (host affinity: no file blob read), incremental uploads, a dict
model under random commits/reopens/abandoned attempts, SIGKILL between upload and finalize."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import NotFound
from headrace.pipeline.names import W
from headrace.pipeline.operators.distinct import DistinctKernel
from headrace.pipeline.operators.kernel import ZSET_SCHEMA
from headrace.pipeline.state.local_backup import LocalBackupBucketState, finalize
from headrace.spine.errors import StorageLocked
from headrace.store import CountingStore, open_store, payload_size

PIPE = "pipe"
KEY = "op2-s1-b7"


class KeyLog(CountingStore):
    """A CountingStore that also remembers which keys were read and what was written where."""

    def __init__(self, inner):
        super().__init__(inner)
        self.got: list[str] = []
        self.put_bytes: dict[str, int] = {}

    def reset(self) -> None:
        super().reset()
        self.got, self.put_bytes = [], {}

    def get(self, key):
        self.got.append(key)
        return super().get(key)

    def get_range(self, key, start, end):
        self.got.append(key)
        return super().get_range(key, start, end)

    def put(self, key, data, mode=None):
        self.put_bytes[key] = payload_size(data)
        return super().put(key, data) if mode is None else super().put(key, data, mode)

    def blob_gets(self) -> list[str]:
        return [k for k in self.got if "/blobs/" in k]

    def blob_put_bytes(self) -> int:
        return sum(n for k, n in self.put_bytes.items() if "/blobs/" in k)


@pytest.fixture(params=["local", "s3"])
def url(request, tmp_path) -> str:
    if request.param == "s3":
        return request.getfixturevalue("s3_url")
    return str(tmp_path / "store")


def zs(rows) -> pa.Table:
    keys, vals, ws = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.Table.from_arrays([pa.array([k.encode() for k in keys], pa.binary()),
                                 pa.array([v.encode() for v in vals], pa.binary()),
                                 pa.array(ws, pa.int64())], schema=ZSET_SCHEMA)


def rows_of(table: pa.Table) -> list[tuple]:
    """(key, val, w) with keys and values read back as text (the tests write text)."""
    return sorted((bytes(k).decode(), bytes(v).decode(), w) for k, v, w in
                  zip(*(table[c].to_pylist() for c in ("key", "val", "w")), strict=True))


def open_state(root, store, expected, **kw) -> LocalBackupBucketState:
    return LocalBackupBucketState(str(root), store, PIPE, 2, 1, 7, expected, **kw)


def model_rows(model: dict) -> list[tuple]:
    return sorted((k, v, w) for (k, v), w in model.items() if w != 0)


def apply_model(model: dict, rows) -> None:
    for k, v, w in rows:
        model[(k, v)] = model.get((k, v), 0) + w


def test_round_trip_new_host_and_host_affinity(url, tmp_path):
    store = KeyLog(open_store(url))
    rows = [(f"k{i:04d}", f"v{i % 7}", 1 + i % 3) for i in range(2000)]
    st1 = open_state(tmp_path / "hostA", store, None)
    st1.insert_updates(zs(rows))
    st1.insert_updates(zs([("k0000", "v0", -1), ("k0001", "x", 2)]))
    assert st1.changed
    idx = st1.commit("ck-1")
    assert idx is not None
    finalize(store, PIPE, {KEY: idx})
    want_rows = sorted([r for r in rows if r[0] != "k0000"] + [("k0001", "x", 2)])
    probe = pa.array(["k0001", "k0000", "nope", "k1999", "k0001"], pa.string())
    want_lookup = sorted([("k0001", "v1", 2), ("k0001", "x", 2), ("k1999", "v4", 2)])

    # a new host: everything is downloaded
    store.reset()
    with open_state(tmp_path / "hostB", store, idx) as b:
        assert b.restore_result.reused_directory is False
        assert b.restore_result.files_downloaded > 0
        assert store.blob_gets()
        assert rows_of(b.to_table()) == want_rows
        got = b.lookup_many(probe)
        assert got.schema == ZSET_SCHEMA
        assert rows_of(got) == want_lookup
        assert not b.changed

    # the same host: the directory already is the snapshot, no file blob is read
    store.reset()
    with open_state(tmp_path / "hostA", store, idx) as a:
        assert a.restore_result.reused_directory is True
        assert a.restore_result.files_downloaded == 0
        assert store.blob_gets() == []
        assert store.counts()["gets"] == 1  # the index only
        assert rows_of(a.to_table()) == want_rows
        got = a.lookup_many(probe)
        assert got.schema == ZSET_SCHEMA
        assert rows_of(got) == want_lookup
    # a second reopen on the same host is still free of blob reads (close left it clean)
    store.reset()
    with open_state(tmp_path / "hostA", store, idx) as a:
        assert a.restore_result.reused_directory is True
        assert store.blob_gets() == []


def test_incremental_upload_sends_only_new_files(url, tmp_path):
    store = KeyLog(open_store(url))
    root = tmp_path / "host"
    s = open_state(root, store, None)
    s.insert_updates(zs([(f"key-{i:06d}", "v" * 20, 1) for i in range(20_000)]))
    idx1 = s.commit("ck-1")
    first = store.blob_put_bytes()
    finalize(store, PIPE, {KEY: idx1})
    bucket_dir = root / PIPE / KEY
    before = {p.relative_to(bucket_dir): (p.stat().st_size, p.stat().st_ino)
              for p in bucket_dir.rglob("*") if p.is_file()}
    big = max(size for size, _ in before.values())
    assert first >= big > 100_000

    store.reset()
    s = open_state(root, store, idx1)
    s.insert_updates(zs([("key-000001", "v" * 20, -1), ("new", "x", 1)]))
    idx2 = s.commit("ck-2")
    assert idx2 not in (None, idx1)
    after = {p.relative_to(bucket_dir): (p.stat().st_size, p.stat().st_ino)
             for p in bucket_dir.rglob("*") if p.is_file()}
    new_files = {p: size for p, (size, ino) in after.items() if before.get(p) != (size, ino)}
    sent = store.blob_put_bytes()
    # exactly the new files (the new batch, the new checkpoint's manifest, the catalog)
    assert sent == sum(new_files.values())
    assert sent < big / 10
    assert s.backup_metrics["files_retained"] >= 2  # the first batch and its manifest
    blob_puts = [k for k in store.put_bytes if "/blobs/" in k]
    assert len(blob_puts) == 1  # small files are packed into one blob
    finalize(store, PIPE, {KEY: idx2})
    with open_state(tmp_path / "other", store, idx2) as o:
        assert len(o.to_table()) == 20_000


def test_unchanged_commit_uploads_nothing(tmp_path):
    store = KeyLog(open_store(str(tmp_path / "store")))
    s = open_state(tmp_path / "h", store, None)
    s.insert_updates(zs([]))
    s.insert_updates(zs([("a", "b", 1), ("a", "b", -1)]))  # consolidates to nothing
    assert s.commit("ck-1") is None
    assert store.counts()["puts"] == 0
    s = open_state(tmp_path / "h", store, None)
    s.insert_updates(zs([("a", "b", 1)]))
    idx = s.commit("ck-1")
    finalize(store, PIPE, {KEY: idx})
    store.reset()
    s = open_state(tmp_path / "h", store, idx)
    s.lookup_many(pa.array(["a"], pa.string()))
    assert s.commit("ck-2") is None
    assert store.counts()["puts"] == 1  # restore redoes the snapshot's cleanup (its marker)


def test_expected_none_starts_empty_and_wipes(tmp_path):
    store = open_store(str(tmp_path / "store"))
    s = open_state(tmp_path / "h", store, None)
    s.insert_updates(zs([("a", "b", 1)]))
    assert s.commit("ck-1") is not None
    with open_state(tmp_path / "h", store, None) as s:
        assert s.to_table().num_rows == 0


def test_bucket_is_locked_while_open(tmp_path):
    store = open_store(str(tmp_path / "store"))
    s = open_state(tmp_path / "h", store, None)
    with pytest.raises(StorageLocked):
        open_state(tmp_path / "h", store, None, lock_timeout_s=0.2)
    s.insert_updates(zs([("a", "b", 1)]))
    idx = s.commit("ck-1")  # commit releases the bucket
    with open_state(tmp_path / "h", store, idx) as again:
        assert rows_of(again.to_table()) == [("a", "b", 1)]
    # other buckets are independent
    with LocalBackupBucketState(str(tmp_path / "h"), store, PIPE, 2, 1, 8, None):
        pass


def test_finalize_is_idempotent_and_drops_the_previous_snapshot(tmp_path):
    store = open_store(str(tmp_path / "store"))
    s = open_state(tmp_path / "h", store, None)
    s.insert_updates(zs([("a", "1", 1)]))
    idx1 = s.commit("ck-1")
    finalize(store, PIPE, {KEY: idx1})
    finalize(store, PIPE, {KEY: idx1})
    s = open_state(tmp_path / "h", store, idx1)
    s.insert_updates(zs([("b", "2", 1)]))
    idx2 = s.commit("ck-2")
    finalize(store, PIPE, {KEY: idx2})
    finalize(store, PIPE, {KEY: idx2})
    finalize(store, PIPE, {})
    with open_state(tmp_path / "fresh", store, idx2) as s:
        assert rows_of(s.to_table()) == [("a", "1", 1), ("b", "2", 1)]
    with pytest.raises(NotFound):  # replaced by idx2's cleanup
        open_state(tmp_path / "fresh2", store, idx1)


class DictZSet:
    """An in-memory StateSpine: {key: {val: w}}."""

    def __init__(self):
        self.rows: dict[bytes, dict[bytes, int]] = {}

    def lookup_many(self, keys: pa.Array) -> pa.Table:
        out = [(k, v, w) for k in dict.fromkeys(keys.to_pylist())
               for v, w in self.rows.get(k, {}).items() if w]
        return zs_bytes(out)

    def insert_updates(self, updates: pa.Table) -> None:
        for k, v, w in zip(*(updates[c].to_pylist() for c in ("key", "val", "w")), strict=True):
            vals = self.rows.setdefault(k, {})
            vals[v] = vals.get(v, 0) + w


def zs_bytes(rows) -> pa.Table:
    keys, vals, ws = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.Table.from_arrays([pa.array(keys, pa.binary()), pa.array(vals, pa.binary()),
                                 pa.array(ws, pa.int64())], schema=ZSET_SCHEMA)


def test_kernel_over_local_backup_state_matches_bucket_state(tmp_path):
    """DistinctKernel through commits and reopens (alternating hosts) equals it over an
    in-memory dict Z-set."""
    store = open_store(str(tmp_path / "store"))
    schema = pa.schema([("x", pa.string())])
    kernel = DistinctKernel(schema)
    ref = DictZSet()
    idx = None
    steps = [(["a", "b", "a"], [1, 1, 1]), (["a", "c"], [-1, 1]), (["a", "b"], [-1, -1]),
             (["d"], [2]), (["c", "d"], [-1, -1])]
    for n, (xs, ws) in enumerate(steps):
        delta = pa.table({"x": pa.array(xs, pa.string()), W: pa.array(ws, pa.int64())})
        s = open_state(tmp_path / f"host{n % 2}", store, idx)
        got = kernel.apply([delta], [s])
        want = kernel.apply([delta], [ref])
        assert sorted(got.to_pylist(), key=str) == sorted(want.to_pylist(), key=str)
        new = s.commit(f"ck-{n}")
        if new is not None:
            finalize(store, PIPE, {KEY: new})
            idx = new
    with open_state(tmp_path / "host9", store, idx) as s:
        want = [(k, v, w) for k, vals in ref.rows.items() for v, w in vals.items() if w]
        assert sorted((bytes(k), bytes(v), w) for k, v, w in zip(
            *(s.to_table()[c].to_pylist() for c in ("key", "val", "w")), strict=True)) \
            == sorted(want)


def test_stale_catalog_of_the_same_size_is_not_reused(tmp_path):
    """Every catalog ends with its own crc32, so two catalogs of equal size have equal whole-file
    crc32s and a size + crc32 check alone would keep a stale one (restore compares content
    hashes). Host A is left at snapshot 2 while host B commits 3 and 4 (same catalog size: two
    checkpoints kept); A then restores 4 correctly, downloading the catalog."""
    import zlib

    store = open_store(str(tmp_path / "store"))
    a, b = tmp_path / "A", tmp_path / "B"
    idx = None
    for n, host in enumerate([a, a, b, b]):
        s = open_state(host, store, idx)
        s.insert_updates(zs([(f"k{n}", "v", 1)]))
        idx = s.commit(f"ck-{n}")
        finalize(store, PIPE, {KEY: idx})
    cat_a = (a / PIPE / KEY / "checkpoints.headrace").read_bytes()
    cat_b = (b / PIPE / KEY / "checkpoints.headrace").read_bytes()
    assert cat_a != cat_b and len(cat_a) == len(cat_b)
    assert zlib.crc32(cat_a) == zlib.crc32(cat_b)  # the crc32 residue of self-checked files
    with open_state(a, store, idx) as s:
        assert s.restore_result.reused_directory is False
        assert rows_of(s.to_table()) == [(f"k{n}", "v", 1) for n in range(4)]


_rows = st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from("xyz"),
                           st.integers(-2, 2)), max_size=6)
# one step: updates, then how the attempt ends, and on which host the next one runs
_step = st.tuples(_rows, st.sampled_from(["commit", "commit_no_finalize", "abandon"]),
                  st.sampled_from(["same", "other", "fresh"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_step, min_size=1, max_size=6))
def test_state_equals_dict_model(steps):
    """Committed state (as the driver records it) equals a dict model, whichever host opens it
    next; abandoned attempts and commits whose index is never recorded leave no trace."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = open_store(str(tmp / "store"))
        model: dict = {}
        committed: str | None = None
        host = 0
        fresh = 2
        for rows, end, where in steps:
            s = open_state(tmp / f"h{host}", store, committed)
            assert rows_of(s.to_table()) == model_rows(model)
            keys = pa.array(sorted({r[0] for r in rows}) + ["zz"], pa.string())
            want = [r for r in model_rows(model) if r[0] in keys.to_pylist()]
            assert rows_of(s.lookup_many(keys)) == want
            s.insert_updates(zs(rows))
            if end == "abandon":
                s.close()
            else:
                new = s.commit(f"ck-{len(model)}")
                if end == "commit" and new is not None:
                    finalize(store, PIPE, {KEY: new})
                    committed = new
                    apply_model(model, rows)
                # commit_no_finalize: the driver never recorded it (crashed before)
            if where == "other":
                host = 1 - host
            elif where == "fresh":
                host, fresh = fresh, fresh + 1
        with open_state(tmp / "final", store, committed) as s:
            assert rows_of(s.to_table()) == model_rows(model)


_CHILD = textwrap.dedent("""
    import os, signal, sys
    import pyarrow as pa
    from headrace.backup import BackupManager
    from headrace.pipeline.operators.kernel import ZSET_SCHEMA
    from headrace.pipeline.state.local_backup import LocalBackupBucketState
    root, url, expected, point, out = sys.argv[1:6]
    if point == "before_upload":
        BackupManager.upload = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    s = LocalBackupBucketState(root, url, "pipe", 2, 1, 7, expected)
    s.insert_updates(pa.Table.from_arrays(
        [pa.array([b"b", b"c"], pa.binary()), pa.array([b"2", b"3"], pa.binary()),
         pa.array([-1, 1], pa.int64())], schema=ZSET_SCHEMA))
    idx = s.commit("ck-2")
    with open(out, "w") as f:
        f.write(idx)
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)  # after upload, before the driver's record/finalize
""")


@pytest.mark.parametrize("url,point", [("local", "after_upload"), ("s3", "after_upload"),
                                       ("local", "before_upload")], indirect=["url"])
def test_sigkill_between_commit_steps(url, tmp_path, point):
    store = open_store(url)
    host = tmp_path / "host"
    s = open_state(host, store, None)
    s.insert_updates(zs([("a", "1", 1), ("b", "2", 1)]))
    prev = s.commit("ck-1")
    finalize(store, PIPE, {KEY: prev})
    out = tmp_path / "new-index"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(host), url, prev, point, str(out)],
                          capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    old_rows = [("a", "1", 1), ("b", "2", 1)]
    new_rows = [("a", "1", 1), ("c", "3", 1)]
    bucket_dir = host / PIPE / KEY
    # killed after the local commit: the directory is ahead of ``prev`` (after the upload, it is
    # the new snapshot)
    assert not (bucket_dir / "LOCK").exists()
    # the driver never recorded the new index: the previous one restores, on the same host
    # (whose directory is ahead of it) and on a new one
    for where in (host, tmp_path / "new-host"):
        with open_state(where, store, prev) as s:
            assert rows_of(s.to_table()) == old_rows
    if point == "before_upload":
        assert not out.exists()
        return
    new = out.read_text()
    assert new != prev
    # the driver did record it but died before finalize: the new one restores too
    with open_state(tmp_path / "new-host-2", store, new) as s:
        assert rows_of(s.to_table()) == new_rows
    finalize(store, PIPE, {KEY: new})
    with open_state(host, store, new) as s:
        assert rows_of(s.to_table()) == new_rows
        s.insert_updates(zs([("d", "4", 1)]))
        newer = s.commit("ck-3")
    finalize(store, PIPE, {KEY: newer})
    with open_state(tmp_path / "new-host-3", store, newer) as s:
        assert rows_of(s.to_table()) == new_rows + [("d", "4", 1)]
    assert os.path.isdir(bucket_dir)
