"""Where a bucket's pages live (page ids) and the bucket's index: its root page and the run
index pages. Byte layouts are specified in docs/formats/pipeline-state.md.

Page ids (int64, positive) pack where a page belongs::

    bit 62..54  operator index (< 512)     bit 53..52  side (< 4)
    bit 51..36  bucket (< 65536)            bit 35..0   sequence (0 = the bucket's root page)

Sequence numbers come from the root's ``next_seq`` counter, so a retried task (same state
version, same delta) allocates the same ids and writes the same bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.codec import ByteReader, crc32
from headrace.errors import ChecksumMismatch, FormatError, InvalidInput
from headrace.pipeline.state.zset import as_fixed, fixed_width

_OP_BITS, _SIDE_BITS, _BUCKET_BITS, SEQ_BITS = 9, 2, 16, 36
MAX_SEQ = (1 << SEQ_BITS) - 1

ROOT_MAGIC = b"HRLR"
INDEX_MAGIC = b"HRLI"
FORMAT_VERSION = 1  # run index pages
# roots: 2 = kind 1 runs may hold rows (replacing runs); 1 = kind 1 runs hold markers only
# (tombstones), which version 2 reads alike. A version-1 reader refuses version 2 roots
# instead of dropping a replacing run's rows as deleted.
ROOT_VERSION, ROOT_VERSIONS = 2, (1, 2)
KIND_DATA, KIND_REPLACE = 0, 1  # see state/resolve.py

_ROOT_HEADER = struct.Struct("<4sB3xQIII4x")  # magic, version, next_seq, runs, inline pages, keys
_RUN = struct.Struct("<QIBB2xQQQ")  # first_seq, pages, kind, inline, rows, raw, stored
_INDEX_HEADER = struct.Struct("<4sB3xII")  # magic, version, pages, keys_len
_RUN_DTYPE = np.dtype([("first_seq", "<u8"), ("pages", "<u4"), ("kind", "u1"), ("inline", "u1"),
                       ("pad", "<u2"), ("rows", "<u8"), ("raw", "<u8"), ("stored", "<u8")])
assert _RUN_DTYPE.itemsize == _RUN.size == 40


def page_id(op: int, side: int, bucket: int, seq: int) -> int:
    if not (0 <= op < 1 << _OP_BITS and 0 <= side < 1 << _SIDE_BITS
            and 0 <= bucket < 1 << _BUCKET_BITS and 0 <= seq <= MAX_SEQ):
        raise InvalidInput(f"page id out of range: op={op} side={side} bucket={bucket} seq={seq}")
    return (op << 54) | (side << 52) | (bucket << 36) | seq


def split_page_id(pid: int) -> tuple[int, int, int, int]:
    return (pid >> 54, (pid >> 52) & 3, (pid >> 36) & 0xFFFF, pid & MAX_SEQ)


def page_name(pid: int) -> str:
    """How errors name a state page."""
    op, side, bucket, seq = split_page_id(pid)
    return f"state page {pid:#x} (op {op} side {side} bucket {bucket} seq {seq})"


@dataclass
class Fences:
    """First and last key of each page of one run (object arrays of bytes, for searchsorted)."""

    firsts: np.ndarray
    lasts: np.ndarray
    # when every fence key has one length: the keys as numpy S{k} arrays (C binary search)
    fixed: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.firsts)

    @property
    def nbytes(self) -> int:
        """About what the fences hold in memory (for the worker's cache bound)."""
        return 2 * 64 * len(self.firsts) + sum(map(len, self.firsts)) + sum(map(len, self.lasts))

    def searches_fixed(self, fixed: np.ndarray | None) -> bool:
        """Whether ``pages_holding`` can search ``fixed`` (S{k} keys) in C."""
        return (fixed is not None and self.fixed is not None
                and self.fixed[0].dtype == fixed.dtype)

    def pages_holding(self, probe: np.ndarray | None, fixed: np.ndarray | None = None) -> np.ndarray:
        """Indices of the pages whose [first, last] holds one of ``probe`` (sorted, distinct
        keys, an object array): two vectorised binary searches, then the union of the per-key
        page ranges. ``fixed``: the same keys as S{k} (when they all have k bytes), searched
        in C when the fence keys have k bytes too."""
        n = len(self.firsts)
        firsts, lasts = self.firsts, self.lasts
        if self.searches_fixed(fixed):
            (firsts, lasts), probe = self.fixed, fixed
        lo = np.searchsorted(lasts, probe, side="left")  # first page with last >= key
        hi = np.searchsorted(firsts, probe, side="right")  # pages with first <= key
        keep = lo < hi
        if not keep.any():
            return np.zeros(0, np.int64)
        diff = (np.bincount(lo[keep], minlength=n + 1)
                - np.bincount(hi[keep], minlength=n + 1))
        return np.flatnonzero(np.cumsum(diff)[:n] > 0)

    def encode(self) -> tuple[np.ndarray, bytes]:
        """(lens u32[2n] interleaved first/last, keys blob)."""
        inter = np.empty(2 * len(self.firsts), dtype=object)
        inter[0::2], inter[1::2] = self.firsts, self.lasts
        arr = pa.array(inter, pa.binary())
        offs = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1)
        lens = np.diff(offs).astype("<u4")
        return lens, bytes(arr.buffers()[2] or b"")[: int(offs[-1])]


