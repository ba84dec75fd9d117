"""Data file (HRDF): pages packed into one immutable object. Layout: docs/formats/reservoir-data.md.

    0  magic "HRDF"   4 u16 version=1   6 u16 flags (bit 0 = bundle)   8 u32 page count N
    12 u32 offset of page ids (=64)   16 u32 offset of page offsets   20 u32 offset of data
    24 i64 checkpoint offset   32 i64 registry offset   40 i64 registry footer offset (bundles)
    48..64 zero
    64 i64 page ids [N] | u32 absolute page offsets [N+1] (last = end of data) | page data

Page ids come before the data so compaction can decide what is live before reading any page.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from headrace.codec import ByteReader, crc32, crc64
from headrace.errors import FormatError

MAGIC = b"HRDF"
VERSION = 1
HEADER_SIZE = 64
FLAG_BUNDLE = 1
_HEADER = struct.Struct("<4sHHIIII qqq 16x")
assert _HEADER.size == HEADER_SIZE


def _align(n: int, block: int) -> int:
    return -(-n // block) * block


@dataclass(frozen=True)
class DataHeader:
    flags: int
    page_count: int
    ids_offset: int
    offsets_offset: int
    data_offset: int
    checkpoint_offset: int
    registry_offset: int
    registry_footer_offset: int

    @property
    def is_bundle(self) -> bool:
        return bool(self.flags & FLAG_BUNDLE)

    @property
    def data_end(self) -> int:
        """End of the page-data part: the bytes the file's CRC64 covers."""
        return self.checkpoint_offset if self.is_bundle else -1


@dataclass(frozen=True)
class EncodedFile:
    """A finalized data file: its bytes and where each page landed (absolute offsets).

    The bytes are kept as ``parts`` (header + index, the writer's page area, a bundle's tail):
    stores write them with a gather write, so the 64 MiB page area is never copied into a
    joined buffer. ``data`` joins them for the rare caller that needs one buffer.
    """

    parts: tuple
    page_ids: np.ndarray  # i64
    offsets: np.ndarray  # u32, absolute
    sizes: np.ndarray  # u32
    crc32s: np.ndarray  # u32
    data_end: int  # bytes covered by crc64 (whole file, or up to the checkpoint in a bundle)
    crc64: int

    @cached_property
    def data(self) -> bytes:
        return b"".join(self.parts)


