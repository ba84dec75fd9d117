"""A real RocksDB (rocksdict): checkpoint, back up, mutate, back up again, restore, open, compare."""

from __future__ import annotations

import random

import pytest

from headrace.backup import BackupConfig, BackupManager, RestoreManager
from headrace.store import CountingStore, LocalStore, open_store

rocksdict = pytest.importorskip("rocksdict")


def checkpoint(db, path) -> None:
    db.flush()
    rocksdict.Checkpoint(db).create_checkpoint(str(path))


def contents(path) -> dict:
    db = rocksdict.Rdict(str(path))
    try:
        return dict(db.items())
    finally:
        db.close()


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_rocksdb_checkpoint_backup_and_restore(backend, tmp_path, request):
    if backend == "local":
        store = CountingStore(LocalStore(tmp_path / "store"))
    else:
        store = CountingStore(open_store(request.getfixturevalue("s3_url")))
    rnd = random.Random(5)
    db = rocksdict.Rdict(str(tmp_path / "db"))
    for i in range(3000):
        db[f"key-{i:05d}"] = rnd.randbytes(200)
    db.flush()
    for i in range(3000, 4000):
        db[f"key-{i:05d}"] = rnd.randbytes(200)
    checkpoint(db, tmp_path / "cp1")
    cfg = BackupConfig(chunk_size=64 << 10)
    with BackupManager(store, config=cfg) as bm:
        first = bm.upload(tmp_path / "cp1", "1")
        bm.cleanup(first)
        # mutate: overwrite, delete, add; flush makes a new SST, the old SSTs stay
        for i in range(0, 4000, 7):
            db[f"key-{i:05d}"] = b"updated"
        for i in range(1, 4000, 11):
            del db[f"key-{i:05d}"]
        for i in range(4000, 4500):
            db[f"key-{i:05d}"] = rnd.randbytes(100)
        checkpoint(db, tmp_path / "cp2")
        store.reset()
        second = bm.upload(tmp_path / "cp2", "2")
        bm.cleanup(second)
        assert bm.metrics()["files_retained"] >= 2  # the unchanged SSTs were not sent again
    source = dict(db.items())
    db.close()
    with RestoreManager(store, config=cfg) as rm:
        result = rm.restore(second, tmp_path / "elsewhere" / "db")
    assert result.files_downloaded > 0
    restored = contents(tmp_path / "elsewhere" / "db")
    assert restored == source
    assert restored["key-00007"] == b"updated" and "key-00001" not in restored
    assert len(restored) == len(source) > 4000