def _decode_fences(lens: np.ndarray, blob: memoryview, *, key: str, offset: int) -> Fences:
    """Fences from interleaved (first, last) lengths and their key bytes; checks that the keys
    are in order (first <= last <= next first), so searches over them are valid."""
    offs = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    if offs[-1] != len(blob):
        raise FormatError(key, offset, f"fence keys need {int(offs[-1])} bytes, "
                                       f"{len(blob)} present")
    if offs[-1] >= 1 << 31:
        raise FormatError(key, offset, "fence keys exceed 2 GiB")
    arr = pa.Array.from_buffers(pa.binary(), len(lens),
                                [None, pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(blob)])
    if len(arr) > 1:
        ordered = pc.less_equal(arr.slice(0, len(arr) - 1), arr.slice(1))
        bad = np.flatnonzero(~ordered.to_numpy(zero_copy_only=False))
        if len(bad):
            i = int(bad[0])
            raise FormatError(key, offset + int(offs[i]),
                              f"fence key {i} (page {i // 2}) is above the next one")
    obj = arr.to_numpy(zero_copy_only=False)
    k = fixed_width(arr)
    fixed = None
    if k:
        s = as_fixed(arr, k)
        fixed = (np.ascontiguousarray(s[0::2]), np.ascontiguousarray(s[1::2]))
    return Fences(obj[0::2], obj[1::2], fixed)


@dataclass
class RunMeta:
    """One sorted run: pages at seqs first_seq .. first_seq + pages - 1; when not ``inline``,
    its fences live in the index page at seq first_seq + pages."""

    first_seq: int
    pages: int
    kind: int
    inline: bool
    rows: int
    raw_bytes: int
    stored_bytes: int
    fences: Fences | None = None  # None until the index page is read (non-inline runs)

    @property
    def index_seq(self) -> int | None:
        return None if self.inline else self.first_seq + self.pages

    @property
    def end_seq(self) -> int:
        """One past the last seq this run uses (pages and index page)."""
        return self.first_seq + self.pages + (0 if self.inline else 1)


@dataclass
class Root:
    next_seq: int = 1
    runs: list[RunMeta] = field(default_factory=list)  # oldest first

    def to_bytes(self) -> bytes:
        inline = [r for r in self.runs if r.inline]
        lens, blobs = [], []
        for r in inline:
            ln, blob = r.fences.encode()
            lens.append(ln)
            blobs.append(blob)
        keys = b"".join(blobs)
        parts = [_ROOT_HEADER.pack(ROOT_MAGIC, ROOT_VERSION, self.next_seq, len(self.runs),
                                   sum(r.pages for r in inline), len(keys))]
        parts += [_RUN.pack(r.first_seq, r.pages, r.kind, int(r.inline), r.rows, r.raw_bytes,
                            r.stored_bytes) for r in self.runs]
        parts += [ln.tobytes() for ln in lens]
        parts.append(keys)
        body = b"".join(parts)
        return body + struct.pack("<I", crc32(body))

    @staticmethod
    def from_bytes(data, *, pid: int) -> Root:
        key = page_name(pid)
        view = memoryview(data).cast("B")
        _check_crc(view, key)
        r = ByteReader(view[:-4], key)
        r.need(_ROOT_HEADER.size, "root header")
        magic, version, next_seq, n_runs, n_inline, keys_len = _ROOT_HEADER.unpack_from(view, 0)
        if magic != ROOT_MAGIC:
            raise FormatError(key, 0, f"bad root magic {magic!r}")
        if version not in ROOT_VERSIONS:
            raise FormatError(key, 4, f"unknown root format version {version}")
        if not 1 <= next_seq <= MAX_SEQ + 1:
            raise FormatError(key, 8, f"next_seq {next_seq} out of range")
        r.pos = _ROOT_HEADER.size
        expect = _ROOT_HEADER.size + _RUN.size * n_runs + 8 * n_inline + keys_len
        if expect != len(view) - 4:
            raise FormatError(key, 16, f"root declares {n_runs} runs, {n_inline} inline pages "
                                       f"and {keys_len} key bytes ({expect + 4} bytes in all); "
                                       f"the page has {len(view)}")
        recs = r.array(_RUN_DTYPE, n_runs, "run records")
        lens = r.array("<u4", 2 * n_inline, "inline fence lengths")
        blob = r.take(keys_len, "inline fence keys")
        runs = _check_runs(recs, next_seq, key)
        inline_pages = sum(x.pages for x in runs if x.inline)
        if inline_pages != n_inline:
            raise FormatError(key, 20, f"root declares {n_inline} inline pages, its inline "
                                       f"runs have {inline_pages}")
        # split the inline fences by run (one step per run)
        lens_off = _ROOT_HEADER.size + _RUN.size * n_runs
        keys_off = lens_off + 8 * n_inline
        page_at, key_at = 0, 0
        for x in runs:
            if not x.inline:
                continue
            ln = lens[2 * page_at: 2 * (page_at + x.pages)]
            size = int(ln.sum(dtype=np.int64))
            if key_at + size > keys_len:
                raise FormatError(key, lens_off + 8 * page_at,
                                  f"inline fences of run at seq {x.first_seq} need bytes past "
                                  f"the {keys_len} key bytes")
            x.fences = _decode_fences(ln, blob[key_at: key_at + size], key=key,
                                      offset=keys_off + key_at)
            page_at += x.pages
            key_at += size
        if key_at != keys_len:
            raise FormatError(key, keys_off + key_at, f"{keys_len - key_at} key bytes unused")
        return Root(next_seq, runs)


