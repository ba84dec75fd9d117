"""Checkpoint registry (HRRG): which checkpoints exist, which are snapshots/bundles, their CRC64s.

Layout (docs/formats/reservoir-registry.md), little-endian:

    0 magic "HRRG"  4 u16 version=1  6 u16 flags=0  8 u32 count n
    12 u32 offset of versions  16 u32 offset of snapshot bitmap  20 u32 offset of bundle bitmap
    24 u32 offset of crc64s    28 u32 offset of footer
    32 u64 versions [n] (strictly increasing) | u32 snapshot words [ceil(n/32)] |
       u32 bundle words [ceil(n/32)] | u64 crc64s [n] | u64 footer = CRC64 of every byte before it

Bitmaps are u32 words, least significant bit first.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from headrace.codec import ByteReader, crc64
from headrace.errors import ChecksumMismatch, FormatError

MAGIC = b"HRRG"
VERSION = 1
_HEAD = struct.Struct("<4sHHI5I")
HEADER_SIZE = _HEAD.size  # 32


@dataclass(frozen=True)
class Registry:
    versions: np.ndarray  # u64, increasing
    snapshot: np.ndarray  # bool
    bundle: np.ndarray  # bool
    crc64s: np.ndarray  # u64

    @classmethod
    def empty(cls) -> Registry:
        return cls(np.zeros(0, np.uint64), np.zeros(0, bool), np.zeros(0, bool),
                   np.zeros(0, np.uint64))

    def __len__(self) -> int:
        return len(self.versions)

    def latest(self) -> int:
        return int(self.versions[-1]) if len(self.versions) else 0

    def index(self, version: int) -> int | None:
        i = int(np.searchsorted(self.versions, version))
        return i if i < len(self.versions) and int(self.versions[i]) == version else None

    def appended(self, version: int, snapshot: bool, bundle: bool, crc: int,
                 keep_from: int | None = None) -> Registry:
        """The registry after adding ``version``, holding only what reading ``version`` needs
        (its chain: a snapshot drops every earlier checkpoint) — and, when ``keep_from`` names
        a checkpoint still in it, what reading ``keep_from`` needs too: a writer whose newest
        checkpoint may yet be abandoned (the pipeline's, until its progress names it) keeps the
        version it may have to go back to readable, even across a snapshot."""
        out = Registry(np.append(self.versions, np.uint64(version)),
                       np.append(self.snapshot, snapshot), np.append(self.bundle, bundle),
                       np.append(self.crc64s, np.uint64(crc)))
        keep = out.index(keep_from) if keep_from is not None and keep_from < version else None
        start = out.chain_for(version if keep is None else keep_from)[0]
        if start == 0:
            return out
        return Registry(out.versions[start:], out.snapshot[start:], out.bundle[start:],
                        out.crc64s[start:])

    def chain_for(self, version: int) -> list[int]:
        """Indexes to read to recover ``version``: its latest snapshot at or before it, then the
        incrementals up to it (from the first entry when no snapshot precedes it)."""
        i = self.index(version)
        if i is None:
            raise KeyError(version)
        snaps = np.flatnonzero(self.snapshot[: i + 1])
        start = int(snaps[-1]) if len(snaps) else 0
        return list(range(start, i + 1))


def _bits(flags: np.ndarray) -> bytes:
    n = len(flags)
    words = np.zeros(-(-n // 32), np.uint32)
    idx = np.flatnonzero(flags)
    np.bitwise_or.at(words, idx // 32, (np.uint32(1) << (idx % 32).astype(np.uint32)))
    return words.astype("<u4").tobytes()


def _unbits(words: np.ndarray, n: int) -> np.ndarray:
    idx = np.arange(n)
    return ((words[idx // 32] >> (idx % 32).astype(np.uint32)) & 1).astype(bool)


def encode(reg: Registry) -> bytes:
    n = len(reg)
    words = -(-n // 32)
    off_versions = HEADER_SIZE
    off_snap = off_versions + 8 * n
    off_bundle = off_snap + 4 * words
    off_crcs = off_bundle + 4 * words
    off_footer = off_crcs + 8 * n
    body = b"".join((
        _HEAD.pack(MAGIC, VERSION, 0, n, off_versions, off_snap, off_bundle, off_crcs, off_footer),
        np.ascontiguousarray(reg.versions, "<u8").tobytes(), _bits(reg.snapshot),
        _bits(reg.bundle), np.ascontiguousarray(reg.crc64s, "<u8").tobytes(),
    ))
    return body + struct.pack("<Q", crc64(body))


def decode(buf, key: str | None, base: int = 0) -> Registry:
    """Parse and verify a registry; the footer CRC64 is checked before anything else is trusted."""
    r = ByteReader(buf, key, base=base)
    r.need(HEADER_SIZE + 8, "registry header and footer")
    size = len(r.buf)
    (footer,) = struct.unpack_from("<Q", r.buf, size - 8)
    actual = crc64(r.buf[: size - 8])
    if actual != footer:
        raise ChecksumMismatch(key, base + size - 8, "registry footer crc64", expected=footer,
                               actual=actual)
    magic, version, flags, n, o_v, o_s, o_b, o_c, o_f = _HEAD.unpack_from(r.buf, 0)
    if magic != MAGIC:
        raise FormatError(key, base, f"bad registry magic {magic!r}")
    if version != VERSION:
        raise FormatError(key, base + 4, f"unsupported registry version {version}")
    if flags:
        raise FormatError(key, base + 6, f"unknown registry flags {flags:#x}")
    if n > size // 16:
        raise FormatError(key, base + 8, f"registry count {n} exceeds the bytes present")
    words = -(-n // 32)
    expect = (HEADER_SIZE, HEADER_SIZE + 8 * n, HEADER_SIZE + 8 * n + 4 * words,
              HEADER_SIZE + 8 * n + 8 * words, HEADER_SIZE + 16 * n + 8 * words)
    if (o_v, o_s, o_b, o_c, o_f) != expect or o_f + 8 != size:
        raise FormatError(key, base + 12, "registry section offsets do not match its count")
    r.seek(o_v)
    versions = r.array("<u8", n, "registry versions")
    snap = _unbits(r.array("<u4", words, "snapshot bitmap"), n)
    bund = _unbits(r.array("<u4", words, "bundle bitmap"), n)
    crcs = r.array("<u8", n, "registry crc64s")
    if n > 1 and np.any(versions[1:] <= versions[:-1]):
        raise FormatError(key, base + o_v, "registry versions are not increasing")
    return Registry(versions, snap, bund, crcs)
