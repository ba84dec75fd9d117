"""Per-Python-worker caches: the store and the reservoir readers tasks share.

Spark reuses Python workers across tasks, so a reader opened once per (stream, version) serves
every task of the micro-batch that lands on the worker, and its local cache (one folder per
worker process) means a state file is fetched once per worker, not once per task. The next
micro-batch's reader is built on the previous one (``ReservoirReader.at``): one checkpoint
object read per batch, the same cache. Cache folders of worker processes that have exited are
removed when a worker opens its first reader (Spark replaces workers; their folders would
otherwise pile up in the temp dir).

A Python worker imports what a task needs when it first needs it (the reservoir here, the state
and the output parts in tasks.py, one kernel kind in operators.build): a worker that only reads
the queue or runs a stateless stage never pays for the rest, and a restart's cold workers start
sooner.
"""

from __future__ import annotations

import os
import shutil
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
    from headrace.reservoir import ReservoirReader  # on first use: see the module's note

    if version is None:
        return None
    key = (url, stream, version)
    store = task_store(url)
    with _lock:
        reader = _readers.get(key)
        if reader is None:
            # older versions of the same stream are not read again; the newest of them is the
            # base the new version is read on (one checkpoint object per micro-batch, not the
            # chain back to the last snapshot, and the same local cache)
            older = sorted((k for k in _readers if k[:2] == key[:2]), key=lambda k: k[2])
            base = _readers[older[-1]] if older else None
            for old in older:
                _readers.pop(old)
            if base is not None:
                reader = base.at(version)
            else:
                folder = Path(cache_dir or Path(tempfile.gettempdir()) / "headrace-cache")
                _sweep_exited_workers(folder)
                reader = ReservoirReader.open(store, stream=stream, version=version,
                                              cache_dir=folder / f"{os.getpid()}" / stream,
                                              options=reader_options())
            _readers[key] = reader
    return reader


def reader_options():
    """The workers' reader options: the local file cache holds ``HEADRACE_STATE_CACHE_MB``
    (default 10 GiB of disk); files larger than the cache are read page by page with ranged
    GETs. Where ``spark.executor.pyspark.memory`` caps the worker's address space the cache
    reads its files with pread instead of mapping them (reservoir/cache.py), so it takes none
    of the cap: capped workers keep the whole default cache."""
    from headrace.reservoir import ReservoirOptions  # on first use: see the module's note

    mb = int(os.environ.get("HEADRACE_STATE_CACHE_MB") or 10 << 10)
    return ReservoirOptions(max_cache_size_bytes=mb << 20,
                            max_file_size=min(ReservoirOptions().max_file_size, mb << 20))


_swept: set[Path] = set()


def _sweep_exited_workers(folder: Path) -> None:
    """Delete the cache folders (named by pid) of worker processes that no longer exist."""
    if folder in _swept or not folder.is_dir():
        return
    _swept.add(folder)
    for d in folder.iterdir():
        if not d.name.isdigit() or d.is_symlink() or not d.is_dir():
            continue
        try:
            os.kill(int(d.name), 0)
            continue  # alive (or not ours to signal): keep
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (PermissionError, OverflowError, ValueError):
            continue
