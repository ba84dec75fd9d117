"""ReservoirReader: read-only access as of one checkpoint version, for any process (executors)."""

from __future__ import annotations

from headrace.metrics import PrometheusExport
from headrace.reservoir.batch import check_page_id
from headrace.reservoir.errors import PageNotFound
from headrace.reservoir.keys import stream_prefix
from headrace.reservoir.options import ReservoirOptions, check_stream_name
from headrace.reservoir.recovery import CheckpointLoader
from headrace.reservoir.source import PageSource
from headrace.reservoir.state import HOT_PAGE_TABLE_ENTRIES, State
from headrace.retry import DEFAULT_RETRY, RetryPolicy
from headrace.store import ObjectStore, open_store


class ReservoirReader(PrometheusExport):
    """Pages as of checkpoint ``version``; never writes. A cache dir is optional (and may be
    shared by readers of the same stream: files are immutable and named by id and CRC64)."""

    metrics_prefix = "headrace_reservoir_reader"

    def __init__(self, store: ObjectStore, stream: str, version: int | None,
                 options: ReservoirOptions, cache_dir=None, retry: RetryPolicy = DEFAULT_RETRY,
                 *, _after: ReservoirReader | None = None):
        self.store = store
        self.opts = options
        self.stream = stream
        self.prefix = stream_prefix(check_stream_name(stream), options.stream_version)
        mode = options.registry
        bundled = store.capabilities.listable if mode == "auto" else mode == "bundled"
        self.loader = CheckpointLoader(store, self.prefix, bundled, options.max_checkpoint_bytes,
                                       retry)
        base = _after._state if _after is not None and (
            version is None or _after.version <= version) else None
        loaded = self.loader.load(version, base=base)
        self._state: State = loaded.state
        if _after is not None:  # same stream: the same cache, its files already admitted
            self.source = _after.source
            if self.source.cache is not None:
                self.source.cache.new_epoch()  # a new version: the next pass over the data
        else:
            self.source = PageSource(store, self.prefix, options, cache_dir, retry, name="reader")
            if self.source.cache is not None:
                self.source.cache.retain_only(
                    {f: r.crc64 for f, r in self._state.files.items()}, delete_others=False)
        self.source.admit_recovered(loaded.latest_object, self._state)
        self.reads = 0
        self._read = self.source.read
        self._hot: dict[int, tuple] = {}

    @classmethod
    def open(cls, store_or_url, stream: str = "default", version: int | None = None,
             cache_dir=None, options: ReservoirOptions | None = None,
             retry: RetryPolicy = DEFAULT_RETRY) -> ReservoirReader:
        return cls(open_store(store_or_url), stream, version, options or ReservoirOptions(),
                   cache_dir, retry)

    def at(self, version: int | None = None) -> ReservoirReader:
        """A reader of a later ``version`` (None: the latest) of the same stream that reuses
        this one's recovered state and local cache: it reads only the checkpoints written since
        (one object per version), where ``open`` reads the chain back to the last snapshot.
        This reader stays valid; the two share the cache, so close only the last one."""
        return ReservoirReader(self.store, self.stream, version, self.opts, retry=self.loader.retry,
                               _after=self)

    @property
    def version(self) -> int:
        return self._state.version

    def state(self) -> State:
        return self._state

    def read(self, page_id: int) -> bytes:
        # hot path (~1 µs in all): a reader's version never changes, so the full argument
        # tuple of a page's read is memoised per page id (bounded like State's table); an int
        # found there is a valid page id, so the checks run on a miss only
        if type(page_id) is int:
            args = self._hot.get(page_id)
            if args is not None:
                self.reads += 1
                return self._read(*args)
        pid = check_page_id(page_id)
        found = self._state.lookup(pid)
        if found is None:
            raise PageNotFound(pid, self._state.version)
        fid, off, size, crc = found
        row = self._state.files[fid]
        args = (fid, row.size, row.crc64, off, size, crc)
        if len(self._hot) >= HOT_PAGE_TABLE_ENTRIES:
            self._hot.clear()
        self._hot[pid] = args
        self.reads += 1
        return self._read(*args)

    def contains(self, page_id: int) -> bool:
        return self._state.lookup(check_page_id(page_id)) is not None

    def page_ids(self):
        """Every page id as of this version (sorted, a read-only numpy view)."""
        return self._state.ids

    def metrics(self) -> dict:
        m = {"version": self.version, "pages": len(self._state), "files": len(self._state.files),
             "reads": self.reads, "checkpoint_gets": self.loader.gets,
             "range_gets": self.source.range_gets}
        if self.source.cache is not None:
            m.update({f"cache_{k}": v for k, v in self.source.cache.metrics().items()})
        return m

    def close(self) -> None:
        self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
