"""The index format: round trip, validation of hostile indexes, corruption and fuzzing."""

from __future__ import annotations

import json
import os
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.backup import (
    SCHEMA_VERSION,
    DirIndex,
    FileBlob,
    FileIndex,
    RestoreManager,
    SnapshotIndex,
    decode_index,
    encode_index,
)
from headrace.backup.crc import crc32_combine
from headrace.backup.digest import content_hash
from headrace.backup.index import FORMAT_NAME
from headrace.errors import ChecksumMismatch, FormatError
from headrace.store import LocalStore

B1 = "01ARZ3NDEKTSV4RRFFQ69G5FAV-1700000000000"
B2 = "01ARZ3NDEKTSV4RRFFQ69G5FAW-1700000000000"


def sample_index() -> SnapshotIndex:
    f1 = FileIndex("a.sst", (FileBlob(B1, 0, 10, 1), FileBlob(B2, 10, 5, 2)), 1, 2, 15, 7, 0o644,
                   "ab" * 32)
    empty = FileIndex("empty", (), 1, 2, 0, 0, 0o600, content_hash(()))
    sub = DirIndex("sub", (empty,), (), (DirIndex("deeper"),), ())
    gone = DirIndex("gone", (FileIndex("g", (FileBlob(B2, 0, 1, 3),), 0, 0, 1, 3, 0o644),))
    root = DirIndex("", (f1,), (empty,), (sub,), (gone,))
    return SnapshotIndex("ckpt-7", 1_700_000_000_000, root, B1, "job", "inst", "task", "store")


def seal_raw(raw: bytes) -> bytes:
    """A valid envelope around arbitrary (hostile) body bytes."""
    return (f'{{"format":"{FORMAT_NAME}","crc32":"{zlib.crc32(raw):08x}","snapshotIndex":'
            .encode() + raw + b"}")


def reseal(body: object) -> bytes:
    return seal_raw(json.dumps(body, separators=(",", ":")).encode())


def body_of(index: SnapshotIndex) -> dict:
    return json.loads(encode_index(index))["snapshotIndex"]


def test_round_trip_and_walks():
    idx = sample_index()
    data = encode_index(idx)
    assert json.loads(data)["format"] == FORMAT_NAME  # a plain JSON document
    assert decode_index(data, key="k") == idx
    assert [p for p, _ in idx.dir_index.walk_files()] == ["a.sst", "sub/empty"]
    assert list(idx.dir_index.walk_dirs()) == ["sub", "sub/deeper"]
    assert idx.dir_index.removed_blob_ids() == {B2}
    assert idx.total_bytes == 15 and idx.file_count == 2


def test_unknown_schema_version_refused():
    body = body_of(sample_index())
    for bad in (4, 0, "2", True):
        body["schemaVersion"] = bad
        with pytest.raises(FormatError, match="unknown schemaVersion"):
            decode_index(reseal(body), key="idx")


def test_schema_version_1_reads_without_content_hashes():
    """Version 1 indexes (no contentHash) still decode; their files have no content hash (a
    contentHash field in a version 1 body is not trusted: version 1 never wrote one)."""
    assert SCHEMA_VERSION == 3
    body = body_of(sample_index())
    body["schemaVersion"] = 1
    files = [body["dirIndex"]["filesPresent"][0], body["dirIndex"]["filesRemoved"][0]]
    files[0].pop("contentHash")
    got = decode_index(reseal(body))
    assert got.schema_version == 1
    assert [f.content_hash for _, f in got.dir_index.walk_files()] == [None, None]
    # version 2: a missing or null contentHash is None too (entries carried over from version 1)
    body = body_of(sample_index())
    body["dirIndex"]["filesPresent"][0].pop("contentHash")
    body["dirIndex"]["filesRemoved"][0]["contentHash"] = None
    got = decode_index(reseal(body))
    assert got.dir_index.files_present[0].content_hash is None
    assert got.dir_index.files_removed[0].content_hash is None
    assert got.dir_index.sub_dirs_present[0].files_present[0].content_hash == content_hash(())


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "/etc", "", "x\x00y", "a\\b"])
def test_unsafe_file_and_dir_names_refused(bad):
    body = body_of(sample_index())
    body["dirIndex"]["filesPresent"][0]["fileName"] = bad
    with pytest.raises(FormatError, match="unsafe name"):
        decode_index(reseal(body), key="idx")
    body = body_of(sample_index())
    body["dirIndex"]["subDirsPresent"][0]["dirName"] = bad
    with pytest.raises(FormatError, match="unsafe name"):
        decode_index(reseal(body), key="idx")


