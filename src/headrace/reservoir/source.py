"""Reading committed pages from the local cache or the object store (CRC32 on every read)."""

from __future__ import annotations

from headrace.codec import crc32, crc64
from headrace.errors import ChecksumMismatch
from headrace.reservoir.cache import LocalCache
from headrace.reservoir.errors import CacheTooSmall
from headrace.reservoir.keys import bundle_id, data_key
from headrace.reservoir.options import ReservoirOptions
from headrace.retry import DEFAULT_RETRY, RetryPolicy
from headrace.store import ObjectStore


class PageSource:
    """Serves a page given its file and location; with a cache whole files are fetched."""

    def __init__(self, store: ObjectStore, prefix: str, options: ReservoirOptions,
                 cache_dir=None, retry: RetryPolicy = DEFAULT_RETRY, name: str = "reservoir"):
        self.store = store
        self.prefix = prefix
        self.retry = retry
        self.cache: LocalCache | None = None
        if cache_dir is not None:
            if options.max_cache_size_bytes < options.max_file_size:
                raise CacheTooSmall(
                    f"ReservoirOptions.max_cache_size_bytes={options.max_cache_size_bytes} "
                    f"cannot hold one data file (max_file_size={options.max_file_size}); "
                    "raise it or open without cache_dir")
            self.cache = LocalCache(cache_dir, store, options, self.key, name=name)
        self.range_gets = 0
        # read(file_id, file_size, file_crc64, off, size, crc32) -> bytes. Bound once, not
        # dispatched per call: a cached page read costs ~1 µs and a wrapper call ~0.25 µs.
        self.read = self.cache.read_page if self.cache is not None else self._read_range

    def key(self, file_id: int) -> str:
        return data_key(self.prefix, file_id)

    def _read_range(self, file_id: int, file_size: int, file_crc: int, off: int, size: int,
                    crc: int) -> bytes:
        """No cache: one ranged GET per page read."""
        key = self.key(file_id)
        self.range_gets += 1
        data = self.retry.call(lambda: self.store.get_range(key, off, off + size),
                               what=f"get_range {key}")
        actual = crc32(data)
        if len(data) != size or actual != crc:
            raise ChecksumMismatch(key, off, f"crc32 of page at [{off}, {off + size})",
                                   expected=crc, actual=actual)
        return data

    def read_whole(self, file_id: int, file_size: int, file_crc: int) -> bytes:
        """A whole file for compaction, CRC64-checked: from the cache if there (a corrupt cached
        copy is evicted: healed), else the store, without filling the cache."""
        if self.cache is not None:
            data = self.cache.get_if_present(file_id)
            if data is not None:
                if _crc_ok(data, file_size, file_crc):
                    return data
                self.cache.heal(file_id, "whole-file crc64 (compaction)")
        key = self.key(file_id)
        data = self.retry.call(lambda: self.store.get(key).data, what=f"get {key}")
        if not _crc_ok(data, file_size, file_crc):
            actual = crc64(memoryview(data)[:file_size]) if len(data) >= file_size else 0
            raise ChecksumMismatch(key, 0, f"crc64 of data file (first {file_size} bytes, "
                                   "compaction)", expected=file_crc, actual=actual)
        return data

    def admit_recovered(self, obj, state) -> None:
        """Recovery already fetched the newest checkpoint object: when it is a bundle whose
        pages are live, check its data CRC64 and put it in the cache (saves a download)."""
        if self.cache is None or obj is None or obj.kind != "bundle":
            return
        fid = bundle_id(state.version)
        row = state.files.get(fid)
        if row is None or len(obj.data) < row.size:
            return
        if crc64(memoryview(obj.data)[:row.size]) == row.crc64:
            self.cache.register(fid, row.crc64, obj.data)

    def register(self, file_id: int, crc: int, data) -> None:
        if self.cache is not None:
            self.cache.register(file_id, crc, data)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def _crc_ok(data, size: int, crc: int) -> bool:
    return len(data) >= size and crc64(memoryview(data)[:size]) == crc