def _check_crc(view: memoryview, key: str) -> None:
    if len(view) < 4:
        raise FormatError(key, 0, f"page of {len(view)} bytes is shorter than its checksum")
    (stored,) = struct.unpack_from("<I", view, len(view) - 4)
    actual = crc32(view[:-4])
    if stored != actual:
        raise ChecksumMismatch(key, len(view) - 4, "crc32 of the page", expected=stored,
                               actual=actual)


def _check_runs(recs: np.ndarray, next_seq: int, key: str) -> list[RunMeta]:
    """Validate the run records (vectorised) and turn them into RunMeta."""
    n = len(recs)
    at = _ROOT_HEADER.size + _RUN.size * np.arange(n)

    def fail(mask: np.ndarray, field_off: int, what: str) -> None:
        bad = np.flatnonzero(mask)
        if len(bad):
            i = int(bad[0])
            raise FormatError(key, int(at[i]) + field_off, f"run {i}: {what}")

    first, pages = recs["first_seq"].astype(np.int64), recs["pages"].astype(np.int64)
    fail(recs["first_seq"] > MAX_SEQ, 0, "first_seq out of range")
    fail(first < 1, 0, "first_seq 0 is the root's")
    fail(pages < 1, 8, "a run has at least one page")
    fail(recs["kind"] > KIND_REPLACE, 12, "unknown run kind")
    fail(recs["inline"] > 1, 13, "inline flag is not 0/1")
    fail(recs["pad"] != 0, 14, "reserved bytes are not zero")
    fail(recs["rows"] < recs["pages"], 16, "fewer rows than pages")
    fail(recs["rows"] >= 1 << 62, 16, "row count out of range")
    fail(recs["raw"] >= 1 << 62, 24, "raw byte count out of range")
    fail(recs["stored"] >= 1 << 62, 32, "stored byte count out of range")
    end = first + pages + (recs["inline"] == 0)
    fail(end > next_seq, 0, f"uses seqs at or past next_seq {next_seq}")
    order = np.argsort(first, kind="stable")
    overlap = np.zeros(n, bool)
    overlap[order[1:]] = first[order[1:]] < end[order[:-1]]
    fail(overlap, 0, "its seqs overlap another run's")
    return [RunMeta(int(a), int(b), int(c), bool(d), int(e), int(f), int(g))
            for a, b, c, d, _p, e, f, g in recs.tolist()]


def encode_index(fences: Fences) -> bytes:
    lens, keys = fences.encode()
    body = b"".join([_INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, len(fences), len(keys)),
                     lens.tobytes(), keys])
    return body + struct.pack("<I", crc32(body))


def decode_index(data, *, pid: int, pages: int) -> Fences:
    """A run index page: must hold the fences of exactly ``pages`` pages."""
    key = page_name(pid)
    view = memoryview(data).cast("B")
    _check_crc(view, key)
    r = ByteReader(view[:-4], key)
    r.need(_INDEX_HEADER.size, "index header")
    magic, version, n, keys_len = _INDEX_HEADER.unpack_from(view, 0)
    if magic != INDEX_MAGIC:
        raise FormatError(key, 0, f"bad index magic {magic!r}")
    if version != FORMAT_VERSION:
        raise FormatError(key, 4, f"unknown index format version {version}")
    if n != pages:
        raise FormatError(key, 8, f"index holds {n} pages, its run has {pages}")
    if _INDEX_HEADER.size + 8 * n + keys_len != len(view) - 4:
        raise FormatError(key, 8, f"index declares {n} pages and {keys_len} key bytes; the "
                                  f"page has {len(view)} bytes")
    r.pos = _INDEX_HEADER.size
    lens = r.array("<u4", 2 * n, "fence lengths")
    blob = r.take(keys_len, "fence keys")
    return _decode_fences(lens, blob, key=key, offset=_INDEX_HEADER.size + 8 * n)
