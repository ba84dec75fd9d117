"""Cross-process writes: PageRunWriter in a Spark task, PageRun shipped back to the driver.

A task writes pages into its own BlobFileWriter; each file that fills up is uploaded by the task
itself under a random id with bit 62 set (PUT with Create, so an id collision is detected and a
new id drawn, never overwritten). ``finish()`` returns a PageRun: the uploaded files' metadata,
where each of the run's pages now lives, its deletes, and the leftover pages packed into one
compact buffer. The driver's ``ReservoirStorage.absorb`` registers the files and merges the
leftovers of all runs into its shared MergedBlobFileWriter, so a micro-batch with many small
tasks still costs one PUT at checkpoint.

Files uploaded by a failed task are never absorbed: they are orphans, deleted by
``ReservoirStorage.sweep_orphans`` once older than ``orphan_grace_s``.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

import numpy as np

from headrace.errors import AlreadyExists, InvalidInput
from headrace.reservoir.batch import PageBatch
from headrace.reservoir.formats.datafile import BlobFileWriter
from headrace.reservoir.inflight import FileRef
from headrace.reservoir.keys import RUN_BIT, data_key, stream_prefix
from headrace.reservoir.options import ReservoirOptions, check_stream_name
from headrace.reservoir.state import NewFile
from headrace.retry import DEFAULT_RETRY
from headrace.store import CREATE, ObjectStore, open_store

log = logging.getLogger("headrace.reservoir")


def _z(dtype) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass(frozen=True)
class PageRun:
    """What one task wrote: picklable, compact (numpy columns + one leftover buffer)."""

    run_id: str
    prefix: str
    files: tuple[NewFile, ...] = ()
    # pages living in the uploaded files (file offsets are absolute)
    file_page_ids: np.ndarray = field(default_factory=lambda: _z(np.int64))
    file_page_file_ids: np.ndarray = field(default_factory=lambda: _z(np.uint64))
    file_page_offsets: np.ndarray = field(default_factory=lambda: _z(np.uint32))
    file_page_sizes: np.ndarray = field(default_factory=lambda: _z(np.uint32))
    file_page_crc32s: np.ndarray = field(default_factory=lambda: _z(np.uint32))
    # leftover pages: bytes in ``leftover_data`` at ``leftover_offsets``
    leftover_ids: np.ndarray = field(default_factory=lambda: _z(np.int64))
    leftover_offsets: np.ndarray = field(default_factory=lambda: _z(np.uint32))
    leftover_sizes: np.ndarray = field(default_factory=lambda: _z(np.uint32))
    leftover_crc32s: np.ndarray = field(default_factory=lambda: _z(np.uint32))
    leftover_data: bytes = b""
    deleted_ids: np.ndarray = field(default_factory=lambda: _z(np.int64))

    @property
    def page_count(self) -> int:
        return len(self.file_page_ids) + len(self.leftover_ids)


class PageRunWriter:
    """Writes pages in any process; needs only picklable inputs (a store URL, names, options)."""

    def __init__(self, store_or_url: str | ObjectStore, stream: str = "default",
                 run_id: str = "", options: ReservoirOptions | None = None):
        if not isinstance(run_id, str) or not run_id:
            raise InvalidInput(f"run_id must be a non-empty string, got {run_id!r:.80}")
        self.store = open_store(store_or_url)
        self.opts = options or ReservoirOptions()
        self.prefix = stream_prefix(check_stream_name(stream), self.opts.stream_version)
        self.run_id = run_id
        self._batch = PageBatch(self.opts, self._upload_full)
        self._files: list[NewFile] = []
        self._finished = False
        self.puts = 0

    def write(self, page_id: int, data) -> None:
        self._check_open()
        self._batch.write(page_id, data)

    def write_many(self, page_ids, data, sizes) -> None:
        """As Session.write_many: pages laid end to end in ``data``."""
        self._check_open()
        self._batch.write_many(page_ids, data, sizes)

    def delete(self, page_id: int) -> None:
        self._check_open()
        self._batch.delete(page_id)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("PageRunWriter.finish() was already called")

    def _upload_full(self, ref: FileRef) -> None:
        enc = ref.writer.finalize()
        for _attempt in range(8):
            fid = RUN_BIT | (secrets.randbits(62) or 1)
            key = data_key(self.prefix, fid)
            try:
                DEFAULT_RETRY.call(lambda k=key: self.store.put(k, enc.parts, CREATE),
                                   what=f"upload {key}")
            except AlreadyExists:
                if self.store.get(key).data == enc.data:  # our own put, reply lost and retried
                    break
                continue
            break
        else:
            raise AlreadyExists(key)
        self.puts += 1
        ref.file_id = fid
        ref.data_offset = ref.writer.data_offset()
        ref.info = NewFile(fid, len(enc.page_ids), int(enc.sizes.sum()), enc.data_end,
                           enc.crc64)
        self._files.append(ref.info)

    def finish(self) -> PageRun:
        """Upload nothing more; return the run (full files are already in the store)."""
        self._check_open()
        self._finished = True
        b = self._batch
        ids, fids, offs, sizes, crcs = [], [], [], [], []
        for pid, loc in b.pages.items():
            if loc is None or loc[0] is b.cur:
                continue
            ref, rel, size, crc = loc
            ids.append(pid)
            fids.append(ref.file_id)
            offs.append(ref.data_offset + rel)
            sizes.append(size)
            crcs.append(crc)
        l_ids, l_rel, l_sizes, l_crcs, blob = b.leftovers()
        # pack the leftovers tightly: one buffer holding only live pages
        packed = BlobFileWriter(self.opts.max_file_size)
        new_offs = packed.add_many(l_ids, l_rel, l_sizes, l_crcs, blob)
        return PageRun(
            run_id=self.run_id, prefix=self.prefix, files=tuple(self._files),
            file_page_ids=np.array(ids, np.int64), file_page_file_ids=np.array(fids, np.uint64),
            file_page_offsets=np.array(offs, np.uint32), file_page_sizes=np.array(sizes, np.uint32),
            file_page_crc32s=np.array(crcs, np.uint32),
            leftover_ids=np.array(l_ids, np.int64), leftover_offsets=new_offs.astype(np.uint32),
            leftover_sizes=np.array(l_sizes, np.uint32), leftover_crc32s=np.array(l_crcs, np.uint32),
            leftover_data=bytes(packed.data),
            deleted_ids=np.array(sorted(pid for pid, loc in b.pages.items() if loc is None),
                                 np.int64),
        )
