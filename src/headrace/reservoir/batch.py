"""PageBatch: the pages one writer (a session, or a task's run) has written and not committed.

Pages go into the batch's own BlobFileWriter; a file that reaches max_file_size is handed to
``ship_full`` at once (the session uploads it through the storage's queue, a task uploads it
itself), so big writers upload in parallel; what is left when the batch commits are leftovers.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat

import numpy as np

from headrace.codec import crc32
from headrace.reservoir.errors import PageNotFound
from headrace.reservoir.formats.datafile import BlobFileWriter
from headrace.reservoir.inflight import FileRef
from headrace.reservoir.options import ReservoirOptions

Loc = tuple[FileRef, int, int, int]  # (file, offset in writer data or file, size, crc32)
MISSING = object()


def check_page_id(page_id: object) -> int:
    if type(page_id) is int and -(1 << 63) <= page_id < (1 << 63):
        return page_id
    if not isinstance(page_id, int | np.integer) or isinstance(page_id, bool):
        raise TypeError(f"page id must be an int, got {type(page_id).__name__}")
    pid = int(page_id)
    if not -(1 << 63) <= pid < (1 << 63):
        raise ValueError(f"page id {pid} does not fit an i64")
    return pid


def check_page_run(page_ids, data, sizes) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """Validate a bulk write: i64 page ids, non-negative sizes that add up to ``data``."""
    ids = np.asarray(page_ids)
    if ids.ndim != 1 or (len(ids) and ids.dtype.kind not in "iu"):
        raise TypeError(f"page ids must be a 1-d array of ints, got {ids.dtype} x {ids.shape}")
    if ids.dtype.kind == "u" and len(ids) and int(ids.max()) >= 1 << 63:
        raise ValueError("a page id does not fit an i64")
    ids = ids.astype(np.int64, copy=False)
    sizes = np.asarray(sizes)
    if sizes.shape != ids.shape or (len(sizes) and sizes.dtype.kind not in "iu"):
        raise ValueError(f"sizes must be {len(ids)} ints, one per page id")
    sizes = sizes.astype(np.int64, copy=False)
    src = memoryview(data).cast("B")
    if len(sizes) and int(sizes.min()) < 0:
        raise ValueError("a page size is negative")
    if int(sizes.sum()) != len(src):
        raise ValueError(f"page sizes add up to {int(sizes.sum())} bytes, data has {len(src)}")
    return ids, sizes, src


def _starts(sizes: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return starts


def read_loc(loc: Loc) -> bytes | None:
    """The page's bytes if its file is still in memory, else None (read it from the store)."""
    ref, off, size, _crc = loc
    w = ref.writer
    if w is not None:
        return w.page(off, size)
    return None


def new_writer(opts: ReservoirOptions) -> BlobFileWriter:
    return BlobFileWriter(opts.max_file_size, pad_to_block=opts.pad_to_block,
                          block_size=opts.block_size)


class PageBatch:
    def __init__(self, opts: ReservoirOptions, ship_full: Callable[[FileRef], None]):
        self.opts = opts
        self.ship_full = ship_full
        self.pages: dict[int, Loc | None] = {}
        self.full_refs: list[FileRef] = []
        self.deleted: set[int] = set()
        self.cur = FileRef(new_writer(opts))

    def write(self, page_id: int, data) -> None:
        pid = check_page_id(page_id)
        mv = memoryview(data).cast("B")
        if not self.cur.writer.fits(len(mv)):
            self._ship()
        rel, size, crc = self.cur.writer.add(pid, mv)
        self.pages[pid] = (self.cur, rel, size, crc)
        self.deleted.discard(pid)
        if self.cur.writer.is_full():
            self._ship()

    def write_many(self, page_ids, data, sizes) -> None:
        """Pages laid end to end in ``data`` (``sizes[i]`` bytes each), as ``write`` of each in
        order (a later copy of a page id wins), but vectorised: one copy per file's run of
        pages, one C call per page for its CRC32, bookkeeping by numpy and dict.update."""
        ids, sizes, src = check_page_run(page_ids, data, sizes)
        if self.opts.pad_to_block:  # padded layout: each page starts on a block boundary
            offs = _starts(sizes).tolist()
            for pid, off, size in zip(ids.tolist(), offs, sizes.tolist(), strict=True):
                self.write(pid, src[off:off + size])
            return
        n = len(ids)
        offs = _starts(sizes)
        crcs = np.fromiter(map(crc32, map(src.__getitem__, map(slice, offs.tolist(),
                                                                (offs + sizes).tolist()))),
                           np.uint32, n)
        i = 0
        while i < n:
            w = self.cur.writer
            k = w.fit_count(sizes[i:])
            if k == 0:
                self._ship()
                continue
            j = i + k
            rel = w.add_many(ids[i:j], offs[i:j], sizes[i:j], crcs[i:j], src)
            locs = zip(repeat(self.cur, k), rel.tolist(), sizes[i:j].tolist(),
                       crcs[i:j].tolist(), strict=True)
            self.pages.update(zip(ids[i:j].tolist(), locs, strict=True))
            i = j
            if w.is_full():
                self._ship()
        if self.deleted:
            self.deleted.difference_update(ids.tolist())

    def delete(self, page_id: int) -> None:
        pid = check_page_id(page_id)
        self.pages[pid] = None
        self.deleted.add(pid)

    def _ship(self) -> None:
        ref = self.cur
        self.cur = FileRef(new_writer(self.opts))
        self.full_refs.append(ref)
        self.ship_full(ref)

    def lookup(self, page_id: int):
        """Loc, None (deleted here) or MISSING (not touched by this batch)."""
        return self.pages.get(page_id, MISSING)

    def read(self, page_id: int):
        loc = self.pages.get(page_id, MISSING)
        if loc is MISSING:
            return MISSING
        if loc is None:
            raise PageNotFound(page_id)
        return loc

    def leftovers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bytearray]:
        """(page ids, offsets in blob, sizes, crc32s, blob): live pages of the open writer."""
        cur = self.cur
        w = cur.writer
        n = len(w)
        if n == 0:
            z = np.zeros(0, np.uint32)
            return np.zeros(0, np.int64), z, z, z, w.data
        ids = np.frombuffer(w.ids, np.int64)
        rel = np.frombuffer(w.rel_offsets, np.uint32)
        sizes = np.frombuffer(w.sizes, np.uint32)
        crcs = np.frombuffer(w.crcs, np.uint32)
        # live = the last copy of each page in this (newest) writer, unless deleted since
        _u, first_from_end = np.unique(ids[::-1], return_index=True)
        live = np.zeros(n, bool)
        live[n - 1 - first_from_end] = True
        if self.deleted:
            live &= ~np.isin(ids, np.fromiter(self.deleted, np.int64, len(self.deleted)))
        return ids[live], rel[live], sizes[live], crcs[live], w.data

    def reset(self) -> None:
        self.pages.clear()
        self.full_refs.clear()
        self.deleted.clear()
        self.cur = FileRef(new_writer(self.opts))
