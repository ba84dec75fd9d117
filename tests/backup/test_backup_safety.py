"""Issue 15.8 and issue 16 (backup): restore never follows a symlink out of its target and never
wipes an unrelated folder; file modes round-trip; a snapshot a kept index still uses is never
deleted; unchanged files are not uploaded again whatever their name."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
from backup_testlib import read_tree, write_tree

from headrace.backup import BackupConfig, BackupManager, RestoreManager
from headrace.backup.errors import RestoreTargetNotEmpty
from headrace.codec import ManualClock
from headrace.store import CountingStore, LocalStore, open_store

CFG = BackupConfig(chunk_size=8192, upload_workers=3, download_workers=3)
HOUR_MS = 3_600_000


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return open_store(request.getfixturevalue("s3_url"))


def modes(root) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
            for p in sorted(root.rglob("*")) if p.is_file()}


def inodes(root) -> dict[str, tuple[int, int, int]]:
    """name -> (mode, link count, inode) of every entry, without following links."""
    return {p.name: (p.lstat().st_mode, p.lstat().st_nlink, p.lstat().st_ino)
            for p in root.iterdir()}


def backup(store, src, clock=None) -> str:
    with BackupManager(store, config=CFG, clock=clock) as bm:
        index_id = bm.upload(src, "c1")
        bm.cleanup(index_id)
    return index_id


# -- symlinks in the target ------------------------------------------------------------------
def test_symlinked_directory_in_the_target_is_replaced_never_followed(tmp_path):
    """A previous restore whose subdirectory was replaced by a link to a folder outside holding
    the snapshot's files: the restore neither hard-links nor chmods those files; the link is
    replaced by a real directory and its files are downloaded."""
    store = LocalStore(tmp_path / "store")
    a, b = os.urandom(20_000), os.urandom(3_000)
    src = tmp_path / "src"
    write_tree(src, {"top.sst": b"t" * 5000, "sub": {"a.sst": a, "b.txt": b}})
    os.chmod(src / "sub" / "a.sst", 0o644)
    os.chmod(src / "sub" / "b.txt", 0o644)
    index_id = backup(store, src)
    target = tmp_path / "state"
    outside = tmp_path / "outside"
    write_tree(outside, {"a.sst": a, "b.txt": b, "mine": b"keep"})
    os.chmod(outside / "a.sst", 0o600)
    os.chmod(outside / "b.txt", 0o600)
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(index_id, target)  # a previous restore of this backup: may be replaced
        shutil.rmtree(target / "sub")
        os.symlink(outside, target / "sub")
        before = inodes(outside)
        result = rm.restore(index_id, target)
    assert inodes(outside) == before  # no chmod, no extra hard link on a file outside
    assert read_tree(outside) == {"a.sst": a, "b.txt": b, "mine": b"keep"}
    assert (target / "sub").is_dir() and not (target / "sub").is_symlink()
    assert read_tree(target) == read_tree(src)
    assert result.files_downloaded == 2 and result.files_reused == 1  # top.sst kept
    assert (target / "sub" / "a.sst").stat().st_ino != (outside / "a.sst").stat().st_ino


def test_target_that_is_a_symlink_is_refused_and_forced_replaces_only_the_link(tmp_path):
    store = LocalStore(tmp_path / "store")
    tree = {"a.sst": os.urandom(20_000), "sub": {"b.txt": b"bee"}}
    src = tmp_path / "src"
    write_tree(src, tree)
    index_id = backup(store, src)
    outside = tmp_path / "outside"
    write_tree(outside, tree)  # holds exactly the snapshot, but is not the target
    os.chmod(outside / "a.sst", 0o600)
    target = tmp_path / "state"
    os.symlink(outside, target)
    before = inodes(outside)
    with RestoreManager(store, config=CFG) as rm:
        with pytest.raises(RestoreTargetNotEmpty, match="symlink") as err:
            rm.restore(index_id, target)
        assert str(target) in str(err.value)
        assert target.is_symlink() and inodes(outside) == before
        result = rm.restore(index_id, target, force=True)
    assert not result.reused_directory and result.files_reused == 0
    assert target.is_dir() and not target.is_symlink()
    assert read_tree(target) == tree and read_tree(outside) == tree
    assert inodes(outside) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".src.hr-backup", ".state.hr-backup", "outside", "src", "state", "store"]


def test_hard_linked_file_in_the_target_is_not_reused(tmp_path):
    """A target file that shares its inode with a file elsewhere is downloaded, not linked:
    setting its mode would change the other file."""
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, {"a.sst": os.urandom(20_000), "b.sst": os.urandom(9_000)})
    os.chmod(src / "a.sst", 0o644)
    index_id = backup(store, src)
    target = tmp_path / "state"
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(index_id, target)
        elsewhere = tmp_path / "elsewhere.sst"
        os.link(target / "a.sst", elsewhere)
        os.chmod(elsewhere, 0o600)
        result = rm.restore(index_id, target)
    assert not result.reused_directory and result.files_reused == 1
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o600 and elsewhere.stat().st_nlink == 1
    assert modes(target) == modes(src) and read_tree(target) == read_tree(src)


# -- modes -----------------------------------------------------------------------------------
def test_modes_round_trip_for_retained_kept_and_linked_files(tmp_path):
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, {"a.sst": os.urandom(20_000), "run.sh": b"#!/bin/sh\necho hi\n",
                     "MANIFEST": os.urandom(600), "sub": {"big.log": os.urandom(50_000)}})
    for rel, mode in [("a.sst", 0o640), ("run.sh", 0o755), ("MANIFEST", 0o600),
                      ("sub/big.log", 0o444)]:
        os.chmod(src / rel, mode)
    with BackupManager(store, config=CFG) as bm:
        first = bm.upload(src, "c1")
        bm.cleanup(first)
        # a chmod alone (same bytes, size and mtime): retained, the new mode recorded
        os.chmod(src / "a.sst", 0o600)
        os.chmod(src / "sub" / "big.log", 0o644)
        second = bm.upload(src, "c2")
        bm.cleanup(second)
        assert bm.metrics()["files_uploaded"] == 4  # the first upload only
    dst = tmp_path / "dst"
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(second, dst)
        assert modes(dst) == modes(src)
        # host affinity keeps the directory and puts the snapshot's modes back
        os.chmod(dst / "a.sst", 0o666)
        os.chmod(dst / "run.sh", 0o644)
        assert rm.restore(second, dst).reused_directory
        assert modes(dst) == modes(src)
        # a rebuild that hard-links the local files gives them the snapshot's modes too
        os.chmod(dst / "a.sst", 0o666)
        (dst / "extra").write_bytes(b"x")
        result = rm.restore(second, dst)
        assert not result.reused_directory and result.files_reused == 4
    assert modes(dst) == modes(src) and read_tree(dst) == read_tree(src)


# -- what cleanup and the sweep may delete ---------------------------------------------------
def test_cleanup_never_deletes_blobs_another_committed_snapshot_uses(store, tmp_path):
    """Two snapshots branch from X: one keeps gone.sst, the other removed it. Committing the
    second must not delete gone.sst's blobs: the first, committed, still uses them."""
    src = tmp_path / "src"
    tree = {"keep.sst": os.urandom(20_000), "gone.sst": os.urandom(20_000)}
    write_tree(src, tree)
    x = backup(store, src)
    with BackupManager(store, config=CFG, previous_index_blob_id=x) as bm1, \
            BackupManager(store, config=CFG, previous_index_blob_id=x) as bm2:
        n1 = bm1.upload(src, "n1")  # retains gone.sst
        os.unlink(src / "gone.sst")
        n2 = bm2.upload(src, "n2")  # removes it
        bm1.cleanup(n1)
        bm2.cleanup(n2)
        assert bm2.metrics()["blobs_deleted"] == 0
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(n1, tmp_path / "one")
        rm.restore(n2, tmp_path / "two")
    assert read_tree(tmp_path / "one") == tree
    assert read_tree(tmp_path / "two") == {"keep.sst": tree["keep.sst"]}


