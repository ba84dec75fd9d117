"""The seed's backup/restore test plan, on the local store and on S3 (moto)."""

from __future__ import annotations

import os
import shutil

import pytest
from backup_testlib import read_tree, sample_tree, write_tree

from headrace.backup import BackupConfig, BackupManager, RestoreManager
from headrace.codec import ManualClock
from headrace.errors import ChecksumMismatch, FormatError, InvalidInput, NotFound
from headrace.store import CountingStore, FaultyStore, LocalStore, open_store

CFG = BackupConfig(chunk_size=8192, upload_workers=3, download_workers=3)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        inner = LocalStore(tmp_path / "store")
    else:
        inner = open_store(request.getfixturevalue("s3_url"))
    return CountingStore(inner)


def blob_keys(store) -> set[str]:
    return {m.key for m in store.list("backup/blobs/")}


def test_first_upload_and_restore_on_new_host(store, tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "ckpt-1")
        bm.cleanup(index_id)
        metrics = bm.metrics()
    assert metrics["files_uploaded"] == 7 and metrics["files_retained"] == 0
    assert metrics["blobs_uploaded"] == 15 and metrics["index_bytes"] > 0
    # 70,000 bytes in 8 KiB chunks -> 9 blobs; files below 8 KiB share one pack blob (000002.sst,
    # MANIFEST, CURRENT); empty files have no blob
    assert len(blob_keys(store)) == 9 + 1 + 3 + 2
    with RestoreManager(store, config=CFG) as rm:
        result = rm.restore(index_id, tmp_path / "host2" / "state")
        index = rm.read_index(index_id)
    assert not result.reused_directory and result.files_downloaded == 7
    assert read_tree(tmp_path / "host2" / "state") == sample_tree()
    assert index.checkpoint_id == "ckpt-1" and index.prev_snapshot_index_blob_id is None
    assert (tmp_path / "host2" / "state" / "emptydir").is_dir()
    assert (tmp_path / "host2" / "state" / "sub/deep/deeper/nothing").is_dir()


