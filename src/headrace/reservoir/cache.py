"""Local disk cache of whole data files, fetched on a page miss, CRC-verified, LRU-evicted.

- A miss downloads the whole file on a named worker pool; its CRC64 is checked before the file
  is admitted (the reference skips this check; headrace does not).
- Every page read checks the page's CRC32. A bad cached file is evicted and downloaded again
  once (healed; compaction heals the same way on a bad whole-file CRC64). A download whose CRC64
  fails twice is the store's fault: ChecksumMismatch names the object key. A page that still
  fails after a verified download is the local disk's fault: the error names the cache file.
- A file larger than the whole cache is never cached: its pages are read with ranged GETs.
- Eviction: least recently used first, but among the oldest few the least frequently used goes;
  a background thread evicts once the cache passes ``cache_evict_from`` (80%) of its size. A
  download that finds no room (the rest pinned or reserved by other downloads) is not admitted:
  the reads waiting for it are served from the downloaded bytes (``stats["bypassed"]``) — a
  busy cache never fails a read. A file a writer registers waits for room up to a timeout.
- Epochs (``new_epoch``; a reader following a stream starts one per version, i.e. per
  micro-batch): a streaming job reads the same files in the same order every batch, and when
  they do not all fit, LRU evicts exactly the file the scan needs next — every read misses.
  Once epochs are in use, files not read in this epoch or the last go first (LRU as above);
  then, of the rest, the most recently read goes: a file read in this epoch is not needed
  again until the next, and of last epoch's files the last read is needed last. A cyclic scan
  of N files through a cache of C then misses about N - C files per epoch instead of N.
- Files are named ``{file_id:016x}-{crc64:016x}.dat`` so a reused id can never alias.
- Cached files are mmapped, except where the process's address space is capped (RLIMIT_AS, as
  ``spark.executor.pyspark.memory`` caps Python workers): there they are read with pread, so
  the cache's size is bounded by its disk budget, not by the cap.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import mmap
import os
import resource
import secrets
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from headrace.codec import crc32, crc64
from headrace.errors import ChecksumMismatch
from headrace.reservoir.errors import CacheFull
from headrace.reservoir.options import ReservoirOptions
from headrace.retry import DEFAULT_RETRY
from headrace.store import ObjectStore, payload_size, payload_views

log = logging.getLogger("headrace.reservoir.cache")
_LRU_CANDIDATES = 8
_TICKS = itertools.count()  # recency: a larger tick = used more recently (thread-safe counter)


class _File:
    """An open cached file, read with pread (or O_DIRECT). Its descriptor closes when the last
    reference goes: a read holds one, so an eviction under a read never closes the descriptor
    the read is using (nor lets another file reuse its number)."""

    __slots__ = ("fd", "direct")

    def __init__(self, path: Path, direct: bool):
        self.fd, self.direct = -1, False
        if direct and hasattr(os, "O_DIRECT"):
            with contextlib.suppress(OSError):  # a filesystem without O_DIRECT: plain reads
                self.fd, self.direct = os.open(path, os.O_RDONLY | os.O_DIRECT), True
        if self.fd < 0:
            self.fd = os.open(path, os.O_RDONLY)

    def __getitem__(self, span: slice) -> bytes:
        off, size = span.start, span.stop - span.start
        if not self.direct:
            return os.pread(self.fd, size, off)
        start = off & ~4095  # O_DIRECT: block-aligned read into an aligned buffer
        end = -(-(off + size) // 4096) * 4096
        buf = mmap.mmap(-1, end - start)
        try:
            n = os.preadv(self.fd, [buf], start)
            return buf[off - start:min(off - start + size, n)]
        finally:
            buf.close()

    def __del__(self, _close=os.close):  # bound early: it may run at interpreter exit
        if self.fd >= 0:
            _close(self.fd)
            self.fd = -1


def _map_files(direct: bool) -> bool:
    """mmap cached files unless this process's address space is capped (RLIMIT_AS, which
    ``spark.executor.pyspark.memory`` sets on Python workers) or O_DIRECT is asked for. A
    slice of an mmap is ~0.5 µs faster than a pread; under a cap, mapped files would take
    the address space the task needs (the kernel's page cache keeps hot files in memory
    either way)."""
    if direct:
        return False
    try:
        return resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY
    except (OSError, ValueError, AttributeError):
        return True


class _Entry:
    __slots__ = ("file_id", "crc", "path", "size", "file", "pins", "freq", "tick", "epoch",
                 "fresh")

    def __init__(self, file_id: int, crc: int, path: Path, size: int, direct: bool,
                 mapped: bool, epoch: int = 0):
        self.file_id, self.crc, self.path, self.size = file_id, crc, path, size
        self.pins = 0
        self.freq = 1
        self.tick = next(_TICKS)
        self.epoch = epoch  # the cache's epoch when the file was last read (or admitted)
        self.fresh = True  # admitted, not read yet (a download's reader is about to)
        self.file: mmap.mmap | _File | None = None  # None once evicted (or for an empty file)
        if mapped and size:
            with open(path, "rb") as f:
                self.file = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        elif size:
            self.file = _File(path, direct)

    def read(self, off: int, size: int) -> bytes:
        f = self.file  # this reference keeps the file open (or mapped) until we return
        return f[off:off + size] if f is not None else b""

    def close(self) -> None:
        """Out of the cache: closed (or unmapped) once no read holds it."""
        self.file = None


class _Uncacheable(Exception):
    """The file is larger than the whole cache: read its pages from the store."""


class LocalCache:
    def __init__(self, cache_dir: str | os.PathLike, store: ObjectStore, options: ReservoirOptions,
                 key_of, *, name: str = "reservoir"):
        self.dir = Path(cache_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store = store
        self.opts = options
        self.key_of = key_of  # file id -> object key
        self.max_bytes = options.max_cache_size_bytes
        self._mapped = _map_files(options.direct_io)
        self._entries: dict[int, _Entry] = {}
        self._inflight: dict[int, Future] = {}
        self._uncacheable: set[int] = set()
        self._used = 0
        self._reserved = 0
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._pool = ThreadPoolExecutor(options.download_workers,
                                        thread_name_prefix=f"headrace-{name}-download")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._evictor = threading.Thread(target=self._evict_loop, name=f"headrace-{name}-evict",
                                         daemon=True)
        self._evictor.start()
        self.hits = 0
        self.epoch = 0  # 0: epochs not in use (plain LRU + frequency)
        self.stats = {"misses": 0, "downloads": 0, "evictions": 0, "healed": 0,
                      "registered": 0, "bytes_downloaded": 0, "bypassed": 0}

    def new_epoch(self) -> None:
        """Start the next pass over the data (a micro-batch): see the module docstring."""
        with self._lock:
            self.epoch += 1

    # -- lifecycle -------------------------------------------------------------------------
    def retain_only(self, referenced: dict[int, int], *, delete_others: bool = True) -> None:
        """Admit cached files still referenced (file id -> crc64); delete the rest."""
        for p in self.dir.iterdir():
            name = p.name
            parsed = _parse(name)
            if parsed is None or referenced.get(parsed[0]) != parsed[1]:
                if delete_others or name.startswith(".tmp-"):
                    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                        p.unlink()
                continue
            with self._lock:
                if parsed[0] not in self._entries:
                    self._add_entry(parsed[0], parsed[1], p, p.stat().st_size)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._evictor.join(timeout=5)
        with self._lock:
            for e in self._entries.values():
                e.close()
            self._entries.clear()

    def metrics(self) -> dict:
        with self._lock:
            return dict(self.stats, hits=self.hits, files=len(self._entries), used_bytes=self._used,
                        max_bytes=self.max_bytes)

    # -- reads -----------------------------------------------------------------------------
    def read_page(self, file_id: int, file_size: int, file_crc: int, off: int, size: int,
                  page_crc: int) -> bytes:
        # fast path, no lock: a hit. ``f`` keeps the file open (or mapped) even if an eviction
        # runs meanwhile; a read that comes back wrong falls through to the locked path.
        e = self._entries.get(file_id)
        f = e.file if e is not None and e.crc == file_crc else None
        if f is not None:
            data = f[off:off + size]
            if len(data) == size and crc32(data) == page_crc:
                e.freq += 1
                e.tick = next(_TICKS)
                e.epoch = self.epoch
                e.fresh = False
                self.hits += 1  # an attribute, not stats["hits"]: this path is ~1 µs
                return data
        if file_size > self.max_bytes or file_id in self._uncacheable:
            return self._read_direct(file_id, off, size, page_crc)
        for attempt in (1, 2):
            try:
                entry = self._acquire(file_id, file_size, file_crc)
            except _Uncacheable:
                return self._read_direct(file_id, off, size, page_crc)
            if not isinstance(entry, _Entry):  # no room: the download's bytes, crc64-checked
                data = bytes(memoryview(entry)[off:off + size])
                if len(data) != size or crc32(data) != page_crc:
                    raise ChecksumMismatch(self.key_of(file_id), off,
                                           f"crc32 of page at [{off}, {off + size})",
                                           expected=page_crc, actual=crc32(data))
                return data
            try:
                data = entry.read(off, size)
            finally:
                self._release(entry)
            if len(data) == size and crc32(data) == page_crc:
                return data
            if attempt == 2:  # a fresh copy, verified against its crc64, reads back wrong
                raise ChecksumMismatch(str(entry.path), off,
                                       f"crc32 of page at [{off}, {off + size}) in the local "
                                       f"cache file for {self.key_of(file_id)!r} (re-downloaded, "
                                       "the stored object passed its crc64: the cache disk is "
                                       "at fault)", expected=page_crc, actual=crc32(data))
            self.heal(file_id, f"page crc32 at [{off}, {off + size})")
        raise AssertionError("unreachable")

    def _read_direct(self, file_id: int, off: int, size: int, page_crc: int) -> bytes:
        key = self.key_of(file_id)
        data = DEFAULT_RETRY.call(lambda: self.store.get_range(key, off, off + size),
                                  what=f"get_range {key}")
        if len(data) != size or crc32(data) != page_crc:
            raise ChecksumMismatch(key, off, f"crc32 of page at [{off}, {off + size})",
                                   expected=page_crc, actual=crc32(data))
        return data

    def heal(self, file_id: int, why: str) -> None:
        """A cached copy failed a CRC: drop it, so the next read downloads a fresh one."""
        log.warning("cached copy of %s fails its %s; evicting it", self.key_of(file_id), why)
        self.evict(file_id)
        with self._lock:
            self.stats["healed"] += 1

    def get_if_present(self, file_id: int) -> bytes | None:
        """Whole cached file, without touching LRU order or downloading (compaction reads)."""
        with self._lock:
            e = self._entries.get(file_id)
            if e is None:
                return None
            e.pins += 1
        try:
            return e.read(0, e.size)
        finally:
            self._release(e)

    def register(self, file_id: int, crc: int, data, *, wait: bool = True) -> None:
        """Admit a file this process has just written (no download needed); ``data`` is bytes
        or a list/tuple of parts, as a store put takes them. Without room (after waiting up to
        ``cache_wait_timeout_s`` for pins to go, if ``wait``) it is not admitted."""
        size = payload_size(data)
        if size > self.max_bytes:
            return
        try:
            self._reserve(size, self.opts.cache_wait_timeout_s if wait else 0.0)
        except CacheFull:
            return
        try:
            path = self._write(file_id, crc, data)
        except OSError as e:
            self._unreserve(size)
            log.warning("cannot cache file %x: %s", file_id, e)
            return
        with self._lock:
            self._reserved -= size
            old = self._entries.pop(file_id, None)
            if old is not None:
                self._used -= old.size
                old.close()
            self._add_entry(file_id, crc, path, size)
            self.stats["registered"] += 1
        self._wake.set()

    def evict(self, file_id: int) -> None:
        with self._lock:
            e = self._entries.pop(file_id, None)
            if e is not None:
                self._drop(e)

    # -- internals -------------------------------------------------------------------------
    def _add_entry(self, file_id: int, crc: int, path: Path, size: int) -> None:
        self._entries[file_id] = _Entry(file_id, crc, path, size, self.opts.direct_io,
                                        self._mapped, self.epoch)
        self._used += size
        if self._used > self.opts.cache_evict_from * self.max_bytes:
            self._wake.set()  # the evictor sleeps until the cache is over its mark

    def _drop(self, e: _Entry) -> None:
        self._used -= e.size
        e.close()
        with contextlib.suppress(FileNotFoundError):
            e.path.unlink()  # an open descriptor still reads it
        self.stats["evictions"] += 1
        self._space.notify_all()

    def _acquire(self, file_id: int, file_size: int, file_crc: int) -> _Entry | bytes:
        """The file's entry, pinned (release it); or, when the cache had no room for it, the
        file's bytes from the download."""
        while True:
            with self._lock:
                e = self._entries.get(file_id)
                if e is not None and e.crc == file_crc:
                    e.pins += 1
                    e.freq += 1
                    e.tick = next(_TICKS)
                    e.epoch = self.epoch
                    e.fresh = False
                    self.hits += 1
                    return e
                fut = self._inflight.get(file_id)
                if fut is None:
                    self.stats["misses"] += 1
                    fut = self._pool.submit(self._download, file_id, file_size, file_crc)
                    self._inflight[file_id] = fut
                    fut.add_done_callback(lambda _f, fid=file_id: self._done(fid))
            unadmitted = fut.result()  # raises the download's error to every waiter
            if unadmitted is not None:
                return unadmitted

    def _done(self, file_id: int) -> None:
        with self._lock:
            self._inflight.pop(file_id, None)

    def _release(self, e: _Entry) -> None:
        with self._lock:
            e.pins -= 1
            if e.pins == 0:
                self._space.notify_all()

    def _download(self, file_id: int, file_size: int, file_crc: int) -> bytes | None:
        """Fetch, check and admit a file: None once admitted; its bytes when there was no
        room (the waiting reads use them; the next miss downloads again)."""
        key = self.key_of(file_id)
        data = b""
        for attempt in (1, 2):
            data = DEFAULT_RETRY.call(lambda: self.store.get(key).data, what=f"get {key}")
            with self._lock:
                self.stats["downloads"] += 1
                self.stats["bytes_downloaded"] += len(data)
            actual = crc64(memoryview(data)[:file_size]) if len(data) >= file_size else -1
            if actual == file_crc:
                break
            if attempt == 2:
                raise ChecksumMismatch(key, 0, f"crc64 of data file (first {file_size} bytes)",
                                       expected=file_crc, actual=max(actual, 0))
            log.warning("download of %s fails its crc64; downloading once more", key)
        if len(data) > self.max_bytes:
            self._uncacheable.add(file_id)
            raise _Uncacheable(key)
        self.evict(file_id)
        self.register(file_id, file_crc, data, wait=False)
        with self._lock:
            if file_id in self._entries:
                return None
            self.stats["bypassed"] += 1
        return data

    def _write(self, file_id: int, crc: int, data) -> Path:
        path = self.dir / f"{file_id:016x}-{crc:016x}.dat"
        tmp = self.dir / f".tmp-{secrets.token_hex(6)}"
        with open(tmp, "wb") as f:
            f.writelines(payload_views(data))
        os.replace(tmp, path)
        return path

    def _reserve(self, size: int, wait_s: float) -> None:
        with self._lock:
            while self._used + self._reserved + size > self.max_bytes:
                victim = self._victim()
                if victim is not None:
                    del self._entries[victim.file_id]
                    self._drop(victim)
                    continue
                if wait_s <= 0 or not self._space.wait(timeout=wait_s):
                    raise CacheFull(f"cache full ({self._used} bytes pinned or reserved)")
            self._reserved += size

    def _unreserve(self, size: int) -> None:
        with self._lock:
            self._reserved -= size

    def _victim(self) -> _Entry | None:
        """Among the least recently used unpinned entries, the least frequently used; with
        epochs, cold files (not read in this epoch or the last) that way first, then the most
        recently read of the rest (a file admitted but not read yet is kept: its reader is
        about to read it)."""
        free = [e for e in self._entries.values() if e.pins == 0]
        if self.epoch:
            cold = [e for e in free if e.epoch < self.epoch - 1]
            read = [e for e in free if not e.fresh]  # not one a download is handing over
            if not cold and read:
                return max(read, key=lambda e: (e.epoch == self.epoch, e.tick))
            free = cold or free
        cands = heapq.nsmallest(_LRU_CANDIDATES, free, key=lambda e: e.tick)
        return min(cands, key=lambda e: e.freq) if cands else None

    def _evict_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()  # no polling: an idle cache costs no wake-ups
            self._wake.clear()
            with self._lock:
                limit = self.opts.cache_evict_from * self.max_bytes
                while self._used > limit:
                    victim = self._victim()
                    if victim is None:
                        break
                    del self._entries[victim.file_id]
                    self._drop(victim)


def _parse(name: str) -> tuple[int, int] | None:
    if not name.endswith(".dat") or len(name) != 37 or name[16] != "-":
        return None
    try:
        return int(name[:16], 16), int(name[17:33], 16)
    except ValueError:
        return None
