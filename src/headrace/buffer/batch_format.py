"""The data batch file (RFC 0001): length-prefixed records, optionally zstd, 7-byte footer.

Layout (little-endian)::

    record block (raw, or one zstd frame when compression = 1):
        [len u32][data] × record_count
    footer (7 bytes, never compressed):
        compression u8 (0 none, 1 zstd level 3) | record_count u32 | version u16 (= 1)

See docs/formats/buffer-batch.md. Encoding joins records in C (``bytes.join`` over ``map``);
decoding walks the length prefixes once (inherently sequential, one ``unpack_from`` per record,
no copies) and then moves the data with numpy/pyarrow.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from headrace.codec import U32, zstd_compress, zstd_decompress
from headrace.errors import FormatError

VERSION = 1
FOOTER = struct.Struct("<BIH")
FOOTER_SIZE = FOOTER.size  # 7
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
COMPRESSIONS = {"none": COMPRESSION_NONE, "zstd": COMPRESSION_ZSTD}
DEFAULT_MAX_BLOCK_BYTES = 1 << 31  # decompression bound: no batch expands past 2 GiB


def encode_batch(entries: Sequence[bytes], compression: int = COMPRESSION_NONE) -> bytes:
    """Encode ``entries`` as one batch file."""
    if compression not in (COMPRESSION_NONE, COMPRESSION_ZSTD):
        raise ValueError(f"unknown compression type {compression}")
    if len(entries) > 0xFFFFFFFF:
        raise ValueError("a batch holds at most 2**32-1 records")
    lens = list(map(len, entries))
    if lens and max(lens) > 0xFFFFFFFF:
        raise ValueError("a record is at most 2**32-1 bytes")
    block = b"".join(chain.from_iterable(zip(map(U32.pack, lens), entries, strict=True)))
    if compression == COMPRESSION_ZSTD:
        block = zstd_compress(block, 3)
    return block + FOOTER.pack(compression, len(entries), VERSION)


@dataclass(frozen=True)
class BatchFooter:
    compression: int
    record_count: int
    version: int


def read_footer(data, key: str | None = None) -> BatchFooter:
    n = len(data)
    if n < FOOTER_SIZE:
        raise FormatError(key, 0, f"batch is {n} bytes, shorter than its {FOOTER_SIZE}-byte footer")
    compression, count, version = FOOTER.unpack_from(data, n - FOOTER_SIZE)
    if version != VERSION:
        raise FormatError(key, n - 2, f"unknown batch version {version} (expected {VERSION})")
    if compression not in (COMPRESSION_NONE, COMPRESSION_ZSTD):
        raise FormatError(key, n - FOOTER_SIZE, f"unknown compression type {compression:#04x}")
    return BatchFooter(compression, count, version)


@dataclass(frozen=True)
class DecodedBlock:
    """The raw record block with each record's start and length (numpy int64 arrays)."""

    block: bytes
    starts: np.ndarray
    lengths: np.ndarray
    compressed: bool

    def entries(self) -> list[bytes]:
        b = self.block
        return [b[s : s + n] for s, n in zip(self.starts.tolist(), self.lengths.tolist(), strict=True)]

    def values_and_offsets(self) -> tuple[np.ndarray, np.ndarray]:
        """Record bytes back to back (prefixes dropped) and Arrow-style offsets [n+1]."""
        buf = np.frombuffer(self.block, dtype=np.uint8)
        n = len(self.starts)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        if n == 0:
            return buf[:0], offsets
        keep = np.ones(len(buf), dtype=bool)
        keep[((self.starts - 4)[:, None] + np.arange(4)).ravel()] = False
        return buf[keep], offsets


def decode_block(data, key: str | None = None,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> DecodedBlock:
    """Validate a batch file and locate its records; FormatError names key and offset."""
    footer = read_footer(data, key)
    body_len = len(data) - FOOTER_SIZE
    body = memoryview(data)[:body_len]
    compressed = footer.compression == COMPRESSION_ZSTD
    if compressed:
        if body_len == 0:
            raise FormatError(key, 0, "zstd batch with an empty record block")
        block = zstd_decompress(body, max_block_bytes, key=key, offset=0)
    else:
        block = bytes(body) if not isinstance(data, bytes) else data[:body_len]
    count = footer.record_count
    where = (lambda pos: None) if compressed else (lambda pos: pos)
    if count * 4 > len(block):
        raise FormatError(key, where(0), f"record_count {count} needs at least {count * 4} "
                          f"bytes, the record block has {len(block)}")
    starts: list[int] = []
    lengths: list[int] = []
    add_start, add_length = starts.append, lengths.append
    unpack = U32.unpack_from
    pos, end = 0, len(block)
    for i in range(count):
        if pos + 4 > end:
            raise FormatError(key, where(pos), f"record {i}: length prefix past the block end")
        (n,) = unpack(block, pos)
        pos += 4
        if n > end - pos:
            raise FormatError(key, where(pos - 4),
                              f"record {i}: length {n} exceeds the {end - pos} bytes left")
        add_start(pos)
        add_length(n)
        pos += n
    if pos != end:
        raise FormatError(key, where(pos), f"{end - pos} trailing bytes after "
                          f"{count} records in the record block")
    return DecodedBlock(block, np.array(starts, dtype=np.int64),
                        np.array(lengths, dtype=np.int64), compressed)


def decode_batch(data, key: str | None = None,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> list[bytes]:
    """The records of a batch file, in order."""
    return decode_block(data, key, max_block_bytes).entries()