def test_a_snapshot_kept_by_a_later_one_survives_cleanup_and_the_sweep(store, tmp_path):
    clock = ManualClock()
    cfg = BackupConfig(chunk_size=8192, ttl_ms=HOUR_MS)
    src = tmp_path / "src"
    old_tree = {"a.sst": os.urandom(20_000), "old.sst": os.urandom(20_000)}
    write_tree(src, old_tree)
    with BackupManager(store, config=cfg, clock=clock) as bm:
        x = bm.upload(src, "x")
        bm.cleanup(x)
    os.unlink(src / "old.sst")
    (src / "new.sst").write_bytes(b"n" * 9000)
    with BackupManager(store, config=cfg, clock=clock, previous_index_blob_id=x,
                       keep_previous=True) as bm:
        n = bm.upload(src, "n")
        bm.cleanup(n)
        assert bm.blobs.get_index(n).keep_previous
        clock.advance(2 * HOUR_MS / 1000)
        bm.sweep()
        # even with its permanent marker lost, the sweep keeps what a live index keeps
        store.delete(bm.blobs.marker_key(x))
        report = bm.sweep()
        assert report.indexes_deleted == 0 and report.blobs_deleted == 0
    with RestoreManager(store, config=cfg, clock=clock) as rm:
        rm.restore(x, tmp_path / "x", redo_cleanup=False)
        rm.restore(n, tmp_path / "n")
    assert read_tree(tmp_path / "x") == old_tree
    assert read_tree(tmp_path / "n") == read_tree(src)