class BlobFileWriter:
    """Accumulates pages of one data file in memory; ``finalize`` lays out the file.

    Offsets handed out while writing are relative to the start of the page data, so pages stay
    readable (read-your-own-writes) before the file's layout is known.
    """

    def __init__(self, max_file_size: int, *, pad_to_block: bool = False, block_size: int = 4096):
        self.max_file_size = max_file_size
        self.pad = pad_to_block
        self.block = block_size
        self.ids = array("q")
        self.rel_offsets = array("I")
        self.sizes = array("I")
        self.crcs = array("I")
        self.data: bytearray | memoryview = bytearray()  # a memoryview only when adopted
        self.encoded: EncodedFile | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def _index_size(self, n: int) -> int:
        size = HEADER_SIZE + 8 * n + 4 * (n + 1)
        return _align(size, self.block) if self.pad else size

    def projected_size(self, extra_pages: int = 0, extra_bytes: int = 0) -> int:
        pad = self.block * extra_pages if self.pad else 0
        return self._index_size(len(self.ids) + extra_pages) + len(self.data) + extra_bytes + pad

    def fits(self, size: int) -> bool:
        """Whether one more page of ``size`` bytes keeps the file within max_file_size."""
        n = len(self.ids)
        if not n:
            return True
        if self.pad:
            return self.projected_size(1, size) <= self.max_file_size
        return HEADER_SIZE + 12 * n + 16 + len(self.data) + size <= self.max_file_size

    def fit_count(self, sizes: np.ndarray) -> int:
        """How many of the next pages (of ``sizes``, in order) fit, as ``fits`` would decide
        one by one; an empty writer always takes the first. Unpadded layout only."""
        if not len(sizes):
            return 0
        t = np.arange(len(sizes), dtype=np.int64)
        need = HEADER_SIZE + 12 * (len(self.ids) + t) + 16 + len(self.data) + np.cumsum(sizes)
        k = int(np.searchsorted(need > self.max_file_size, True))  # need is increasing
        return max(k, 1) if not len(self.ids) else k

    def is_full(self) -> bool:
        if self.pad:
            return self.projected_size() >= self.max_file_size
        return HEADER_SIZE + 12 * len(self.ids) + 4 + len(self.data) >= self.max_file_size

    def add(self, page_id: int, data, crc: int | None = None) -> tuple[int, int, int]:
        """Append one page; returns (relative offset, size, crc32)."""
        if self.encoded is not None:
            raise RuntimeError("BlobFileWriter already finalized")
        mv = memoryview(data).cast("B")
        self._own()
        if self.pad and len(self.data) % self.block:
            self.data.extend(bytes(self.block - len(self.data) % self.block))
        rel = len(self.data)
        if len(mv) + rel > 0xFFFFFFFF:
            raise ValueError("page does not fit the u32 offsets of a data file")
        c = crc32(mv) if crc is None else crc
        self.data += mv
        self.ids.append(page_id)
        self.rel_offsets.append(rel)
        self.sizes.append(len(mv))
        self.crcs.append(c)
        return rel, len(mv), c

    def add_many(self, ids: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                 crcs: np.ndarray, blob) -> np.ndarray:
        """Append pages that sit at ``offsets`` in ``blob``; returns their relative offsets.

        Contiguous runs of pages are copied with one slice each (no per-page copy when packed).
        """
        n = len(ids)
        if n == 0:
            return np.zeros(0, np.uint32)
        src = memoryview(blob).cast("B")
        offsets = np.asarray(offsets, np.int64)
        sizes = np.asarray(sizes, np.int64)
        if self.pad:
            rel = np.empty(n, np.int64)
            for i in range(n):  # padded layout: each page starts on a block boundary
                rel[i] = self.add(int(ids[i]), src[offsets[i]:offsets[i] + sizes[i]],
                                  int(crcs[i]))[0]
            return rel.astype(np.uint32)
        base = len(self.data)
        rel = base + np.concatenate(([0], np.cumsum(sizes)[:-1]))
        # coalesce runs that are contiguous in the source
        breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + sizes[:-1]) + 1
        starts = np.concatenate(([0], breaks))
        ends = np.concatenate((breaks, [n]))
        if base == 0 and len(starts) == 1 and type(src.obj) is bytes:
            # one contiguous run from an immutable bytes object into an empty writer: adopt a
            # read-only view of it instead of copying (the file's page area IS the caller's
            # bytes; a later append copies it first, see _own)
            self.data = src[offsets[0]:offsets[n - 1] + sizes[n - 1]]
        else:
            self._own()
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                self.data += src[offsets[s]:offsets[e - 1] + sizes[e - 1]]
        if len(self.data) > 0xFFFFFFFF:
            raise ValueError("pages do not fit the u32 offsets of a data file")
        self.ids.frombytes(np.ascontiguousarray(ids, np.int64).tobytes())
        self.rel_offsets.frombytes(rel.astype(np.uint32).tobytes())
        self.sizes.frombytes(sizes.astype(np.uint32).tobytes())
        self.crcs.frombytes(np.ascontiguousarray(crcs, np.uint32).tobytes())
        return rel.astype(np.uint32)

    def _own(self) -> None:
        """Make the page area a bytearray this writer owns before appending to it."""
        if not isinstance(self.data, bytearray):
            self.data = bytearray(self.data)

    def data_offset(self) -> int:
        """Where the page data will start in the file, given the pages so far."""
        return self._index_size(len(self.ids))

    def page(self, rel_offset: int, size: int) -> bytes:
        """A page's bytes while the file is in flight (read-your-own-writes)."""
        return bytes(self.data[rel_offset:rel_offset + size])

    def finalize(self) -> EncodedFile:
        """Lay out the file (header, ids, offsets, data) and compute its CRC64."""
        return self._encode(0, 0, 0, 0)

    def _layout(self) -> tuple[int, np.ndarray]:
        n = len(self.ids)
        data_offset = self._index_size(n)
        rel = (np.frombuffer(self.rel_offsets, np.uint32).astype(np.int64) if n
               else np.zeros(0, np.int64))
        abs_offsets = np.empty(n + 1, np.int64)
        abs_offsets[:n] = data_offset + rel
        abs_offsets[n] = data_offset + len(self.data)
        if abs_offsets[n] > 0xFFFFFFFF:
            raise ValueError("data file larger than the u32 offsets allow")
        return data_offset, abs_offsets

    def _encode(self, flags: int, ckpt_off: int, reg_off: int, footer_off: int) -> EncodedFile:
        n = len(self.ids)
        data_offset, abs_offsets = self._layout()
        offsets_offset = HEADER_SIZE + 8 * n
        header = _HEADER.pack(MAGIC, VERSION, flags, n, HEADER_SIZE, offsets_offset, data_offset,
                              ckpt_off, reg_off, footer_off)
        ids = np.frombuffer(self.ids, np.int64) if n else np.zeros(0, np.int64)
        pad = bytes(data_offset - (offsets_offset + 4 * (n + 1)))
        head = b"".join((header, ids.tobytes(), abs_offsets.astype("<u4").tobytes(), pad))
        body = memoryview(self.data)  # no copy; the writer is finalized, so it never grows again
        enc = EncodedFile(
            parts=(head, body), page_ids=ids.copy(), offsets=abs_offsets[:n].astype(np.uint32),
            sizes=np.frombuffer(self.sizes, np.uint32).copy() if n else np.zeros(0, np.uint32),
            crc32s=np.frombuffer(self.crcs, np.uint32).copy() if n else np.zeros(0, np.uint32),
            data_end=len(head) + len(body),
            crc64=crc64(body, crc64(head)),  # a running CRC over the parts: no join
        )
        self.encoded = enc
        return enc


