"""The snapshot index: which blobs make up which file of a backed-up directory.

SnapshotIndex / DirIndex / FileIndex / FileBlob follow the Samza blob-store design.
An index is stored as one JSON blob inside a fixed envelope that carries a CRC32 of the exact
body bytes, so a flipped digit is a loud ChecksumMismatch rather than a silently different
snapshot. The byte layout is documented in docs/formats/backup-index.md.

Everything read from an index is validated before use: names are single path segments (no ``/``,
``..``, NUL), blob ids match the blob-id grammar, chunk offsets are contiguous and sum to the
file size, and nesting depth and entry counts are bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from headrace.codec import crc32
from headrace.errors import ChecksumMismatch, FormatError

SCHEMA_VERSION = 3  # written; 2 added FileIndex.contentHash, 3 keepPrevious
READABLE_VERSIONS = (1, 2, 3)
FORMAT_NAME = "headrace-backup-index"
MAX_DEPTH = 128  # directory nesting an index may describe
MAX_ENTRIES = 10_000_000  # files + dirs + blobs in one index
MAX_FILE_SIZE = 1 << 50
MAX_BLOB_BYTES = 1 << 31  # a chunk or pack never exceeds this (chunk_size <= 1 GiB)
MAX_INDEX_BYTES = 1 << 30

_ENVELOPE_HEAD = re.compile(rb'\A\{"format":"headrace-backup-index","crc32":"([0-9a-f]{8})",'
                            rb'"snapshotIndex":')
# blob and index ids: a ULID, then the expiry (ms since the epoch) of the TTL the blob was born with
BLOB_ID = re.compile(r"\A[0-7][0-9A-HJKMNP-TV-Z]{25}-[0-9]{1,15}\Z")
_BAD_NAME = re.compile(r"[\x00-\x1f/\\]")
_HASH = re.compile(r"\A[0-9a-f]{64}\Z")


def validate_name(name: object, *, key: str | None, what: str) -> str:
    """A file or directory name from an index: one safe path segment, else FormatError."""
    if not isinstance(name, str) or not name or name in (".", "..") or _BAD_NAME.search(name):
        raise FormatError(key, None, f"{what}: unsafe name {name!r}")
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        raise FormatError(key, None, f"{what}: name longer than 255 bytes")
    return name


def validate_blob_id(blob_id: object, *, key: str | None, what: str) -> str:
    if not isinstance(blob_id, str) or not BLOB_ID.match(blob_id):
        raise FormatError(key, None, f"{what}: bad blob id {blob_id!r}")
    return blob_id


def blob_expiry_ms(blob_id: str) -> int:
    """The expiry a blob id carries (its TTL deadline unless an index makes it permanent)."""
    return int(blob_id.rsplit("-", 1)[1])


@dataclass(frozen=True)
class FileBlob:
    """One chunk of a file: bytes [offset, offset + size) of the file are bytes
    [blob_offset, blob_offset + size) of blob ``blob_id``. Large files have several chunks, each
    its own blob (blob_offset 0); small files are packed, several to one blob."""

    blob_id: str
    offset: int
    size: int
    crc32: int
    blob_offset: int = 0


@dataclass(frozen=True)
class FileIndex:
    file_name: str
    blobs: tuple[FileBlob, ...]
    mtime_ms: int
    ctime_ms: int
    size: int
    crc32: int
    mode: int  # permission bits (attribs.mode)
    # BLAKE3 over the chunks' BLAKE3 digests (headrace.backup.digest): what host affinity and
    # the diff compare. None only for files described by a schemaVersion 1 index (never by a
    # present file of an index this version writes): such a file is never taken as equal.
    content_hash: str | None = None


@dataclass(frozen=True)
class DirIndex:
    dir_name: str
    files_present: tuple[FileIndex, ...] = ()
    files_removed: tuple[FileIndex, ...] = ()
    sub_dirs_present: tuple[DirIndex, ...] = ()
    sub_dirs_removed: tuple[DirIndex, ...] = ()

    def walk_files(self, base: str = "") -> Iterator[tuple[str, FileIndex]]:
        """(relative path, FileIndex) of every present file, recursively."""
        for f in self.files_present:
            yield base + f.file_name, f
        for d in self.sub_dirs_present:
            yield from d.walk_files(base + d.dir_name + "/")

    def walk_dirs(self, base: str = "") -> Iterator[str]:
        """Relative path of every present subdirectory, parents first."""
        for d in self.sub_dirs_present:
            yield base + d.dir_name
            yield from d.walk_dirs(base + d.dir_name + "/")

    def present_blob_ids(self) -> set[str]:
        return {b.blob_id for _, f in self.walk_files() for b in f.blobs}

    def removed_blob_ids(self) -> set[str]:
        """Blobs of the previous snapshot this one no longer uses (deleted by cleanup)."""
        out: set[str] = set()
        for f in self.files_removed:
            out.update(b.blob_id for b in f.blobs)
        for d in self.sub_dirs_removed:
            out |= d.present_blob_ids()
        for d in self.sub_dirs_present:
            out |= d.removed_blob_ids()
        return out


@dataclass(frozen=True)
class SnapshotIndex:
    checkpoint_id: str
    created_time_ms: int
    dir_index: DirIndex
    prev_snapshot_index_blob_id: str | None = None
    job_name: str = ""
    job_instance: str = ""
    task_name: str = ""
    store_name: str = ""
    # the previous snapshot stays (a branch point the user named, e.g. `backup --previous X`):
    # cleanup makes it permanent instead of deleting it and the blobs this one removed
    keep_previous: bool = False
    schema_version: int = field(default=SCHEMA_VERSION)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for _, f in self.dir_index.walk_files())

    @property
    def file_count(self) -> int:
        return sum(1 for _ in self.dir_index.walk_files())


# -- encoding --------------------------------------------------------------------------------
def _blob_json(b: FileBlob) -> dict:
    return {"blobId": b.blob_id, "offset": b.offset, "size": b.size, "crc32": b.crc32,
            "blobOffset": b.blob_offset}


def _file_json(f: FileIndex) -> dict:
    return {"fileName": f.file_name, "blobs": [_blob_json(b) for b in f.blobs],
            "mtime": f.mtime_ms, "ctime": f.ctime_ms, "size": f.size, "crc32": f.crc32,
            "contentHash": f.content_hash, "attribs": {"mode": f.mode}}


def _dir_json(d: DirIndex) -> dict:
    return {"dirName": d.dir_name,
            "filesPresent": [_file_json(f) for f in d.files_present],
            "filesRemoved": [_file_json(f) for f in d.files_removed],
            "subDirsPresent": [_dir_json(s) for s in d.sub_dirs_present],
            "subDirsRemoved": [_dir_json(s) for s in d.sub_dirs_removed]}


def encode_index(index: SnapshotIndex) -> bytes:
    body = json.dumps({
        "schemaVersion": index.schema_version,
        "checkpointId": index.checkpoint_id,
        "createdTimeMs": index.created_time_ms,
        "jobName": index.job_name,
        "jobInstance": index.job_instance,
        "taskName": index.task_name,
        "storeName": index.store_name,
        "dirIndex": _dir_json(index.dir_index),
        "prevSnapshotIndexBlobId": index.prev_snapshot_index_blob_id,
        "keepPrevious": index.keep_previous,
    }, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    head = f'{{"format":"{FORMAT_NAME}","crc32":"{crc32(body):08x}","snapshotIndex":'
    return head.encode("ascii") + body + b"}"


# -- decoding --------------------------------------------------------------------------------
class _Decoder:
    """Turns parsed JSON into index objects, checking every field; errors name the field."""

    def __init__(self, key: str | None):
        self.key = key
        self.entries = 0
        self.hashes = True  # contentHash fields are read (schemaVersion >= 2)

    def fail(self, where: str, what: str) -> FormatError:
        return FormatError(self.key, None, f"{where}: {what}")

    def obj(self, value: object, where: str, fields: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, got {type(value).__name__}")
        missing = [f for f in fields if f not in value]
        if missing:
            raise self.fail(where, f"missing field(s) {missing}")
        return value

    def int_(self, value: object, where: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
        if type(value) is not int or not lo <= value <= hi:
            raise self.fail(where, f"expected an integer in [{lo}, {hi}], got {value!r}")
        return value

    def str_(self, value: object, where: str, max_len: int = 4096) -> str:
        if not isinstance(value, str) or len(value) > max_len:
            raise self.fail(where, f"expected a string of at most {max_len} chars")
        return value

    def list_(self, value: object, where: str) -> list:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, got {type(value).__name__}")
        self.entries += len(value)
        if self.entries > MAX_ENTRIES:
            raise self.fail(where, f"more than {MAX_ENTRIES} entries")
        return value

    def file(self, value: object, where: str) -> FileIndex:
        v = self.obj(value, where, ("fileName", "blobs", "mtime", "ctime", "size", "crc32",
                                    "attribs"))
        name = validate_name(v["fileName"], key=self.key, what=f"{where}.fileName")
        where = f"{where}[{name!r}]"
        size = self.int_(v["size"], f"{where}.size", 0, MAX_FILE_SIZE)
        attribs = self.obj(v["attribs"], f"{where}.attribs", ("mode",))
        blobs = []
        expect = 0
        for i, raw in enumerate(self.list_(v["blobs"], f"{where}.blobs")):
            bw = f"{where}.blobs[{i}]"
            b = self.obj(raw, bw, ("blobId", "offset", "size", "crc32", "blobOffset"))
            blob = FileBlob(validate_blob_id(b["blobId"], key=self.key, what=f"{bw}.blobId"),
                            self.int_(b["offset"], f"{bw}.offset", 0, MAX_FILE_SIZE),
                            self.int_(b["size"], f"{bw}.size", 1, MAX_FILE_SIZE),
                            self.int_(b["crc32"], f"{bw}.crc32", 0, 0xFFFFFFFF),
                            self.int_(b["blobOffset"], f"{bw}.blobOffset", 0, MAX_FILE_SIZE))
            if blob.blob_offset + blob.size > MAX_BLOB_BYTES:
                raise self.fail(bw, f"chunk ends at byte {blob.blob_offset + blob.size} of its "
                                    f"blob, past the {MAX_BLOB_BYTES}-byte limit")
            if blob.offset != expect:
                raise self.fail(bw, f"offset {blob.offset} but the previous chunk ends at {expect}")
            expect += blob.size
            blobs.append(blob)
        if expect != size:
            raise self.fail(where, f"chunks cover {expect} bytes but size is {size}")
        content_hash = v.get("contentHash") if self.hashes else None  # v1: none written
        if content_hash is not None and (not isinstance(content_hash, str)
                                         or not _HASH.match(content_hash)):
            raise self.fail(f"{where}.contentHash", f"expected 64 lowercase hex digits or null, "
                                                    f"got {content_hash!r}")
        return FileIndex(name, tuple(blobs),
                         self.int_(v["mtime"], f"{where}.mtime", -(1 << 62), 1 << 62),
                         self.int_(v["ctime"], f"{where}.ctime", -(1 << 62), 1 << 62),
                         size, self.int_(v["crc32"], f"{where}.crc32", 0, 0xFFFFFFFF),
                         self.int_(attribs["mode"], f"{where}.attribs.mode", 0, 0o7777),
                         content_hash)

    def dir(self, value: object, where: str, depth: int, root: bool = False) -> DirIndex:
        if depth > MAX_DEPTH:
            raise self.fail(where, f"directories nested deeper than {MAX_DEPTH}")
        v = self.obj(value, where, ("dirName", "filesPresent", "filesRemoved", "subDirsPresent",
                                    "subDirsRemoved"))
        if root:
            if v["dirName"] != "":
                raise self.fail(where, "the root dirName must be empty")
            name = ""
        else:
            name = validate_name(v["dirName"], key=self.key, what=f"{where}.dirName")
        where = f"{where}/{name}" if name else where
        present = tuple(self.file(f, f"{where}.filesPresent")
                        for f in self.list_(v["filesPresent"], f"{where}.filesPresent"))
        removed = tuple(self.file(f, f"{where}.filesRemoved")
                        for f in self.list_(v["filesRemoved"], f"{where}.filesRemoved"))
        subs = tuple(self.dir(d, f"{where}.subDirsPresent", depth + 1)
                     for d in self.list_(v["subDirsPresent"], f"{where}.subDirsPresent"))
        subs_removed = tuple(self.dir(d, f"{where}.subDirsRemoved", depth + 1)
                             for d in self.list_(v["subDirsRemoved"], f"{where}.subDirsRemoved"))
        names = [f.file_name for f in present] + [d.dir_name for d in subs]
        if len(set(names)) != len(names):
            raise self.fail(where, "a name appears twice among present files and directories")
        return DirIndex(name, present, removed, subs, subs_removed)


def decode_index(data: bytes | bytearray | memoryview, *, key: str | None = None) -> SnapshotIndex:
    """Parse and validate an index blob; raises FormatError / ChecksumMismatch on bad bytes."""
    data = bytes(data)
    if len(data) > MAX_INDEX_BYTES:
        raise FormatError(key, 0, f"index of {len(data)} bytes exceeds {MAX_INDEX_BYTES}")
    m = _ENVELOPE_HEAD.match(data)
    if m is None:
        raise FormatError(key, 0, f"not a {FORMAT_NAME} envelope")
    if not data.endswith(b"}"):
        raise FormatError(key, len(data), "envelope is not closed (truncated?)")
    body = data[m.end():-1]
    expected = int(m.group(1), 16)
    actual = crc32(body)
    if actual != expected:
        raise ChecksumMismatch(key, m.end(), "crc32 of the index body", expected=expected,
                               actual=actual)
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise FormatError(key, m.end(), f"index body is not JSON: {e}") from None
    dec = _Decoder(key)
    v = dec.obj(raw, "snapshotIndex", ("schemaVersion", "checkpointId", "createdTimeMs",
                                       "dirIndex", "prevSnapshotIndexBlobId"))
    version = v["schemaVersion"]
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise FormatError(key, None, f"unknown schemaVersion {version!r} "
                                     f"(this headrace reads {', '.join(map(str, READABLE_VERSIONS))})")
    dec.hashes = version >= 2
    prev = v["prevSnapshotIndexBlobId"]
    if prev is not None:
        validate_blob_id(prev, key=key, what="prevSnapshotIndexBlobId")
    keep = v.get("keepPrevious", False) if version >= 3 else False
    if type(keep) is not bool:
        raise FormatError(key, None, f"keepPrevious: expected true or false, got {keep!r}")
    if keep and prev is None:
        raise FormatError(key, None, "keepPrevious is true but prevSnapshotIndexBlobId is null")
    meta = {name: dec.str_(v.get(name, ""), name) for name in
            ("jobName", "jobInstance", "taskName", "storeName")}
    return SnapshotIndex(
        checkpoint_id=dec.str_(v["checkpointId"], "checkpointId"),
        created_time_ms=dec.int_(v["createdTimeMs"], "createdTimeMs"),
        dir_index=dec.dir(v["dirIndex"], "dirIndex", 0, root=True),
        prev_snapshot_index_blob_id=prev,
        job_name=meta["jobName"], job_instance=meta["jobInstance"],
        task_name=meta["taskName"], store_name=meta["storeName"],
        keep_previous=keep, schema_version=version,
    )