# -- refusing to wipe an unrelated folder ----------------------------------------------------
def test_restore_refuses_a_non_empty_target_that_is_not_a_previous_restore(tmp_path):
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    tree = {"a.sst": os.urandom(20_000), "sub": {"b": b"bee"}}
    write_tree(src, tree)
    index_id = backup(store, src)
    photos = tmp_path / "photos"
    write_tree(photos, {"cat.jpg": b"meow"})
    with RestoreManager(store, config=CFG) as rm:
        with pytest.raises(RestoreTargetNotEmpty) as err:
            rm.restore(index_id, photos)
        assert isinstance(err.value, FileExistsError) and str(photos) in str(err.value)
        assert "force" in str(err.value)
        assert read_tree(photos) == {"cat.jpg": b"meow"}
        assert not list(tmp_path.glob(".photos*"))
        # a previous restore of *another* backup (another prefix) is not ours either
        with BackupManager(store, prefix="other", config=CFG) as bm:
            other = bm.upload(src, "o")
        with RestoreManager(store, prefix="other", config=CFG) as rm_other:
            rm_other.restore(other, tmp_path / "o")
        (tmp_path / "o" / "a.sst").write_bytes(b"changed")
        with pytest.raises(RestoreTargetNotEmpty):
            rm.restore(index_id, tmp_path / "o")
        # an empty folder, a previous restore (even changed since) and --force are replaced
        (tmp_path / "empty").mkdir()
        rm.restore(index_id, tmp_path / "empty")
        (tmp_path / "empty" / "a.sst").write_bytes(b"local change")
        (tmp_path / "empty" / "new").write_bytes(b"new")
        rm.restore(index_id, tmp_path / "empty")
        assert read_tree(tmp_path / "empty") == tree
        rm.restore(index_id, photos, force=True)
        assert read_tree(photos) == tree
        # the directory that was backed up, unchanged, already is the snapshot: kept
        assert rm.restore(index_id, src).reused_directory
        # changed since, it is still this backup's own folder: rolled back without force
        (src / "a.sst").write_bytes(b"newer")
        assert not rm.restore(index_id, src).reused_directory
        assert read_tree(src) == tree


# -- unchanged files are not sent again ------------------------------------------------------
def test_unchanged_files_are_not_uploaded_again_whatever_their_suffix(tmp_path):
    store = CountingStore(LocalStore(tmp_path / "store"))
    src = tmp_path / "src"
    write_tree(src, {"data.log": os.urandom(3 * 8192 + 5), "state.json": os.urandom(3000),
                     "x.sst": os.urandom(10_000), "sub": {"OPTIONS": os.urandom(100)}})
    with BackupManager(store, config=CFG) as bm:
        first = bm.upload(src, "c1")
        bm.cleanup(first)
        store.reset()
        second = bm.upload(src, "c2")
        assert store.counts()["puts"] == 1  # the index only: no file is sent again
        assert bm.metrics()["files_uploaded"] == 4
        bm.cleanup(second)
        # rewritten in place keeping size and mtime: the content hash catches it
        st = os.stat(src / "data.log")
        changed = os.urandom(st.st_size)
        (src / "data.log").write_bytes(changed)
        os.utime(src / "data.log", ns=(st.st_atime_ns, st.st_mtime_ns))
        store.reset()
        third = bm.upload(src, "c3")
        assert store.counts()["puts"] == 4 + 1  # data.log's 4 chunks + the index
        bm.cleanup(third)
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(third, tmp_path / "dst")
    assert (tmp_path / "dst" / "data.log").read_bytes() == changed
    assert read_tree(tmp_path / "dst") == read_tree(src)
