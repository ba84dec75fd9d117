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
from headrace.pipeline.state.rows import as_fixed, fixed_width

_OP_BITS, _SIDE_BITS, _BUCKET_BITS, SEQ_BITS = 9, 2, 16, 36
MAX_SEQ = (1 << SEQ_BITS) - 1

ROOT_MAGIC = b"HRLR"
INDEX_MAGIC = b"HRLI"
FORMAT_VERSION = 1  # run index pages
# roots: 3 = deleted key ranges, and runs that are a slice of a run's pages (their index page
# named explicitly, shared by the slices); 2 = kind 1 runs may hold rows (replacing runs);
# 1 = kind 1 runs hold markers only (tombstones), which versions 2 and 3 read alike. An older
# reader refuses a newer root instead of misreading it.
ROOT_VERSION, ROOT_VERSIONS = 3, (1, 2, 3)
KIND_DATA, KIND_REPLACE = 0, 1  # see state/resolve.py
MAX_DELETED_RANGES = 1024  # a root holding more is refused (writers keep far fewer)

# magic, version, next_seq, runs, inline pages, inline key bytes, deleted ranges (v3; else 0)
_ROOT_HEADER = struct.Struct("<4sB3xQIIII")
_RUN_V2 = struct.Struct("<QIBB2xQQQ")  # first_seq, pages, kind, inline, rows, raw, stored
_RUN = struct.Struct("<QIBB2xQQQQI4x")  # v2's, then index_seq, index_from
_RANGE = struct.Struct("<IIQ")  # lo length, hi length, seq
_INDEX_HEADER = struct.Struct("<4sB3xII")  # magic, version, pages, keys_len
_RUN_FIELDS = [("first_seq", "<u8"), ("pages", "<u4"), ("kind", "u1"), ("inline", "u1"),
               ("pad", "<u2"), ("rows", "<u8"), ("raw", "<u8"), ("stored", "<u8")]
_RUN_DTYPE_V2 = np.dtype(_RUN_FIELDS)
_RUN_DTYPE = np.dtype(_RUN_FIELDS + [("index_seq", "<u8"), ("index_from", "<u4"),
                                     ("pad2", "<u4")])