def test_incremental_upload_sends_only_new_files(store, tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        first = bm.upload(src, "c1")
        bm.cleanup(first)
        # an LSM step: one SST compacted away, one new SST, the manifest rewritten
        os.unlink(src / "000002.sst")
        (src / "000003.sst").write_bytes(b"n" * 10_000)  # 2 chunks
        (src / "MANIFEST-000001").write_bytes(b"m" * 600)
        store.reset()
        second = bm.upload(src, "c2")
        puts = store.counts()["puts"]
        # 2 chunks of the new SST + one pack of the rewritten MANIFEST + the index; CURRENT and
        # empty.txt are unchanged (size, mtime, content hash): retained, not sent again
        assert puts == 2 + 1 + 1
        assert bm.metrics()["files_retained"] == 3 + 2  # 3 immutable + CURRENT, empty.txt
        old_blobs = blob_keys(store)
        bm.cleanup(second)
    index = RestoreManager(store, config=CFG).read_index(second)
    assert index.prev_snapshot_index_blob_id == first
    assert {f.file_name for f in index.dir_index.files_removed} == {
        "000002.sst", "MANIFEST-000001"}
    # cleanup deleted the previous index; the old pack (000002.sst, MANIFEST, CURRENT) stays:
    # the retained CURRENT still uses it
    assert old_blobs == blob_keys(store)
    assert not store.exists(f"backup/index/{first}")
    assert store.exists(f"backup/permanent/{second}")
    expected = sample_tree()
    del expected["000002.sst"]
    expected["000003.sst"] = b"n" * 10_000
    expected["MANIFEST-000001"] = b"m" * 600
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(second, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == expected


def test_removed_files_and_subdirectories(store, tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        bm.cleanup(bm.upload(src, "c1"))
        shutil.rmtree(src / "sub")
        os.unlink(src / "empty.txt")
        (src / "newdir" / "x").mkdir(parents=True)
        (src / "newdir" / "x" / "f.sst").write_bytes(b"f" * 100)
        second = bm.upload(src, "c2")
        index = bm.blobs.get_index(second)
        assert [d.dir_name for d in index.dir_index.sub_dirs_removed] == ["sub"]
        removed_sub = index.dir_index.sub_dirs_removed[0]
        assert removed_sub.files_removed == ()  # older removal lists do not travel
        bm.cleanup(second)
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(second, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == read_tree(src)
    # every blob left is referenced by the committed snapshot
    referenced = {f"backup/blobs/{b}" for b in index.dir_index.present_blob_ids()}
    assert blob_keys(store) == referenced


def test_restore_reuses_identical_local_checkpoint(store, tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
        bm.cleanup(index_id)
    target = tmp_path / "state"
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(index_id, target)
        store.reset()
        result = rm.restore(index_id, target)
    assert result.reused_directory and result.files_downloaded == 0
    assert rm.metrics()["restores_reused"] == 1 and rm.metrics()["restores"] == 2
    assert store.counts()["gets"] == 1  # the index only: 0 GETs of file blobs
    # a partly changed target: matching files are linked, only the rest is downloaded
    (target / "000001.sst").write_bytes(b"changed")
    (target / "stray.log").write_bytes(b"x")
    store.reset()
    with RestoreManager(store, config=CFG) as rm:
        result = rm.restore(index_id, target)
    assert not result.reused_directory and result.files_downloaded == 1
    assert store.counts()["gets"] == 1 + 9
    assert read_tree(target) == sample_tree()


def test_multichunk_file_restored_in_order(store, tmp_path):
    src = tmp_path / "src"
    data = b"".join(i.to_bytes(4, "little") for i in range(100_000))  # 400 kB, 49 chunks
    write_tree(src, {"big.sst": data})
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
    index = bm.blobs.get_index(index_id)
    blobs = index.dir_index.files_present[0].blobs
    assert len(blobs) == 49 and [b.offset for b in blobs] == list(range(0, 400_000, 8192))
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(index_id, tmp_path / "dst", redo_cleanup=False)
    assert (tmp_path / "dst" / "big.sst").read_bytes() == data


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupted_blob_fails_loudly_and_target_untouched(store, tmp_path, how):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
    target = tmp_path / "state"
    write_tree(target, {"old-file": b"keep me"})
    faulty = FaultyStore(store, seed=3, corrupt_get=how,
                         corrupt_keys=lambda k: "/blobs/" in k or k.startswith("blobs/"))
    with RestoreManager(faulty, config=CFG) as rm, pytest.raises(FormatError) as err:
        rm.restore(index_id, target, force=True)
    assert "chunk at offset" in str(err.value) and "backup/blobs/" in str(err.value)
    if how == "flip":
        assert isinstance(err.value, ChecksumMismatch)
    assert read_tree(target) == {"old-file": b"keep me"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".state")] == []


def test_missing_blob_and_missing_index_are_clear_errors(store, tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a.sst": b"a" * 100})
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
    store.delete_many(sorted(blob_keys(store)))
    with RestoreManager(store, config=CFG) as rm:
        with pytest.raises(NotFound, match="backup/blobs/"):
            rm.restore(index_id, tmp_path / "dst")
        assert not (tmp_path / "dst").exists()
        with pytest.raises(NotFound):
            rm.restore("01ARZ3NDEKTSV4RRFFQ69G5FAV-1", tmp_path / "dst")
        with pytest.raises(FormatError):
            rm.restore("../../etc/passwd", tmp_path / "dst")


def test_progress_reports_files_and_bytes(tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    seen = []
    with BackupManager(LocalStore(tmp_path / "s"), config=CFG, progress=seen.append) as bm:
        index_id = bm.upload(src, "c1")
    last = seen[-1]
    assert last.phase == "upload" and last.files_done == last.files_total == 7
    assert last.bytes_done == last.bytes_total == sum(
        len(v) for v in [*sample_tree().values(), *[]] if isinstance(v, bytes)) + 29_000
    got = []
    with RestoreManager(LocalStore(tmp_path / "s"), config=CFG, progress=got.append) as rm:
        rm.restore(index_id, tmp_path / "dst")
    assert got[-1].phase == "download" and got[-1].bytes_done == last.bytes_total


def test_symlinks_are_refused(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a": b"1"})
    (src / "link").symlink_to("/etc/passwd")
    with BackupManager(LocalStore(tmp_path / "s"), config=CFG) as bm, \
            pytest.raises(InvalidInput, match="symlink"):
        bm.upload(src, "c1")


def test_config_validation_names_the_field():
    for kwargs, name in [({"chunk_size": 1}, "chunk_size"), ({"upload_workers": 0},
                         "upload_workers"), ({"ttl_ms": 0}, "ttl_ms"),
                         ({"immutable_patterns": "*.sst"}, "immutable_patterns")]:
        with pytest.raises(ValueError, match=name):
            BackupConfig(**kwargs)


def test_immutable_rewrite_of_small_file_is_detected_by_crc(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"x.sst": b"a" * 1000})
    clock = ManualClock()
    with BackupManager(LocalStore(tmp_path / "s"), config=CFG, clock=clock) as bm:
        bm.cleanup(bm.upload(src, "c1"))
        (src / "x.sst").write_bytes(b"b" * 1000)  # same name and size, new content
        second = bm.upload(src, "c2")
        bm.cleanup(second)
    with RestoreManager(LocalStore(tmp_path / "s"), config=CFG) as rm:
        rm.restore(second, tmp_path / "dst")
    assert (tmp_path / "dst" / "x.sst").read_bytes() == b"b" * 1000


def test_small_files_share_a_pack_blob_until_all_are_removed(tmp_path):
    store = CountingStore(LocalStore(tmp_path / "store"))
    src = tmp_path / "src"
    write_tree(src, {f"{i}.sst": bytes([i]) * 100 for i in range(5)})
    with BackupManager(store, config=CFG) as bm:
        store.reset()
        bm.cleanup(bm.upload(src, "c1"))
        assert store.counts()["puts"] == 1 + 1 + 1  # one pack, the index, the marker
        assert len(blob_keys(store)) == 1
        (src / "2.sst").unlink()
        second = bm.upload(src, "c2")
        bm.cleanup(second)
        assert len(blob_keys(store)) == 1  # the pack still holds four live files
        with RestoreManager(store, config=CFG) as rm:
            rm.restore(second, tmp_path / "dst")
        assert read_tree(tmp_path / "dst") == read_tree(src)
        for p in src.iterdir():
            p.unlink()
        bm.cleanup(bm.upload(src, "c3"))
        assert blob_keys(store) == set()


def test_affinity_needs_the_same_directories_too(tmp_path):
    """Found by the state machine: a target lacking only an empty directory is not reused."""
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, {"a.sst": b"a"})
    with BackupManager(store, config=CFG) as bm, RestoreManager(store, config=CFG) as rm:
        rm.restore(bm.upload(src, "c1"), tmp_path / "dst")
        (src / "empty").mkdir()
        result = rm.restore(bm.upload(src, "c2"), tmp_path / "dst")
    assert not result.reused_directory and result.files_reused == 1
    assert read_tree(tmp_path / "dst") == {"a.sst": b"a", "empty": {}}


def test_file_vanishing_during_backup_is_a_typed_error_naming_it(tmp_path, monkeypatch):
    from headrace.backup import diff as diff_module

    src = tmp_path / "src"
    write_tree(src, {"a.sst": b"a" * 10})
    real_scan = diff_module._scan

    def scan_then_delete(path, rel):
        out = real_scan(path, rel)
        (src / "a.sst").unlink(missing_ok=True)
        return out

    monkeypatch.setattr(diff_module, "_scan", scan_then_delete)
    with BackupManager(LocalStore(tmp_path / "s"), config=CFG) as bm, \
            pytest.raises(InvalidInput, match="a.sst"):
        bm.upload(src, "c1")


def test_affinity_by_mtime_reads_no_local_file(tmp_path, monkeypatch):
    from headrace.backup import restore as restore_module

    store = CountingStore(LocalStore(tmp_path / "store"))
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    cfg = BackupConfig(chunk_size=8192, affinity_check="mtime")
    with BackupManager(store, config=cfg) as bm:
        index_id = bm.upload(src, "c1")
    with RestoreManager(store, config=cfg) as rm:
        rm.restore(index_id, tmp_path / "dst")
        monkeypatch.setattr(restore_module, "local_file_digests",
                            lambda p, chunks: pytest.fail("read " + p))
        store.reset()
        assert rm.restore(index_id, tmp_path / "dst").reused_directory
        assert store.counts()["gets"] == 1
        # the source itself (backed up, never restored) also matches by size + mtime
        assert rm.restore(index_id, src).reused_directory
    with pytest.raises(ValueError, match="affinity_check"):
        BackupConfig(affinity_check="size")


def test_names_an_index_could_not_hold_are_refused_at_backup(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"bad\nname": b"1"})
    with BackupManager(LocalStore(tmp_path / "s"), config=CFG) as bm, \
            pytest.raises(InvalidInput, match="control characters"):
        bm.upload(src, "c1")


def test_restore_fsyncs_every_file_and_directory_before_the_swap(tmp_path, monkeypatch):
    """Durability: every restored file (data, mode, mtime) and every directory is fsynced
    before the staging folder is renamed over the target; modes without read permission
    (0o200, 0o000: backed up as root, which reads any file) are restored too."""
    from headrace.backup import restore as restore_module

    src = tmp_path / "src"
    write_tree(src, sample_tree())
    modes = (0o200, 0o000) if os.geteuid() == 0 else (0o400, 0o444)
    os.chmod(src / "000002.sst", modes[0])
    os.chmod(src / "sub" / "a.sst", modes[1])
    store = LocalStore(tmp_path / "store")
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
    synced: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename
    renamed_after: list[int] = []

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def rename(a, b):
        if ".hr-restore-" in str(a):
            renamed_after.append(len(synced))
        real_rename(a, b)

    monkeypatch.setattr(restore_module.os, "fsync", fsync)
    monkeypatch.setattr(restore_module.os, "rename", rename)
    try:
        with RestoreManager(store, config=CFG) as rm:
            rm.restore(index_id, tmp_path / "dst")
    finally:
        monkeypatch.undo()
    staged = {p.split(".hr-restore-", 1)[1].partition("/")[2]
              for p in synced[:renamed_after[0]] if ".hr-restore-" in p}
    want_files = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()}
    want_dirs = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_dir()} | {""}
    assert want_files | want_dirs <= staged
    assert str(tmp_path) in synced[renamed_after[0]:]  # then the parent, after the swap
    dst = tmp_path / "dst"
    assert (dst / "000002.sst").stat().st_mode & 0o777 == modes[0]
    assert (dst / "sub" / "a.sst").stat().st_mode & 0o777 == modes[1]
    for p in (src / "000002.sst", src / "sub" / "a.sst", dst / "000002.sst", dst / "sub/a.sst"):
        os.chmod(p, 0o644)
    assert read_tree(dst) == read_tree(src)
