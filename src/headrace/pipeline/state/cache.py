"""Decoded state pages, kept per Python worker process across tasks and micro-batches.

A page never changes once written, so a decoded page (zero-copy Arrow columns) can serve every
later lookup that lands on the same worker — RocksDB's block cache, for headrace's LSM. Spark
reuses Python workers, so a bucket's base run is decoded once per worker, not once per batch.
Entries are keyed by (stream, page id, and the page's place in the reservoir: file id, offset,
size, CRC32) — known from the page table, so a hit reads no bytes at all — and the caller still
checks the page's fence keys on every hit. Decoded run index pages (fences) are kept the same
way. The cache is bounded in bytes and evicts least recently used: ``HEADRACE_PAGE_CACHE_MB``;
else an eighth of ``spark.executor.pyspark.memory`` when that caps the worker; else a quarter
of the machine's memory shared by one worker per core (at least 256 MiB, at most 4 GiB).

Why that default: a micro-batch of random keys touches nearly every page of a big state, so the
run views must stay decoded between batches for a batch to cost O(delta). Spark may run a
bucket's task on either worker, so each worker ends up holding views of every bucket. With a
fixed 256 MiB a 4M-key group-by (~80 B per key in views) no longer fitted and every batch
decoded the state again: the group-by's task function alone at 4M keys took 2.97 s per
100k-row batch with 256 MiB, 0.87 s with 3 GiB (docs/pipeline.md).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict


def budget_bytes(env: str, default_mb: int, share: float) -> int:
    """A cache's size: ``env`` (MiB) when set; else, in a Python worker capped by
    ``spark.executor.pyspark.memory`` (Spark passes the cap as PYSPARK_EXECUTOR_MEMORY_MB and
    sets RLIMIT_AS to it, which counts mmapped cache files too), ``share`` of the cap, at most
    ``default_mb``."""
    if os.environ.get(env):
        return int(os.environ[env]) << 20
    cap = int(os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "-1") or -1)
    mb = default_mb if cap <= 0 else min(default_mb, max(16, int(cap * share)))
    return mb << 20


def machine_share_mb(share: float = 1 / 4, least_mb: int = 256, most_mb: int = 4096) -> int:
    """``share`` of this machine's memory divided among one Python worker per core, in MiB,
    within [least_mb, most_mb]."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return least_mb
    per_worker = int(total * share) // max(1, os.cpu_count() or 1) >> 20
    return max(least_mb, min(most_mb, per_worker))


DEFAULT_BYTES = budget_bytes("HEADRACE_PAGE_CACHE_MB", machine_share_mb(), 1 / 8)


class PageCache:
    def __init__(self, max_bytes: int = DEFAULT_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: tuple):
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: tuple, page, size: int | None = None) -> None:
        size = page.nbytes if size is None else size
        if size > self.max_bytes // 4:
            return  # one page never crowds out the rest
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (page, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, old) = self._items.popitem(last=False)
                self._bytes -= old

    @property
    def nbytes(self) -> int:
        return self._bytes


PAGES = PageCache()
