"""Checkpoint file (HRCP), its compressed frame (HRCZ) and the checkpoint+registry file (HRCB).

Layout: docs/formats/reservoir-checkpoint.md. HRCP header (192 bytes):

    0 magic "HRCP"  4 u16 version=1  6 u16 flags (bit 0 = snapshot)
    8 u64 upserted pages  16 u64 deleted pages  24 u64 changed files  32 u64 deleted files
    40 u64 next file id   48..168 u64 offset of each of the 15 columns
    168 u64 checkpoint version  176 u64 total length  184..192 zero

Columns (each starting on an 8-byte boundary), in order: page ids (i64, strictly increasing),
file ids (u64), offsets in file (u32), sizes (u32), crc32s (u32); deleted page ids (i64);
file ids (u64), page counts (u32), non-active counts (u32), sizes (u64), deleted sizes (u64),
added-at versions (u64), crc64s (u64); deleted file ids (u64), deleted-at versions (u64).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from headrace.codec import ByteReader, zstd_compress, zstd_decompress
from headrace.errors import FormatError

MAGIC = b"HRCP"
ZMAGIC = b"HRCZ"
BMAGIC = b"HRCB"
VERSION = 1
HEADER_SIZE = 192
FLAG_SNAPSHOT = 1
_HEAD = struct.Struct("<4sHH QQQQ Q 15Q QQ 8x")
assert _HEAD.size == HEADER_SIZE
_ZHEAD = struct.Struct("<4sI")
_BHEAD = struct.Struct("<4sHH4x QQQQ")
BUNDLE_HEADER_SIZE = _BHEAD.size
MAX_RAW = 0xFFFFFFFF

# (field, dtype, count group) in file order
COLUMNS = (
    ("page_ids", "<i8", 0), ("page_file_ids", "<u8", 0), ("page_offsets", "<u4", 0),
    ("page_sizes", "<u4", 0), ("page_crc32s", "<u4", 0),
    ("deleted_page_ids", "<i8", 1),
    ("file_ids", "<u8", 2), ("file_page_counts", "<u4", 2), ("file_non_active", "<u4", 2),
    ("file_sizes", "<u8", 2), ("file_deleted_sizes", "<u8", 2), ("file_added_at", "<u8", 2),
    ("file_crc64s", "<u8", 2),
    ("deleted_file_ids", "<u8", 3), ("deleted_file_at", "<u8", 3),
)
COLUMN_NAMES = tuple(c[0] for c in COLUMNS)


def _empty(dtype: str) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass
class CheckpointData:
    """One checkpoint's columns (incremental: the changes; snapshot: the whole state)."""

    version: int
    snapshot: bool
    next_file_id: int
    page_ids: np.ndarray
    page_file_ids: np.ndarray
    page_offsets: np.ndarray
    page_sizes: np.ndarray
    page_crc32s: np.ndarray
    deleted_page_ids: np.ndarray
    file_ids: np.ndarray
    file_page_counts: np.ndarray
    file_non_active: np.ndarray
    file_sizes: np.ndarray
    file_deleted_sizes: np.ndarray
    file_added_at: np.ndarray
    file_crc64s: np.ndarray
    deleted_file_ids: np.ndarray
    deleted_file_at: np.ndarray

    @classmethod
    def empty(cls, version: int, snapshot: bool, next_file_id: int) -> CheckpointData:
        cols = {name: _empty(dt) for name, dt, _ in COLUMNS}
        return cls(version=version, snapshot=snapshot, next_file_id=next_file_id, **cols)

    def counts(self) -> tuple[int, int, int, int]:
        return (len(self.page_ids), len(self.deleted_page_ids), len(self.file_ids),
                len(self.deleted_file_ids))

    def encoded_size(self) -> int:
        size = HEADER_SIZE
        for name, dt, _ in COLUMNS:
            size += -(-len(getattr(self, name)) * np.dtype(dt).itemsize // 8) * 8
        return size


def estimate_size(n_pages: int, n_deleted: int, n_files: int, n_deleted_files: int) -> int:
    return HEADER_SIZE + 40 + n_pages * 28 + n_deleted * 8 + n_files * 48 + n_deleted_files * 16


def encode(cp: CheckpointData) -> bytes:
    counts = cp.counts()
    parts: list[bytes] = []
    offsets: list[int] = []
    pos = HEADER_SIZE
    for name, dt, group in COLUMNS:
        arr = np.ascontiguousarray(getattr(cp, name), dtype=dt)
        if len(arr) != counts[group]:
            raise ValueError(f"checkpoint column {name} has {len(arr)} values, "
                             f"expected {counts[group]}")
        raw = arr.tobytes()
        pad = (-len(raw)) % 8
        offsets.append(pos)
        parts.append(raw + bytes(pad))
        pos += len(raw) + pad
    flags = FLAG_SNAPSHOT if cp.snapshot else 0
    header = _HEAD.pack(MAGIC, VERSION, flags, *counts, cp.next_file_id, *offsets, cp.version,
                        pos)
    return header + b"".join(parts)


def decode(buf, key: str | None, base: int = 0) -> CheckpointData:
    """Parse raw HRCP bytes; arrays are zero-copy views. Offsets in errors add ``base``."""
    r = ByteReader(buf, key, base=base)
    r.need(HEADER_SIZE, "checkpoint header")
    vals = _HEAD.unpack_from(r.buf, 0)
    magic, version, flags = vals[0], vals[1], vals[2]
    counts = vals[3:7]
    next_file_id = vals[7]
    col_offsets = vals[8:23]
    cp_version, total = vals[23], vals[24]
    if magic != MAGIC:
        raise FormatError(key, base, f"bad checkpoint magic {magic!r}")
    if version != VERSION:
        raise FormatError(key, base + 4, f"unsupported checkpoint version {version}")
    if flags & ~FLAG_SNAPSHOT:
        raise FormatError(key, base + 6, f"unknown checkpoint flags {flags:#x}")
    if total != len(r.buf):
        raise FormatError(key, base + 176, f"checkpoint length {total} != {len(r.buf)} present")
    cols = {}
    prev_end = HEADER_SIZE
    for i, (name, dt, group) in enumerate(COLUMNS):
        off = col_offsets[i]
        if off < prev_end or off % 8:
            raise FormatError(key, base + 48 + 8 * i, f"column {name} offset {off} out of order")
        r.seek(off, f"column {name} offset")
        itemsize = np.dtype(dt).itemsize
        if counts[group] > (total - off) // itemsize:
            raise FormatError(key, base + 8 + 8 * group,
                              f"count {counts[group]} of {name} exceeds the bytes present")
        cols[name] = r.array(dt, counts[group], f"column {name}")
        prev_end = off + counts[group] * itemsize
    ids = cols["page_ids"]
    if len(ids) > 1 and np.any(ids[1:] <= ids[:-1]):
        raise FormatError(key, base + col_offsets[0], "page ids are not strictly increasing")
    if np.any(cols["file_ids"] == 0) or np.any(cols["page_file_ids"] == 0):
        raise FormatError(key, base + col_offsets[6], "file id 0 in a checkpoint")
    return CheckpointData(version=cp_version, snapshot=bool(flags & FLAG_SNAPSHOT),
                          next_file_id=next_file_id, **cols)


def compress(raw: bytes) -> bytes:
    """HRCZ frame: magic, u32 raw length, zstd frame."""
    if len(raw) > MAX_RAW:
        raise ValueError("checkpoint too large for an HRCZ frame")
    return _ZHEAD.pack(ZMAGIC, len(raw)) + zstd_compress(raw)


def decompress(buf, key: str | None, max_raw: int, base: int = 0) -> bytes:
    r = ByteReader(buf, key, base=base)
    r.need(_ZHEAD.size, "compressed checkpoint header")
    magic, raw_len = _ZHEAD.unpack_from(r.buf, 0)
    if magic != ZMAGIC:
        raise FormatError(key, base, f"bad compressed checkpoint magic {magic!r}")
    if raw_len > max_raw:
        raise FormatError(key, base + 4, f"checkpoint raw length {raw_len} above {max_raw}")
    if raw_len < HEADER_SIZE:
        raise FormatError(key, base + 4, f"checkpoint raw length {raw_len} below the "
                          f"{HEADER_SIZE}-byte header")
    frame = r.buf[_ZHEAD.size:]
    most = max_zstd_output(len(frame))
    if raw_len > most:  # refused before a byte is inflated
        raise FormatError(key, base + 4, f"checkpoint raw length {raw_len} is more than the "
                          f"{len(frame)}-byte zstd frame can hold (at most {most})")
    out = zstd_decompress(frame, raw_len, key=key, offset=base + _ZHEAD.size)
    if len(out) != raw_len:
        raise FormatError(key, base + 4, f"checkpoint decompressed to {len(out)} bytes, "
                          f"header says {raw_len}")
    return out


def max_zstd_output(frame_bytes: int) -> int:
    """The most a zstd frame of ``frame_bytes`` can produce: every block yields at most 128 KiB
    and costs at least 4 bytes (3-byte header + 1 byte of an RLE block) after the frame header
    (>= 6 bytes). A declared size above this is a lie, refused without decompressing."""
    return (max(frame_bytes - 6, 0) // 4) * (128 << 10)


def encode_combined(snapshot: bool, ckpt_section: bytes, registry: bytes) -> bytes:
    """HRCB: a (compressed) checkpoint section followed by the registry, for listable stores."""
    ckpt_off = BUNDLE_HEADER_SIZE
    reg_off = ckpt_off + len(ckpt_section)
    head = _BHEAD.pack(BMAGIC, VERSION, FLAG_SNAPSHOT if snapshot else 0, ckpt_off,
                       len(ckpt_section), reg_off, len(registry))
    return head + ckpt_section + registry


def split_combined(buf, key: str | None) -> tuple[bool, memoryview, memoryview, int, int]:
    """(snapshot, checkpoint section, registry section, their offsets) of an HRCB file."""
    r = ByteReader(buf, key)
    r.need(BUNDLE_HEADER_SIZE, "checkpoint+registry header")
    magic, version, flags, c_off, c_len, g_off, g_len = _BHEAD.unpack_from(r.buf, 0)
    if magic != BMAGIC:
        raise FormatError(key, 0, f"bad checkpoint+registry magic {magic!r}")
    if version != VERSION:
        raise FormatError(key, 4, f"unsupported checkpoint+registry version {version}")
    if flags & ~FLAG_SNAPSHOT:
        raise FormatError(key, 6, f"unknown flags {flags:#x}")
    n = len(r.buf)
    if not (c_off == BUNDLE_HEADER_SIZE and c_off + c_len == g_off and g_off + g_len == n):
        raise FormatError(key, 8, "section offsets do not tile the file")
    return bool(flags & FLAG_SNAPSHOT), r.buf[c_off:g_off], r.buf[g_off:n], c_off, g_off


__all__ = ["COLUMNS", "CheckpointData", "compress", "decode", "decompress", "encode",
           "encode_combined", "estimate_size", "split_combined"]