def encode_bundle(writer: BlobFileWriter, make_tail) -> EncodedFile:
    """Encode ``writer`` as a bundle. ``make_tail(data_crc64, data_end, offsets)`` returns the
    (checkpoint section, registry section) bytes, built once the data part's CRC64 is known.

    The header's bundle offsets are part of the data part, so they are fixed first: the data part
    length does not depend on the tail.
    """
    data_offset, abs_offsets = writer._layout()
    data_end = int(abs_offsets[-1])
    # the tail's size does not depend on the CRC values: size it with a provisional CRC, write
    # its offsets into the header, then build it for real once the data part's CRC64 is known
    ckpt_probe, reg_probe = make_tail(0, data_end, abs_offsets[:-1].astype(np.uint32))
    ckpt_off = data_end
    reg_off = ckpt_off + len(ckpt_probe)
    footer_off = reg_off + len(reg_probe) - 8
    final = writer._encode(FLAG_BUNDLE, ckpt_off, reg_off, footer_off)
    ckpt, reg = make_tail(final.crc64, data_end, final.offsets)
    if len(ckpt) != len(ckpt_probe) or len(reg) != len(reg_probe):
        raise AssertionError("bundle tail changed size with the data CRC")
    enc = EncodedFile(final.parts + (ckpt, reg), final.page_ids, final.offsets, final.sizes,
                      final.crc32s, data_end, final.crc64)
    writer.encoded = enc
    return enc


def parse_header(buf, key: str | None) -> DataHeader:
    r = ByteReader(buf, key)
    r.need(HEADER_SIZE, "data file header")
    magic, version, flags, n, ids_off, offs_off, data_off, ckpt, reg, footer = _HEADER.unpack_from(
        r.buf, 0)
    size = len(r.buf)
    if magic != MAGIC:
        raise FormatError(key, 0, f"bad data file magic {magic!r}")
    if version != VERSION:
        raise FormatError(key, 4, f"unsupported data file version {version}")
    if flags & ~FLAG_BUNDLE:
        raise FormatError(key, 6, f"unknown data file flags {flags:#x}")
    if n > (size - HEADER_SIZE) // 12:
        raise FormatError(key, 8, f"page count {n} does not fit the {size} bytes present")
    if ids_off != HEADER_SIZE:
        raise FormatError(key, 12, f"page ids offset {ids_off} is not {HEADER_SIZE}")
    if offs_off != HEADER_SIZE + 8 * n:
        raise FormatError(key, 16, f"page offsets offset {offs_off} does not follow the ids")
    if not offs_off + 4 * (n + 1) <= data_off <= size:
        raise FormatError(key, 20, f"data offset {data_off} outside the file")
    if flags & FLAG_BUNDLE:
        for at, name, value in ((24, "checkpoint", ckpt), (32, "registry", reg),
                                (40, "registry footer", footer)):
            if not 0 <= value <= size:
                raise FormatError(key, at, f"bundle {name} section offset {value} outside the "
                                  f"{size} bytes present")
        if not (data_off <= ckpt <= reg <= footer and footer + 8 == size):
            raise FormatError(key, 24, f"bundle section offsets {ckpt}, {reg}, {footer} out of "
                              f"order or not ending the file ({size} bytes)")
    elif ckpt or reg or footer:
        raise FormatError(key, 24, "reserved header bytes are not zero")
    return DataHeader(flags, n, ids_off, offs_off, data_off, ckpt, reg, footer)


def parse_index(buf, key: str | None) -> tuple[DataHeader, np.ndarray, np.ndarray]:
    """Header, page ids and the N+1 absolute offsets, checked for order and bounds."""
    h = parse_header(buf, key)
    r = ByteReader(buf, key, pos=h.ids_offset)
    ids = r.array("<i8", h.page_count, "page ids")
    offsets = r.array("<u4", h.page_count + 1, "page offsets")
    end = h.checkpoint_offset if h.is_bundle else len(r.buf)
    o = offsets.astype(np.int64)
    if len(o) and (o[0] < h.data_offset or o[-1] > end or np.any(o[1:] < o[:-1])):
        raise FormatError(key, h.offsets_offset, "page offsets not increasing within the data")
    return h, ids, offsets
