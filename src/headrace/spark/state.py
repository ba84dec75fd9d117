"""Operator state: one spine per (operator, side, bucket), kept as pages in the reservoir.

Page ids (int64, positive) pack where a page belongs::

    bit 62..54  operator index (< 512)     bit 53..52  side (0 left/only, 1 right)
    bit 51..36  bucket (< 65536)            bit 35..0   sequence (0 = the bucket's root page)

The root page is JSON: ``{"batches": [page ids], "next_seq": n}``; every other page is one
spine batch (``Batch.to_bytes()``, CRC-checked). A task reads its buckets as of the state
version the driver names, runs the kernel, and writes only what changed — new batch pages, a
new root, deletions of batches a compaction replaced — through a ``PageRunWriter``. Page ids
come from the root page's counter, so a retried or replayed task writes the same ids with the
same bytes: applying its run twice is harmless.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from headrace.errors import FormatError, InvalidInput
from headrace.spark.kernels import ZSET_SCHEMA
from headrace.spine.batch import Batch
from headrace.spine.spine import Spine, SpineConfig
from headrace.store import CountingStore, open_store

MAX_BATCHES = 8  # a bucket with more batches than this is compacted into one on write
_OP_BITS, _SIDE_BITS, _BUCKET_BITS, _SEQ_BITS = 9, 2, 16, 36


def page_id(op: int, side: int, bucket: int, seq: int) -> int:
    if not (0 <= op < 1 << _OP_BITS and 0 <= side < 1 << _SIDE_BITS
            and 0 <= bucket < 1 << _BUCKET_BITS and 0 <= seq < 1 << _SEQ_BITS):
        raise InvalidInput(f"page id out of range: op={op} side={side} bucket={bucket} seq={seq}")
    return (op << 54) | (side << 52) | (bucket << 36) | seq


def split_page_id(pid: int) -> tuple[int, int, int, int]:
    return (pid >> 54, (pid >> 52) & 3, (pid >> 36) & 0xFFFF, pid & ((1 << 36) - 1))


@dataclass
class BucketRoot:
    batches: list[int]
    next_seq: int

    def to_bytes(self) -> bytes:
        return json.dumps({"batches": self.batches, "next_seq": self.next_seq}).encode()

    @staticmethod
    def from_bytes(data, *, where: str) -> BucketRoot:
        try:
            obj = json.loads(bytes(data))
            batches = [int(b) for b in obj["batches"]]
            next_seq = int(obj["next_seq"])
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(where, 0, f"bad bucket root page: {e}") from e
        if next_seq < 1 or any(b < 0 for b in batches):
            raise FormatError(where, 0, "bucket root page has negative ids")
        return BucketRoot(batches, next_seq)


class SpineZSet:
    """The kernels' view of one bucket's spine (the StateSpine protocol), shared by both state
    backends; ``_new`` holds the batches this task added."""

    spine: Spine
    _new: list[Batch]

    def lookup_many(self, keys: pa.Array) -> pa.Table:
        return self.spine.lookup_many(keys).cast(ZSET_SCHEMA)  # the spine keeps large_string

    def insert_updates(self, updates: pa.Table) -> None:
        if updates.num_rows == 0:
            return
        batch = Batch.from_arrow(updates)
        if len(batch):
            self.spine.insert(batch)
            self._new.append(batch)

    @property
    def changed(self) -> bool:
        return bool(self._new)

    def to_table(self) -> pa.Table:
        return self.spine.to_table()


class BucketState(SpineZSet):
    """The state of one (operator, side, bucket) as reservoir pages (the default backend)."""

    def __init__(self, reader, op: int, side: int, bucket: int):
        self.op, self.side, self.bucket = op, side, bucket
        self.root_id = page_id(op, side, bucket, 0)
        root = None
        if reader is not None and reader.contains(self.root_id):
            root = BucketRoot.from_bytes(reader.read(self.root_id), where=f"page {self.root_id}")
        self.root = root or BucketRoot([], 1)
        batches = [Batch.from_bytes(reader.read(pid)) for pid in self.root.batches]
        self.spine = Spine(pa.string(), pa.string(), name=f"op{op}/s{side}/b{bucket}",
                           config=SpineConfig(background_merge=False), batches=batches)
        self._new: list[Batch] = []

    def write(self, writer) -> None:
        """Write this bucket's changes as pages (compacting when it has too many batches)."""
        if not self._new:
            return
        old_ids = list(self.root.batches)
        if len(old_ids) + len(self._new) > MAX_BATCHES:
            self.spine.compact()
            to_write = [b for b in self.spine.batches if len(b)]
            for pid in old_ids:
                writer.delete(pid)
            kept: list[int] = []
        else:
            to_write = self._new
            kept = old_ids
        seq = self.root.next_seq
        new_ids = []
        for b in to_write:
            pid = page_id(self.op, self.side, self.bucket, seq)
            writer.write(pid, b.to_bytes())
            new_ids.append(pid)
            seq += 1
        self.root = BucketRoot(kept + new_ids, seq)
        writer.write(self.root_id, self.root.to_bytes())
        self._new = []


_readers: dict[tuple, object] = {}
_readers_lock = threading.Lock()
_task_stores: dict[str, CountingStore] = {}


def task_store(url: str) -> CountingStore:
    """The store tasks of this worker process use, counting requests for the driver's report."""
    with _readers_lock:
        store = _task_stores.get(url)
        if store is None:
            store = _task_stores[url] = CountingStore(open_store(url))
        return store


def open_reader(url: str, stream: str, version: int | None, cache_dir: str | None):
    """A ReservoirReader for (url, stream, version), cached per process (Python workers are
    reused across tasks, so a bucket's pages are fetched once per executor, not per task)."""
    from headrace.reservoir import ReservoirReader

    if version is None:
        return None
    key = (url, stream, version)
    store = task_store(url)
    with _readers_lock:
        reader = _readers.get(key)
        if reader is None:
            for old in [k for k in _readers if k[:2] == key[:2]]:
                _readers.pop(old)  # older versions of the same stream are not read again
            # one cache folder per worker process (the reservoir's cache is per process);
            # Python workers are reused, so a file is fetched once per worker, not per task
            folder = Path(cache_dir or Path(tempfile.gettempdir()) / "headrace-cache")
            reader = ReservoirReader.open(store, stream=stream, version=version,
                                          cache_dir=folder / f"{os.getpid()}" / stream)
            _readers[key] = reader
    return reader
