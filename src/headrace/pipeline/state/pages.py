"""Run pages: a slice of a sorted run's rows in one self-checking, optionally zstd-compressed
page (layout in docs/formats/pipeline-state.md), decoded zero-copy into Arrow arrays.

Codec 2 compresses the body's *byte planes*: weights, offset deltas and (when every key, or
every val, of the page has one length) the keys and vals are transposed so that byte j of
every element is stored together before zstd. State rows are mostly fixed-width encodings of
numbers whose high bytes barely vary (a sorted key's prefix, a small count, a sum's zero
limbs): as planes those are long constant runs, which is what makes a state page ~3× smaller
than zstd over the row-ordered body (measured: 12 -> 4 bytes per aggregate row)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import zstandard

from headrace.codec import crc32, zstd_decompress
from headrace.errors import ChecksumMismatch, FormatError, InvalidInput
from headrace.pipeline.operators.kernel import ZSET_SCHEMA
from headrace.pipeline.state.layout import Fences, page_name
from headrace.pipeline.state.rows import ROW_OVERHEAD

PAGE_MAGIC = b"HRLP"
PAGE_VERSION = 1
CODEC_NONE, CODEC_ZSTD, CODEC_ZSTD_PLANES = 0, 1, 2
MAX_PAGE_RAW = 64 << 20  # a page (one row at least) decodes to at most this many bytes
_HEADER = struct.Struct("<4sBBxxII")  # magic, version, codec, rows, raw_len
_HEADER_SIZE = _HEADER.size  # 16
_U32 = struct.Struct("<I")


@dataclass
class EncodedRun:
    """A run cut into pages: page bytes laid end to end, their sizes, and the fences."""

    blob: bytes
    sizes: np.ndarray
    fences: Fences
    rows: int
    raw_bytes: int

    @property
    def pages(self) -> int:
        return len(self.sizes)


def encode_run(table: pa.Table, page_bytes: int, codec: int, level: int) -> EncodedRun:
    """Cut a sorted, consolidated Z-set into pages of about ``page_bytes`` raw bytes each
    (a row larger than that gets a page of its own). One Python step per page."""
    n = table.num_rows
    key, val = table.column("key").chunk(0), table.column("val").chunk(0)
    w = np.ascontiguousarray(table.column("w").chunk(0).to_numpy(), dtype="<i8")
    koff = _offsets(key)
    voff = _offsets(val)
    kdata, vdata = _data(key, koff), _data(val, voff)
    koff, voff = koff - koff[0], voff - voff[0]  # now relative to kdata / vdata
    row_end = np.cumsum(ROW_OVERHEAD + np.diff(koff) + np.diff(voff))
    raw_total = int(row_end[-1])
    # page i ends after the first row whose cumulative size reaches (i+1) * page_bytes
    cuts = np.searchsorted(row_end, np.arange(page_bytes, raw_total, page_bytes), side="left")
    bounds = np.unique(np.concatenate([[0], cuts + 1, [n]]))
    bounds = bounds[bounds <= n]
    comp = zstandard.ZstdCompressor(level=level, write_content_size=True) if codec else None
    pages, firsts, lasts = [], [], []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        ko, vo = koff[a:b + 1], voff[a:b + 1]
        if codec == CODEC_ZSTD_PLANES:
            body = _planes_body(w[a:b], ko - ko[0], vo - vo[0], kdata[ko[0]:ko[-1]],
                                vdata[vo[0]:vo[-1]])
        else:
            body = b"".join([w[a:b].tobytes(), (ko - ko[0]).astype("<u4").tobytes(),
                             (vo - vo[0]).astype("<u4").tobytes(),
                             kdata[ko[0]:ko[-1]], vdata[vo[0]:vo[-1]]])
        if len(body) > MAX_PAGE_RAW:
            raise InvalidInput(f"a state row of {len(body)} bytes exceeds the page limit of "
                               f"{MAX_PAGE_RAW} bytes")
        stored = comp.compress(body) if comp is not None else body
        page = _HEADER.pack(PAGE_MAGIC, PAGE_VERSION, codec, b - a, len(body)) + stored
        pages.append(page + struct.pack("<I", crc32(page)))
        firsts.append(kdata[ko[0]:ko[1]])
        lasts.append(kdata[ko[-2]:ko[-1]])
    sizes = np.array([len(p) for p in pages], np.int64)
    return EncodedRun(b"".join(pages), sizes,
                      Fences(_obj(firsts), _obj(lasts)), n, raw_total)


def _planes(data, size: int) -> bytes:
    """Elements of ``size`` bytes -> their byte planes (byte 0 of every element, then byte 1...)."""
    m = np.frombuffer(data, np.uint8)
    return np.ascontiguousarray(m.reshape(-1, size).T).tobytes()


def _fixed_len(offs: np.ndarray) -> int:
    """The one length (> 0) of every element (offsets relative to 0), or 0 if lengths differ."""
    n = len(offs) - 1
    if n < 1 or offs[-1] <= 0 or offs[-1] % n:
        return 0
    size = int(offs[-1]) // n
    return size if bool((offs[1:] - offs[:-1] == size).all()) else 0


def _planes_body(w: np.ndarray, ko: np.ndarray, vo: np.ndarray, kbytes: bytes,
                 vbytes: bytes) -> bytes:
    """The raw body with every section as byte planes (inverse: ``_raw_from_planes``):
    weights as 8-byte elements, offsets as u32 deltas, keys / vals of one length each."""
    parts = [_planes(w.tobytes(), 8)]
    for offs in (ko, vo):
        parts.append(_planes(np.diff(offs, prepend=0).astype("<u4").tobytes(), 4))
    for offs, data in ((ko, kbytes), (vo, vbytes)):
        size = _fixed_len(offs)
        parts.append(_planes(data, size) if size > 1 else data)
    return b"".join(parts)


def _unplane_into(out: np.ndarray, src: np.ndarray, size: int) -> None:
    """``src`` (byte planes of elements of ``size`` bytes) into ``out`` in element order."""
    out.reshape(-1, size)[:] = src.reshape(size, -1).T


def _raw_from_planes(t, rows: int, pid: int) -> memoryview:
    """Codec 2's body back to the raw row layout (one buffer, one copy per section); a length
    that does not add up is refused."""
    src = np.frombuffer(t, np.uint8)
    raw_len = len(src)
    out = np.empty(raw_len, np.uint8)
    at = 8 * rows
    _unplane_into(out[:at], src[:at], 8)
    offs = []
    for _ in range(2):
        n = 4 * (rows + 1)
        d = np.ascontiguousarray(src[at:at + n].reshape(4, rows + 1).T).view("<u4").ravel()
        o = np.cumsum(d, dtype=np.int64)
        if o[-1] > raw_len:
            raise FormatError(page_name(pid), 12, f"offsets run to {int(o[-1])}, past the "
                                                  f"{raw_len} raw bytes")
        out[at:at + n].view("<u4")[:] = o
        offs.append(o)
        at += n
    klen, vlen = int(offs[0][-1]), int(offs[1][-1])
    if at + klen + vlen != raw_len:
        raise FormatError(page_name(pid), 12, f"offsets cover {at + klen + vlen} raw bytes, "
                                              f"the body has {raw_len}")
    for o, size in ((offs[0], klen), (offs[1], vlen)):
        fixed = _fixed_len(o)
        if fixed > 1:
            _unplane_into(out[at:at + size], src[at:at + size], fixed)
        else:
            out[at:at + size] = src[at:at + size]
        at += size
    return out.data


def _offsets(arr: pa.Array) -> np.ndarray:
    return np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4).astype(np.int64)


def _data(arr: pa.Array, offs: np.ndarray) -> bytes:
    buf = arr.buffers()[2]
    a, b = int(offs[0]), int(offs[-1])
    return b"" if buf is None or a == b else buf.slice(a, b - a).to_pybytes()


def _obj(items: list[bytes]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def decode_page(data, *, pid: int, first: bytes | None = None,
                last: bytes | None = None) -> pa.RecordBatch:
    """A page's rows as a ZSET_SCHEMA record batch (views over the decoded bytes).
    ``first``/``last`` are the fences its run holds for it: a page not matching them is
    refused (a page of another run, or a stale one)."""
    view = memoryview(data).cast("B")
    n = len(view)
    if n < _HEADER_SIZE + 4:
        raise FormatError(page_name(pid), 0, f"page of {n} bytes is shorter than its header")
    (stored_crc,) = _U32.unpack_from(view, n - 4)
    actual = crc32(view[:-4])
    if stored_crc != actual:
        raise ChecksumMismatch(page_name(pid), n - 4, "crc32 of the page", expected=stored_crc,
                               actual=actual)
    magic, version, codec, rows, raw_len = _HEADER.unpack_from(view, 0)
    if magic != PAGE_MAGIC or version != PAGE_VERSION:
        what = f"bad page magic {magic!r}" if magic != PAGE_MAGIC else \
            f"unknown page format version {version}"
        raise FormatError(page_name(pid), 0 if magic != PAGE_MAGIC else 4, what)
    if raw_len > MAX_PAGE_RAW:
        raise FormatError(page_name(pid), 12, f"raw length {raw_len} above the limit "
                                              f"{MAX_PAGE_RAW}")
    data_at = 16 * rows + 8
    if rows < 1 or data_at > raw_len:
        raise FormatError(page_name(pid), 8, f"{rows} rows do not fit {raw_len} raw bytes")
    body: bytes | memoryview
    if codec in (CODEC_ZSTD, CODEC_ZSTD_PLANES):
        body = zstd_decompress(view[_HEADER_SIZE:-4], raw_len, key=page_name(pid),
                               offset=_HEADER_SIZE)
        if codec == CODEC_ZSTD_PLANES and len(body) == raw_len:
            body = _raw_from_planes(body, rows, pid)
    elif codec == CODEC_NONE:
        body = view[_HEADER_SIZE:-4]
    else:
        raise FormatError(page_name(pid), 5, f"unknown page codec {codec}")
    if len(body) != raw_len:
        raise FormatError(page_name(pid), 12, f"body has {len(body)} bytes, header says "
                                              f"{raw_len}")
    offs = np.frombuffer(body, "<u4", 2 * (rows + 1), 8 * rows).reshape(2, rows + 1)
    if offs[0, 0] or offs[1, 0] or (offs[:, 1:] < offs[:, :-1]).any():
        _bad_offsets(offs, pid)
    klen, vlen = int(offs[0, -1]), int(offs[1, -1])
    if data_at + klen + vlen != raw_len:
        raise FormatError(page_name(pid), 12, f"offsets cover {data_at + klen + vlen} raw "
                                              f"bytes, the body has {raw_len}")
    if first is not None:
        k0, k1 = data_at + int(offs[0, 1]), data_at + int(offs[0, -2])
        if body[data_at:k0] != first or body[k1:data_at + klen] != last:
            raise FormatError(page_name(pid), _HEADER_SIZE + data_at,
                              "page keys do not match the fences its run holds for it")
    buf = pa.py_buffer(body)
    if buf.address % 8:  # Arrow wants its int64 weights aligned
        buf = pa.py_buffer(bytes(body))
    v_at = 8 * rows + 4 * (rows + 1)
    w = pa.Array.from_buffers(pa.int64(), rows, [None, buf.slice(0, 8 * rows)])
    k = pa.Array.from_buffers(pa.binary(), rows, [None, buf.slice(8 * rows, 4 * (rows + 1)),
                                                  buf.slice(data_at, klen)])
    v = pa.Array.from_buffers(pa.binary(), rows, [None, buf.slice(v_at, 4 * (rows + 1)),
                                                  buf.slice(data_at + klen, vlen)])
    return pa.RecordBatch.from_arrays([k, v, w], schema=ZSET_SCHEMA)


def _bad_offsets(offs: np.ndarray, pid: int):
    for col, name in ((0, "key"), (1, "val")):
        o = offs[col]
        bad = np.flatnonzero(o[1:] < o[:-1])
        if o[0] or len(bad):
            i = int(bad[0]) + 1 if len(bad) else 0
            at = _HEADER_SIZE + 8 * (len(o) - 1) + 4 * (col * len(o) + i)
            raise FormatError(page_name(pid), at,
                              f"{name} offset {i} is out of order (offset into the raw body)")
