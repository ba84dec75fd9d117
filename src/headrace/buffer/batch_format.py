"""The data batch file (RFC 0001): length-prefixed records, optionally zstd, 7-byte footer.

Layout (little-endian)::

    record block (raw, or one zstd frame when compression = 1):
        [len u32][data] × record_count
    footer (7 bytes, never compressed):
        compression u8 (0 none, 1 zstd level 3) | record_count u32 | version u16 (= 1)

See docs/formats/buffer-batch.md. Encoding is one C-level ``bytes.join`` (one copy);
decoding checks in one numpy pass whether every record has the same length (then nothing loops
in Python), else walks the length prefixes once (a chain: each offset depends on the previous
length); record data is moved by Arrow kernels (``entry_array``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.codec import U32, zstd_compress, zstd_decompress
from headrace.errors import FormatError

VERSION = 1
FOOTER = struct.Struct("<BIH")
FOOTER_SIZE = FOOTER.size  # 7
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
COMPRESSIONS = {"none": COMPRESSION_NONE, "zstd": COMPRESSION_ZSTD}
DEFAULT_MAX_BLOCK_BYTES = 1 << 27  # decompression bound: no batch expands past 128 MiB


def encode_batch(entries: Sequence[bytes], compression: int = COMPRESSION_NONE) -> bytes:
    """Encode ``entries`` as one batch file.

    One ``bytes.join`` over ``map``/``zip``: C-level iteration and a single copy of the data (an
    Arrow ``binary_join_element_wise`` version measured 3x slower: it copies three times).
    """
    if compression not in (COMPRESSION_NONE, COMPRESSION_ZSTD):
        raise ValueError(f"unknown compression type {compression}")
    n = len(entries)
    if n > 0xFFFFFFFF:
        raise ValueError("a batch holds at most 2**32-1 records")
    lengths = list(map(len, entries))
    if n and max(lengths) > 0xFFFFFFFF:
        raise ValueError("a record is at most 2**32-1 bytes")
    block = b"".join(chain.from_iterable(zip(map(U32.pack, lengths), entries, strict=True)))
    if compression == COMPRESSION_ZSTD:
        block = zstd_compress(block, 3)
    return block + FOOTER.pack(compression, n, VERSION)


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
    """Each record's start and length (numpy int64) in ``block``: the decompressed record block,
    or for an uncompressed batch the file's bytes themselves (footer included, never indexed)."""

    block: bytes
    starts: np.ndarray
    lengths: np.ndarray
    compressed: bool
    key: str | None = None

    def entries(self) -> list[bytes]:
        # map over slices runs in C: ~2.5x faster than a comprehension per record
        ends = self.starts + self.lengths
        return list(map(self.block.__getitem__, map(slice, self.starts.tolist(), ends.tolist())))

    def entry_array(self) -> pa.Array:
        """The records as an Arrow binary array, built without a Python loop.

        Each record i is first viewed as bytes [start_i, start_{i+1}) — its data plus the next
        record's 4-byte prefix (4 zero bytes pad the last) — and ``binary_slice(0, -4)`` cuts
        the prefixes off in C++.
        """
        n = len(self.starts)
        if n == 0:
            return pa.array([], pa.binary())
        end = int(self.starts[-1] + self.lengths[-1])
        if end + 4 >= 2**31:
            raise FormatError(self.key, None, "batch holds more than 2 GiB of entry bytes")
        width = int(self.lengths[0])
        if n > 1 and np.all(np.diff(self.starts) == width + 4) and np.all(self.lengths == width):
            # equal-length records: one strided copy drops the prefixes
            rows = np.frombuffer(self.block, dtype=np.uint8, count=n * (width + 4))
            values = np.ascontiguousarray(rows.reshape(n, width + 4)[:, 4:])
            offsets = np.arange(0, n * width + 1, width, dtype=np.int32) if width else \
                np.zeros(n + 1, dtype=np.int32)
            return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                          pa.py_buffer(values)])
        offsets = np.empty(n + 1, dtype=np.int32)
        offsets[:n] = self.starts
        offsets[n] = end + 4
        padded = pa.py_buffer(b"".join((memoryview(self.block)[:end], b"\0\0\0\0")))
        spans = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), padded])
        return pc.binary_slice(spans, 0, -4)


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
    else:  # the file's own bytes serve as the block (records end at body_len): no copy
        block = data if isinstance(data, bytes) else bytes(data)
    end = len(block) if compressed else body_len
    count = footer.record_count
    where = (lambda pos: None) if compressed else (lambda pos: pos)
    if count * 4 > end:
        raise FormatError(key, where(0), f"record_count {count} needs at least {count * 4} "
                          f"bytes, the record block has {end}")
    uniform = _uniform_layout(block, end, count)
    if uniform is not None:
        return DecodedBlock(block, *uniform, compressed, key)
    starts: list[int] = []
    lengths: list[int] = []
    add_start, add_length = starts.append, lengths.append
    unpack = U32.unpack_from
    pos = 0
    for i in range(count):  # the prefixes chain: each offset depends on the previous length
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
                        np.array(lengths, dtype=np.int64), compressed, key)


def _uniform_layout(block: bytes, end: int, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Fast path, fully vectorised: every record has the first record's length."""
    if count == 0 or end % count:
        return None
    stride = end // count
    (first,) = U32.unpack_from(block, 0)
    if first + 4 != stride:
        return None
    prefixes = np.ndarray((count,), dtype="<u4", buffer=block, strides=(stride,))
    if not np.all(prefixes == first):
        return None
    starts = 4 + np.arange(count, dtype=np.int64) * stride
    return starts, np.full(count, first, dtype=np.int64)


def decode_batch(data, key: str | None = None,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> list[bytes]:
    """The records of a batch file, in order."""
    return decode_block(data, key, max_block_bytes).entries()