_RANGE_DTYPE = np.dtype([("lo_len", "<u4"), ("hi_len", "<u4"), ("seq", "<u8")])
assert _RUN_DTYPE_V2.itemsize == _RUN_V2.size == 40 and _RUN_DTYPE.itemsize == _RUN.size == 56
assert _RANGE_DTYPE.itemsize == _RANGE.size == 16


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
        if self.fixed is not None and fixed is not None and self.searches_fixed(fixed):
            (firsts, lasts), keys = self.fixed, fixed
        elif probe is not None:
            firsts, lasts, keys = self.firsts, self.lasts, probe
        else:
            raise ValueError("pages_holding needs the keys, or a fixed view it can search")
        lo = np.searchsorted(lasts, keys, side="left")  # first page with last >= key
        hi = np.searchsorted(firsts, keys, side="right")  # pages with first <= key
        keep = lo < hi
        if not keep.any():
            return np.zeros(0, np.int64)
        diff = (np.bincount(lo[keep], minlength=n + 1)
                - np.bincount(hi[keep], minlength=n + 1))
        return np.flatnonzero(np.cumsum(diff)[:n] > 0)

    def slice(self, a: int, b: int) -> Fences:
        """The fences of pages a .. b - 1."""
        fixed = None if self.fixed is None else (self.fixed[0][a:b], self.fixed[1][a:b])
        return Fences(self.firsts[a:b], self.lasts[a:b], fixed)

    def meeting(self, lo: bytes, hi: bytes) -> tuple[int, int]:
        """Pages a .. b - 1 are those whose [first, last] meets the key range [lo, hi)."""
        return (int(np.searchsorted(self.lasts, lo, side="left")),
                int(np.searchsorted(self.firsts, hi, side="left")))

    def inside(self, lo: bytes, hi: bytes) -> tuple[int, int]:
        """Pages a .. b - 1 (none if b <= a) are those whose every key lies in [lo, hi)."""
        return (int(np.searchsorted(self.firsts, lo, side="left")),
                int(np.searchsorted(self.lasts, hi, side="left")))

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
    their fences are entries index_from .. index_from + pages - 1 of the index page at
    ``index_seq`` (a run whose pages inside a deleted key range were dropped keeps pointing at
    its original index page, which its slices share)."""

    first_seq: int
    pages: int
    kind: int
    inline: bool
    rows: int
    raw_bytes: int
    stored_bytes: int
    fences: Fences | None = None  # None until the index page is read (non-inline runs)
    index_seq: int = 0  # 0 when inline
    index_from: int = 0

    def __post_init__(self):
        if not self.inline and not self.index_seq:  # as runs are written: index after pages
            self.index_seq = self.first_seq + self.pages

    @property
    def page_seqs(self) -> range:
        return range(self.first_seq, self.first_seq + self.pages)


@dataclass(frozen=True)
class DeletedRange:
    """Keys in [lo, hi) are deleted from every run older than ``seq`` (first_seq < seq)."""

    lo: bytes
    hi: bytes
    seq: int


@dataclass
class Root:
    next_seq: int = 1
    runs: list[RunMeta] = field(default_factory=list)  # oldest first
    ranges: list[DeletedRange] = field(default_factory=list)  # sorted by (seq, lo)

    def to_bytes(self) -> bytes:
        inline = [r for r in self.runs if r.inline]
        lens, blobs = [], []
        for r in inline:
            if r.fences is None:
                raise ValueError(f"inline run at page {r.first_seq} has no fences")
            ln, blob = r.fences.encode()
            lens.append(ln)
            blobs.append(blob)
        keys = b"".join(blobs)
        parts = [_ROOT_HEADER.pack(ROOT_MAGIC, ROOT_VERSION, self.next_seq, len(self.runs),
                                   sum(r.pages for r in inline), len(keys), len(self.ranges))]
        parts += [_RUN.pack(r.first_seq, r.pages, r.kind, int(r.inline), r.rows, r.raw_bytes,
                            r.stored_bytes, 0 if r.inline else r.index_seq,
                            0 if r.inline else r.index_from) for r in self.runs]
        parts += [ln.tobytes() for ln in lens]
        parts.append(keys)
        parts += [_RANGE.pack(len(d.lo), len(d.hi), d.seq) for d in self.ranges]
        parts += [d.lo + d.hi for d in self.ranges]
        body = b"".join(parts)
        return body + struct.pack("<I", crc32(body))

    @staticmethod
    def from_bytes(data, *, pid: int) -> Root:
        key = page_name(pid)
        view = memoryview(data).cast("B")
        _check_crc(view, key)
        r = ByteReader(view[:-4], key)
        r.need(_ROOT_HEADER.size, "root header")
        (magic, version, next_seq, n_runs, n_inline, keys_len,
         n_ranges) = _ROOT_HEADER.unpack_from(view, 0)
        if magic != ROOT_MAGIC:
            raise FormatError(key, 0, f"bad root magic {magic!r}")
        if version not in ROOT_VERSIONS:
            raise FormatError(key, 4, f"unknown root format version {version}")
        if not 1 <= next_seq <= MAX_SEQ + 1:
            raise FormatError(key, 8, f"next_seq {next_seq} out of range")
        if version < 3 and n_ranges:
            raise FormatError(key, 28, "reserved bytes are not zero")
        if n_ranges > MAX_DELETED_RANGES:
            raise FormatError(key, 28, f"{n_ranges} deleted ranges exceed the limit of "
                                       f"{MAX_DELETED_RANGES}")
        dtype = _RUN_DTYPE if version >= 3 else _RUN_DTYPE_V2
        r.pos = _ROOT_HEADER.size
        fixed = (_ROOT_HEADER.size + dtype.itemsize * n_runs + 8 * n_inline + keys_len
                 + _RANGE.size * n_ranges)
        if fixed > len(view) - 4 or (version < 3 and fixed != len(view) - 4):
            raise FormatError(key, 16, f"root declares {n_runs} runs, {n_inline} inline pages, "
                                       f"{keys_len} key bytes and {n_ranges} deleted ranges "
                                       f"(at least {fixed + 4} bytes in all); the page has "
                                       f"{len(view)}")
        recs = r.array(dtype, n_runs, "run records")
        lens = r.array("<u4", 2 * n_inline, "inline fence lengths")
        blob = r.take(keys_len, "inline fence keys")
        runs = _check_runs(recs, next_seq, key, version)
        inline_pages = sum(x.pages for x in runs if x.inline)
        if inline_pages != n_inline:
            raise FormatError(key, 20, f"root declares {n_inline} inline pages, its inline "
                                       f"runs have {inline_pages}")
        # split the inline fences by run (one step per run)
        lens_off = _ROOT_HEADER.size + dtype.itemsize * n_runs
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
        ranges = _read_ranges(r, n_ranges, next_seq, key)
        return Root(next_seq, runs, ranges)


def _read_ranges(r: ByteReader, n: int, next_seq: int, key: str) -> list[DeletedRange]:
    """The deleted ranges at the reader's position, which must end the page: each lo < hi, seq
    in 1 .. next_seq, sorted by (seq, lo), ranges of one seq apart (not even touching)."""
    at = r.pos
    recs = r.array(_RANGE_DTYPE, n, "deleted range records")
    keys_at = r.pos
    need = int(recs["lo_len"].sum(dtype=np.uint64) + recs["hi_len"].sum(dtype=np.uint64))
    if need != r.remaining():
        raise FormatError(key, keys_at, f"deleted ranges need {need} key bytes, "
                                        f"{r.remaining()} remain")
    blob = bytes(r.take(need, "deleted range keys"))
    out: list[DeletedRange] = []
    pos = 0
    for i, (lo_len, hi_len, seq) in enumerate(recs.tolist()):
        lo, hi = blob[pos: pos + lo_len], blob[pos + lo_len: pos + lo_len + hi_len]
        pos += lo_len + hi_len
        where = at + _RANGE.size * i
        if not 1 <= seq <= next_seq:
            raise FormatError(key, where + 8, f"deleted range {i}: seq {seq} is not in 1 .. "
                                              f"next_seq {next_seq}")
        if not lo < hi:
            raise FormatError(key, where, f"deleted range {i}: lo {lo!r} is not below hi "
                                          f"{hi!r}")
        if out and (out[-1].seq, out[-1].lo) >= (seq, lo):
            raise FormatError(key, where, f"deleted range {i} is not after range {i - 1} in "
                                          "(seq, lo) order")
        if out and out[-1].seq == seq and out[-1].hi >= lo:
            raise FormatError(key, where, f"deleted range {i} overlaps or touches range "
                                          f"{i - 1} of the same seq")
        out.append(DeletedRange(lo, hi, seq))
    return out


def _check_crc(view: memoryview, key: str) -> None:
    if len(view) < 4:
        raise FormatError(key, 0, f"page of {len(view)} bytes is shorter than its checksum")
    (stored,) = struct.unpack_from("<I", view, len(view) - 4)
    actual = crc32(view[:-4])
    if stored != actual:
        raise ChecksumMismatch(key, len(view) - 4, "crc32 of the page", expected=stored,
                               actual=actual)


def _check_runs(recs: np.ndarray, next_seq: int, key: str, version: int) -> list[RunMeta]:
    """Validate the run records (vectorised) and turn them into RunMeta."""
    n = len(recs)
    at = _ROOT_HEADER.size + recs.dtype.itemsize * np.arange(n)

    def fail(mask: np.ndarray, field_off: int, what: str) -> None:
        bad = np.flatnonzero(mask)
        if len(bad):
            i = int(bad[0])
            raise FormatError(key, int(at[i]) + field_off, f"run {i}: {what}")

    first, pages = recs["first_seq"].astype(np.int64), recs["pages"].astype(np.int64)
    inline = recs["inline"] == 1
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
    if version >= 3:
        fail(recs["pad2"] != 0, 52, "reserved bytes are not zero")
        fail(inline & ((recs["index_seq"] != 0) | (recs["index_from"] != 0)), 40,
             "an inline run names an index page")
        index = recs["index_seq"].astype(np.int64)
        fail(~inline & ((recs["index_seq"] > MAX_SEQ) | (index < 1)), 40,
             "index_seq out of range")
        base = first - recs["index_from"].astype(np.int64)
    else:
        index = np.where(inline, 0, first + pages)
        base = first
    fail(first + pages > next_seq, 0, f"uses seqs at or past next_seq {next_seq}")
    fail(~inline & (index >= next_seq), 40 if version >= 3 else 0,
         f"uses seqs at or past next_seq {next_seq}")
    # seqs: page spans never meet; an index page is no run's page and is shared only by
    # slices of one run (the same first page's seq)
    order = np.argsort(first, kind="stable")
    end = first + pages
    overlap = np.zeros(n, bool)
    overlap[order[1:]] = first[order[1:]] < end[order[:-1]]
    fail(overlap, 0, "its seqs overlap another run's")
    idx_runs = np.flatnonzero(~inline)
    if len(idx_runs):
        pos = np.searchsorted(first[order], index[idx_runs], side="right") - 1
        hit = (pos >= 0) & (index[idx_runs] < end[order][np.maximum(pos, 0)])
        mask = np.zeros(n, bool)
        mask[idx_runs[hit]] = True
        fail(mask, 40 if version >= 3 else 0, "its seqs overlap another run's")
        by_index: dict[int, int] = {}
        mask = np.zeros(n, bool)
        for i, s, b in zip(idx_runs.tolist(), index[idx_runs].tolist(),
                           base[idx_runs].tolist(), strict=True):
            mask[i] = by_index.setdefault(s, b) != b
        fail(mask, 40, "shares its index page with a slice of another run")
    return [RunMeta(int(a), int(b), int(c), bool(d), int(e), int(f), int(g),
                    index_seq=int(s), index_from=int(x))
            for a, b, c, d, e, f, g, s, x in zip(
                recs["first_seq"].tolist(), recs["pages"].tolist(), recs["kind"].tolist(),
                recs["inline"].tolist(), recs["rows"].tolist(), recs["raw"].tolist(),
                recs["stored"].tolist(), index.tolist(),
                (recs["index_from"] if version >= 3 else np.zeros(n, np.int64)).tolist(),
                strict=True)]


def encode_index(fences: Fences) -> bytes:
    lens, keys = fences.encode()
    body = b"".join([_INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, len(fences), len(keys)),
                     lens.tobytes(), keys])
    return body + struct.pack("<I", crc32(body))


def decode_index(data, *, pid: int, pages: int) -> Fences:
    """A run index page: must hold the fences of at least ``pages`` pages (the run's slice
    ends there; a run never cut holds exactly as many)."""
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
    if n < pages:
        raise FormatError(key, 8, f"index holds {n} pages, its run needs {pages}")
    if _INDEX_HEADER.size + 8 * n + keys_len != len(view) - 4:
        raise FormatError(key, 8, f"index declares {n} pages and {keys_len} key bytes; the "
                                  f"page has {len(view)} bytes")
    r.pos = _INDEX_HEADER.size
    lens = r.array("<u4", 2 * n, "fence lengths")
    blob = r.take(keys_len, "fence keys")
    return _decode_fences(lens, blob, key=key, offset=_INDEX_HEADER.size + 8 * n)
