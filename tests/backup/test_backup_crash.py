"""Crash tests: a real subprocess is SIGKILLed in the middle of upload, cleanup or restore;
after restart nothing committed is lost and the sweep leaves no orphan older than the TTL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from backup_testlib import read_tree, write_tree

from headrace.backup import BackupConfig, BackupManager, RestoreManager
from headrace.codec import ManualClock
from headrace.store import LocalStore

TTL_MS = 3_600_000

CHILD = r"""
import os, sys
from headrace.backup import BackupConfig, BackupManager, RestoreManager
from headrace.store import FaultyStore, LocalStore

store_dir, src, record, action = sys.argv[1:5]
store = FaultyStore(LocalStore(store_dir), latency_s=0.01)
cfg = BackupConfig(chunk_size=4096, upload_workers=2, download_workers=2, ttl_ms=3_600_000)
if action == "sweep":
    with BackupManager(store, config=cfg) as bm:
        print("START", flush=True)
        bm.sweep()
    sys.exit(0)
if action == "restore":
    with RestoreManager(store, config=cfg) as rm:
        print("START", flush=True)
        rm.restore(open(record).read(), sys.argv[5], force=True)
    sys.exit(0)
prev = open(record).read() if os.path.exists(record) else None
bm = BackupManager(store, config=cfg, previous_index_blob_id=prev)
print("START", flush=True)
index_id = bm.upload(src, "c2")
tmp = record + ".tmp"
with open(tmp, "w") as f:
    f.write(index_id)
    f.flush()
    os.fsync(f.fileno())
os.rename(tmp, record)  # the caller's durable checkpoint
print("RECORDED", flush=True)
bm.cleanup(index_id)
print("DONE", flush=True)
"""


def tree(seed: int, n_files: int) -> dict:
    rnd = __import__("random").Random(seed)
    return {"MANIFEST": rnd.randbytes(300),
            "data": {f"{seed:02d}-{i:03d}.sst": rnd.randbytes(12_000) for i in range(n_files)}}


def spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE,
                            text=True, env=env)


def kill_when(proc: subprocess.Popen, ready, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"child exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("child never reached the kill point")
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def first_commit(tmp_path: Path) -> tuple[LocalStore, Path, Path, dict]:
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, tree(1, 20))
    record = tmp_path / "record"
    cfg = BackupConfig(chunk_size=4096, ttl_ms=TTL_MS)
    with BackupManager(store, config=cfg) as bm:
        index_id = bm.upload(src, "c1")
        record.write_text(index_id)
        bm.cleanup(index_id)
    committed = read_tree(src)
    # the next checkpoint: the LSM compacted everything into new files
    for p in (src / "data").iterdir():
        p.unlink()
    write_tree(src, tree(2, 30))
    return store, src, record, committed


def restart_and_check(tmp_path: Path, store: LocalStore, record: Path, expected: dict) -> None:
    clock = ManualClock(start_ms=int(time.time() * 1000))
    cfg = BackupConfig(chunk_size=4096, ttl_ms=TTL_MS)
    index_id = record.read_text()
    with RestoreManager(store, config=cfg, clock=clock) as rm:
        rm.restore(index_id, tmp_path / "restored")  # also redoes an interrupted cleanup
    assert read_tree(tmp_path / "restored") == expected
    clock.advance(2 * TTL_MS / 1000)
    with BackupManager(store, config=cfg, clock=clock, previous_index_blob_id=index_id) as bm:
        bm.sweep()
        live = bm.blobs.get_index(index_id).dir_index.present_blob_ids()
        assert set(bm.blobs.list_ids("blobs")) == live
        assert set(bm.blobs.list_ids("index")) == {index_id}
    with RestoreManager(store, config=cfg, clock=clock) as rm:
        rm.restore(index_id, tmp_path / "host2")
    assert read_tree(tmp_path / "host2") == expected


def test_sigkill_mid_upload_loses_nothing_committed(tmp_path):
    store, src, record, committed = first_commit(tmp_path)
    before = len(list(store.list("backup/blobs/")))
    proc = spawn(str(store.root), str(src), str(record), "backup")
    kill_when(proc, lambda: len(list(store.list("backup/blobs/"))) >= before + 15)
    restart_and_check(tmp_path, store, record, committed)


def test_sigkill_mid_cleanup_is_redone_on_restart(tmp_path):
    store, src, record, _ = first_commit(tmp_path)
    first = record.read_text()
    proc = spawn(str(store.root), str(src), str(record), "backup")
    kill_when(proc, lambda: record.read_text() != first)
    expected = read_tree(src)
    restart_and_check(tmp_path, store, record, expected)


def test_sigkill_mid_restore_leaves_target_untouched(tmp_path):
    store, src, record, committed = first_commit(tmp_path)
    target = tmp_path / "state"
    write_tree(target, {"previous": b"state"})
    proc = spawn(str(store.root), str(src), str(record), "restore", str(target))
    kill_when(proc, lambda: any((tmp_path).glob(".state.hr-restore-*/data/*")))
    assert read_tree(target) == {"previous": b"state"}
    with RestoreManager(store, config=BackupConfig(chunk_size=4096)) as rm:
        rm.restore(record.read_text(), target, force=True)  # "previous" is not a restore
    assert read_tree(target) == committed
    # no staging or old folder left; the restore marker records the restore
    assert [p.name for p in tmp_path.glob(".state.hr-*")] == [".state.hr-backup"]


def test_sigkill_mid_sweep_then_sweep_again(tmp_path):
    store, src, record, committed = first_commit(tmp_path)
    # garbage of many abandoned uploads, already expired (born with a 1 ms TTL)
    with BackupManager(store, config=BackupConfig(chunk_size=4096, ttl_ms=1)) as bm:
        for i in range(3):
            bm.upload(src, f"abandoned-{i}")
    time.sleep(0.01)
    before = len(list(store.list("backup/blobs/")))
    proc = spawn(str(store.root), str(src), str(record), "sweep")
    # the sweep deletes indexes first, then blobs in one delete_many: kill between them or
    # during the blob deletes
    kill_when(proc, lambda: len(list(store.list("backup/index/"))) < 4)
    assert len(list(store.list("backup/blobs/"))) <= before
    restart_and_check(tmp_path, store, record, committed)
