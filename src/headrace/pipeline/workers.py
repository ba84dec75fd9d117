"""Per-Python-worker caches: the store and the reservoir readers tasks share.

Spark reuses Python workers across tasks, so a reader opened once per (stream, version) serves
every task of the micro-batch that lands on the worker, and its local cache (one folder per
worker process) means a state file is fetched once per worker, not once per task.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from headrace.store import CountingStore, open_store

_lock = threading.Lock()
_readers: dict[tuple, object] = {}
_stores: dict[str, CountingStore] = {}


def task_store(url: str) -> CountingStore:
    """The store tasks of this worker process use, counting requests for the driver's report."""
    with _lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = CountingStore(open_store(url))
        return store


def open_reader(url: str, stream: str, version: int | None, cache_dir: str | None):
    """A ReservoirReader for (url, stream, version), cached per process; None before the first
    state version exists."""
    from headrace.reservoir import ReservoirReader

    if version is None:
        return None
    key = (url, stream, version)
    store = task_store(url)
    with _lock:
        reader = _readers.get(key)
        if reader is None:
            for old in [k for k in _readers if k[:2] == key[:2]]:
                _readers.pop(old)  # older versions of the same stream are not read again
            folder = Path(cache_dir or Path(tempfile.gettempdir()) / "headrace-cache")
            reader = ReservoirReader.open(store, stream=stream, version=version,
                                          cache_dir=folder / f"{os.getpid()}" / stream)
            _readers[key] = reader
    return reader
