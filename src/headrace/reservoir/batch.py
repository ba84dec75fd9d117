"""PageBatch: the pages one writer (a session, or a task's run) has written and not committed.

Pages go into the batch's own BlobFileWriter; a file that reaches max_file_size is handed to
``ship_full`` at once (the session uploads it through the storage's queue, a task uploads it
itself), so big writers upload in parallel; what is left when the batch commits are leftovers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from headrace.reservoir.formats.datafile import BlobFileWriter
from headrace.reservoir.inflight import FileRef
from headrace.reservoir.options import PageNotFound, ReservoirOptions

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