@pytest.mark.parametrize("mutate, what", [
    (lambda b: b["dirIndex"]["filesPresent"][0]["blobs"][1].update(offset=11), "offset 11"),
    (lambda b: b["dirIndex"]["filesPresent"][0].update(size=16), "chunks cover 15"),
    (lambda b: b["dirIndex"]["filesPresent"][0]["blobs"][0].update(blobId="../x"), "blob id"),
    (lambda b: b["dirIndex"]["filesPresent"][0].update(size=-1), "size"),
    (lambda b: b["dirIndex"]["filesPresent"][0].update(size=1.5), "size"),
    (lambda b: b.update(prevSnapshotIndexBlobId="nope"), "prevSnapshotIndexBlobId"),
    (lambda b: b["dirIndex"].update(dirName="x"), "root dirName"),
    (lambda b: b["dirIndex"]["subDirsPresent"][0].update(dirName="a.sst"), "appears twice"),
    (lambda b: b["dirIndex"].pop("filesRemoved"), "missing field"),
    (lambda b: b["dirIndex"]["filesPresent"][0]["attribs"].update(mode=1 << 20), "mode"),
    (lambda b: b["dirIndex"]["filesPresent"][0]["blobs"][0].update(blobOffset=1 << 31), "limit"),
    (lambda b: b["dirIndex"]["filesPresent"][0].update(contentHash="AB" * 32), "contentHash"),
    (lambda b: b["dirIndex"]["filesPresent"][0].update(contentHash="ab" * 31), "contentHash"),
    (lambda b: b["dirIndex"]["filesPresent"][0].update(contentHash=7), "contentHash"),
])
def test_hostile_fields_name_what_is_wrong(mutate, what):
    body = body_of(sample_index())
    mutate(body)
    with pytest.raises(FormatError, match=what) as err:
        decode_index(reseal(body), key="backup/index/x")
    assert "backup/index/x" in str(err.value)


def test_deep_nesting_is_bounded():
    d: dict = {"dirName": "d", "filesPresent": [], "filesRemoved": [], "subDirsPresent": [],
               "subDirsRemoved": []}
    for _ in range(200):
        d = {**d, "subDirsPresent": [d]}
    body = body_of(sample_index())
    body["dirIndex"]["subDirsPresent"] = [d]
    with pytest.raises(FormatError, match="nested deeper"):
        decode_index(reseal(body))
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000  # deeper than the JSON parser goes
    with pytest.raises(FormatError, match="not JSON"):
        decode_index(seal_raw(deep))


def test_every_flipped_byte_and_truncation_fails_loudly():
    data = encode_index(sample_index())
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        with pytest.raises(FormatError):
            decode_index(bytes(bad), key="k")
    for n in range(len(data)):
        with pytest.raises(FormatError):
            decode_index(data[:n], key="k")


def test_flipped_body_byte_is_a_checksum_mismatch():
    data = bytearray(encode_index(sample_index()))
    data[-20] ^= 0x04
    with pytest.raises(ChecksumMismatch, match="crc32 of the index body"):
        decode_index(bytes(data), key="k")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutations_decode_identically_or_raise_format_error(data):
    encoded = encode_index(sample_index())
    buf = bytearray(encoded)
    for _ in range(data.draw(st.integers(0, 4))):
        kind = data.draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(0, len(buf) - 1)))
        if kind == "flip" and buf:
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif buf:
            del buf[pos:pos + data.draw(st.integers(1, 8))]
    buf = buf[:data.draw(st.integers(0, len(buf)))]
    try:
        got = decode_index(bytes(buf), key="k")
    except FormatError:
        return
    assert got == sample_index()


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                        max_size=4),
                    max_leaves=20))
def test_fuzz_arbitrary_json_bodies_raise_format_error_only(body):
    try:
        decode_index(reseal(body))
    except FormatError:
        pass


def test_hostile_index_cannot_write_outside_the_target(tmp_path):
    """A validly sealed index naming '..' is refused before anything is written."""
    store = LocalStore(tmp_path / "s")
    body = body_of(sample_index())
    body["dirIndex"]["filesPresent"][0]["fileName"] = ".."
    body["prevSnapshotIndexBlobId"] = None
    store.put(f"backup/index/{B1}", reseal(body))
    with RestoreManager(store) as rm, pytest.raises(FormatError, match="unsafe name"):
        rm.restore(B1, tmp_path / "target")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_crc32_combine_matches_zlib():
    for a_len, b_len in [(0, 0), (0, 5), (5, 0), (1000, 1), (7, 1 << 20), (12345, 54321)]:
        a, b = os.urandom(a_len), os.urandom(b_len)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_keep_previous_round_trips_and_is_validated():
    body = body_of(sample_index())
    assert body["keepPrevious"] is False
    body["prevSnapshotIndexBlobId"] = "01ARZ3NDEKTSV4RRFFQ69G5FAV-1"
    body["keepPrevious"] = True
    assert decode_index(reseal(body)).keep_previous
    for bad in ("yes", 1, None):
        body["keepPrevious"] = bad
        with pytest.raises(FormatError, match="keepPrevious"):
            decode_index(reseal(body), key="idx")
    body["keepPrevious"], body["prevSnapshotIndexBlobId"] = True, None
    with pytest.raises(FormatError, match="keepPrevious"):
        decode_index(reseal(body), key="idx")
    body["schemaVersion"] = 2  # version 2 never wrote it: not trusted
    body["prevSnapshotIndexBlobId"] = "01ARZ3NDEKTSV4RRFFQ69G5FAV-1"
    assert decode_index(reseal(body)).keep_previous is False
