"""Host affinity and the diff decide equality by content hash, never by crc32 alone.

A file whose last 4 bytes are the little-endian crc32 of the bytes before them (the spine
catalog ``checkpoints.headrace`` has this layout) always has the same whole-file crc32, the
CRC residue 0x2144DF1C: two such files of equal size are indistinguishable by size + crc32.
"""

from __future__ import annotations

import json
import os
import zlib

from backup_testlib import read_tree, sample_tree, write_tree
from blake3 import blake3

from headrace.backup import (
    SCHEMA_VERSION,
    BackupConfig,
    BackupManager,
    RestoreManager,
    decode_index,
)
from headrace.backup.digest import chunk_digest, content_hash, local_file_digests
from headrace.backup.index import FORMAT_NAME
from headrace.store import CountingStore, LocalStore

CFG = BackupConfig(chunk_size=8192, upload_workers=3, download_workers=3)
RESIDUE = 0x2144DF1C


def self_checked(payload: bytes) -> bytes:
    """``payload`` followed by its own little-endian crc32 (the catalog's layout)."""
    return payload + zlib.crc32(payload).to_bytes(4, "little")


def write_as_v1(store, index_id: str, new_id: str) -> None:
    """Store a copy of an index as schemaVersion 1 wrote it (no contentHash fields)."""
    body = json.loads(store.get(f"backup/index/{index_id}").data)["snapshotIndex"]
    body["schemaVersion"] = 1

    def strip(d: dict) -> None:
        for f in d["filesPresent"] + d["filesRemoved"]:
            f.pop("contentHash")
        for s in d["subDirsPresent"] + d["subDirsRemoved"]:
            strip(s)

    strip(body["dirIndex"])
    raw = json.dumps(body, separators=(",", ":")).encode()
    store.put(f"backup/index/{new_id}", f'{{"format":"{FORMAT_NAME}","crc32":'
                                        f'"{zlib.crc32(raw):08x}","snapshotIndex":'.encode()
              + raw + b"}")
    decode_index(store.get(f"backup/index/{new_id}").data)  # a valid index


def test_stale_self_checked_file_of_the_same_size_is_downloaded(tmp_path):
    store = CountingStore(LocalStore(tmp_path / "store"))
    src = tmp_path / "src"
    backed_up = self_checked(b"catalog: checkpoint 2 of 2 " * 40)
    stale = self_checked(b"catalog: checkpoint 1 of 2 " * 40)
    assert len(stale) == len(backed_up) and stale != backed_up
    assert zlib.crc32(stale) == zlib.crc32(backed_up) == RESIDUE
    write_tree(src, {"checkpoints.headrace": backed_up, "a.batch": os.urandom(20_000)})
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
        bm.cleanup(index_id)
    # the directory holds the changed (stale) file: same size, same whole-file crc32
    (src / "checkpoints.headrace").write_bytes(stale)
    target = tmp_path / "state"
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(index_id, target)
        (target / "checkpoints.headrace").write_bytes(stale)
        for where in (target, src):
            store.reset()
            result = rm.restore(index_id, where, force=where == src)  # src: never restored
            assert not result.reused_directory
            assert result.files_downloaded == 1 and result.files_reused == 1
            assert (where / "checkpoints.headrace").read_bytes() == backed_up
            assert store.counts()["gets"] == 2  # the index and the catalog's blob
        # now it is current: reused, no file blob read
        store.reset()
        assert rm.restore(index_id, target).reused_directory
        assert store.counts()["gets"] == 1


def test_diff_sends_a_rewritten_self_checked_immutable_file(tmp_path):
    """Small immutable files are compared by content too: a rewrite of equal size that still
    ends with its own crc32 is uploaded, not retained."""
    store = CountingStore(LocalStore(tmp_path / "store"))
    src = tmp_path / "src"
    old, new = self_checked(b"x" * 5000), self_checked(b"y" * 5000)
    write_tree(src, {"000007.batch": old})
    with BackupManager(store, config=CFG) as bm:
        first = bm.upload(src, "c1")
        bm.cleanup(first)
        (src / "000007.batch").write_bytes(new)
        second = bm.upload(src, "c2")
        assert bm.metrics()["files_uploaded"] == 2 and bm.metrics()["files_retained"] == 0
        bm.cleanup(second)
    with RestoreManager(store, config=CFG) as rm:
        rm.restore(second, tmp_path / "dst")
    assert (tmp_path / "dst" / "000007.batch").read_bytes() == new


def test_every_present_file_has_its_content_hash(tmp_path):
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        index = bm.blobs.get_index(bm.upload(src, "c1"))
    assert index.schema_version == SCHEMA_VERSION == 3
    for rel, f in index.dir_index.walk_files():
        data = (src / rel).read_bytes()
        chunks = [data[b.offset:b.offset + b.size] for b in f.blobs]
        assert f.content_hash == content_hash(chunk_digest(c) for c in chunks)
        # the definition in docs/formats/backup-index.md, computed independently
        assert f.content_hash == blake3(b"".join(blake3(c).digest() for c in chunks)).hexdigest()
        assert local_file_digests(str(src / rel), [(b.offset, b.size) for b in f.blobs]) == (
            zlib.crc32(data), f.content_hash)
    multi = next(f for _, f in index.dir_index.walk_files() if len(f.blobs) > 1)
    assert multi.file_name == "000001.sst"


def test_schema_version_1_index_restores_and_downloads_instead_of_trusting_crc32(tmp_path):
    """An index written before the content hash still restores everywhere; host affinity then
    downloads every file (crc32 alone decides nothing)."""
    store = CountingStore(LocalStore(tmp_path / "store"))
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
        bm.cleanup(index_id)
    v1 = "01ARZ3NDEKTSV4RRFFQ69G5FAV-9999999999999"
    write_as_v1(store, index_id, v1)
    with RestoreManager(store, config=CFG) as rm:
        result = rm.restore(v1, tmp_path / "new-host", redo_cleanup=False)
        assert result.files_downloaded == 7
        assert read_tree(tmp_path / "new-host") == sample_tree()
        result = rm.restore(v1, src, redo_cleanup=False, force=True)
        assert not result.reused_directory and result.files_reused == 0
        assert read_tree(src) == sample_tree()


def test_backup_after_a_version_1_index_fills_hashes_without_uploading_again(tmp_path):
    """Upgrading: the first backup diffing against a version 1 index retains the unchanged
    immutable files (no upload) and reads them once to record their content hashes; the new
    index then gives full host affinity."""
    store = CountingStore(LocalStore(tmp_path / "store"))
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=CFG) as bm:
        index_id = bm.upload(src, "c1")
    v1 = "01ARZ3NDEKTSV4RRFFQ69G5FAV-9999999999999"
    write_as_v1(store, index_id, v1)
    with BackupManager(store, config=CFG, previous_index_blob_id=v1) as bm:
        second = bm.upload(src, "c2")
        m = bm.metrics()
        index = bm.blobs.get_index(second)
    # the .sst / .batch files are retained; MANIFEST, CURRENT and empty.txt are mutable
    assert m["files_retained"] == 4 and m["files_uploaded"] == 3
    assert all(f.content_hash is not None for _, f in index.dir_index.walk_files())
    with RestoreManager(store, config=CFG) as rm:
        store.reset()
        assert rm.restore(second, src, redo_cleanup=False).reused_directory
        assert store.counts()["gets"] == 1
