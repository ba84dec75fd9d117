"""ReservoirStorage: stream state as pages packed into immutable files, made durable by checkpoints.

Write path: a Session writes pages into its own BlobFileWriter (full files go straight to the
upload queue); ``commit`` moves its leftovers into the shared MergedBlobFileWriter and makes its
pages readable by everyone (in-flight buffer). ``checkpoint`` makes everything committed durable
as version N+1 with one conditional PUT when the leftovers and the checkpoint fit one file (a
bundle), then deletes what no retained checkpoint references. The PUT of the checkpoint object
(registry="bundled") or of the registry (registry="file") is the commit point: a crash before it
leaves only orphans, which ``sweep_orphans`` removes.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import numpy as np

from headrace.errors import InvalidInput
from headrace.metrics import PrometheusExport
from headrace.reservoir.batch import MISSING, PageBatch, check_page_id, new_writer, read_loc
from headrace.reservoir.compaction import compact, repack_sparse, sweep_orphans
from headrace.reservoir.errors import PageNotFound, ReservoirFailed
from headrace.reservoir.formats import registry as regfmt
from headrace.reservoir.inflight import FileRef, Uploader
from headrace.reservoir.keys import (
    bundle_id,
    checkpoint_key,
    data_key,
    stream_prefix,
)
from headrace.reservoir.options import ReservoirOptions, check_stream_name
from headrace.reservoir.recovery import CheckpointLoader
from headrace.reservoir.runs import PageRun
from headrace.reservoir.source import PageSource
from headrace.reservoir.state import NewFile, State
from headrace.reservoir.versions import StreamVersions
from headrace.reservoir.writeout import write_checkpoint
from headrace.retry import DEFAULT_RETRY, RetryPolicy
from headrace.store import ObjectStore, open_store

log = logging.getLogger("headrace.reservoir")


class Session:
    """One writer's uncommitted pages; ``commit`` hands them to the storage."""

    def __init__(self, storage: ReservoirStorage):
        self._storage = storage
        self._generation = storage._generation
        self._batch = PageBatch(storage.opts, storage._ship_full)

    def _check(self) -> None:
        if self._generation != self._storage._generation:  # the storage was reset: start over
            self._batch.reset()
            self._generation = self._storage._generation

    def write(self, page_id: int, data) -> None:
        self._check()
        self._batch.write(page_id, data)

    def write_many(self, page_ids, data, sizes) -> None:
        """Write pages laid end to end in ``data`` (``sizes[i]`` bytes for ``page_ids[i]``):
        the same as ``write`` of each in order, without a Python call per page."""
        self._check()
        self._batch.write_many(page_ids, data, sizes)

    def delete(self, page_id: int) -> None:
        self._check()
        self._batch.delete(page_id)

    def read(self, page_id: int) -> bytes:
        """This session's own writes first, then the storage (in-flight, cache, store)."""
        self._check()
        loc = self._batch.read(check_page_id(page_id))
        if loc is MISSING:
            return self._storage.read(page_id)
        data = read_loc(loc)
        return data if data is not None else self._storage._read_uploaded(loc)

    def commit(self) -> None:
        self._check()
        self._storage._commit_batch(self._batch)
        self._batch = PageBatch(self._storage.opts, self._storage._ship_full)


class ReservoirStorage(PrometheusExport):
    metrics_prefix = "headrace_reservoir"

    def __init__(self, store: ObjectStore, stream: str, options: ReservoirOptions,
                 cache_dir=None, retry: RetryPolicy = DEFAULT_RETRY):
        self.store = store
        self.opts = options
        self.stream = check_stream_name(stream)
        self.prefix = stream_prefix(stream, options.stream_version)
        self.retry = retry
        mode = options.registry
        self.bundled_registry = (store.capabilities.listable if mode == "auto"
                                 else mode == "bundled")
        self.loader = CheckpointLoader(store, self.prefix, self.bundled_registry,
                                       options.max_checkpoint_bytes, retry)
        self.source = PageSource(store, self.prefix, options, cache_dir, retry)
        self.versions = StreamVersions(store, stream, options)
        self._lock = threading.RLock()
        self._ckpt_lock = threading.Lock()
        self._generation = 0
        self._closed = False
        self._failure: BaseException | None = None
        loaded = self.loader.load(None)
        self._adopt(loaded)
        self._committed: dict[int, tuple | None] = {}
        self._new_files: dict[int, FileRef] = {}
        self._merged = FileRef(new_writer(options))
        self._uploader = Uploader(store, options.upload_workers, options.in_flight_capacity,
                                  self._on_uploaded, retry)
        self._stats = {"checkpoints": 0, "bundles": 0, "commits": 0, "absorbed_runs": 0,
                       "deleted_objects": 0, "reads_inflight": 0, "reads_stored": 0}
        self.last_checkpoint_puts = 0
        if self.source.cache is not None:
            self.source.cache.retain_only({f: r.crc64 for f, r in self._state.files.items()})
            self.source.admit_recovered(loaded.latest_object, self._state)
        self.versions.mark_open()
        self._versions_cleaned = False
        self._collect_garbage(self._state.registry, self._state.registry)

    def _adopt(self, loaded) -> None:
        """Make a recovered checkpoint the base of this writer (open and reset)."""
        self._state: State = loaded.state
        # bytes of the files dead since this process opened the stream, until deleted (the
        # checkpoints that still need them retained): what snapshot_dead_ratio weighs
        self._dead_bytes: dict[int, int] = {}
        self._registry_etag = loaded.registry_etag
        self._ckpt_keys: dict[int, str] = dict(loaded.keys)  # version -> object key
        self._next_file_id = max(1, self._state.next_file_id)  # recorded, no longer allocating

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, store_or_url, stream: str = "default", version: str | None = None,
             options: ReservoirOptions | None = None, *, cache_dir=None,
             retry: RetryPolicy = DEFAULT_RETRY) -> ReservoirStorage:
        """Recover ``stream`` to its latest checkpoint. ``version`` names a stream version (a
        separate prefix; overrides ``options.stream_version``)."""
        opts = options or ReservoirOptions()
        if version is not None and not isinstance(version, str):
            raise InvalidInput(f"version names a stream version (a str), got {version!r:.80}; to "
                               "read an older checkpoint use ReservoirReader.open(..., version=N)")
        if version is not None:
            opts = ReservoirOptions(**{**opts.__dict__, "stream_version": version})
        return cls(open_store(store_or_url), stream, opts, cache_dir, retry)

    @property
    def version(self) -> int:
        """The latest durable checkpoint version (0 before the first checkpoint)."""
        return self._state.version

    def session(self) -> Session:
        self._check_open()
        return Session(self)

    # -- reads ---------------------------------------------------------------------------------
    def read(self, page_id: int) -> bytes:
        """Committed page bytes: in-flight buffer, then local cache, then the object store."""
        pid = check_page_id(page_id)
        with self._lock:
            loc = self._committed.get(pid, MISSING)
            state = self._state
        if loc is None:
            raise PageNotFound(pid)
        if loc is not MISSING:
            data = read_loc(loc)
            if data is not None:
                self._stats["reads_inflight"] += 1
                return data
            return self._read_uploaded(loc)
        found = state.lookup(pid)
        if found is None:
            raise PageNotFound(pid, state.version)
        fid, off, size, crc = found
        row = state.files[fid]
        self._stats["reads_stored"] += 1
        return self.source.read(fid, row.size, row.crc64, off, size, crc)

    def contains(self, page_id: int) -> bool:
        try:
            self.read(page_id)
        except PageNotFound:
            return False
        return True

    def _read_uploaded(self, loc) -> bytes:
        ref, off, size, crc = loc
        info = ref.info
        self._stats["reads_stored"] += 1
        return self.source.read(ref.file_id, info.size, info.crc64, ref.data_offset + off, size,
                                crc)

    # -- writes --------------------------------------------------------------------------------
    def _alloc_file_id(self) -> int:
        """62 random bits: a data file key no other writer of the stream will ever write (a
        second writer counting from the same checkpoint would reuse a counter's ids)."""
        with self._lock:
            while True:
                fid = secrets.randbits(62)
                st = self._state
                if fid and fid not in st.files and fid not in st.deleted_files \
                        and fid not in self._new_files:
                    return fid

    def _ship_full(self, ref: FileRef) -> None:
        """Finalize a full file and queue it for upload (blocks when the queue is full)."""
        self._check_open()
        fid = self._alloc_file_id()
        w = ref.writer
        ref.data_offset = w.data_offset()
        enc = w.finalize()
        ref.file_id = fid
        ref.info = NewFile(fid, len(enc.page_ids), int(enc.sizes.sum()), enc.data_end, enc.crc64)
        self._uploader.submit(ref, data_key(self.prefix, fid), enc.parts)

    def _on_uploaded(self, ref: FileRef, data) -> None:
        self.source.register(ref.file_id, ref.info.crc64, data)
        ref.writer = None  # pages now come from the cache or the store

    def _commit_batch(self, batch: PageBatch) -> None:
        self._check_open()
        if self._failure is not None:
            raise ReservoirFailed(f"a checkpoint failed ({self._failure}); call reset()")
        self._uploader.raise_if_failed()
        ids, rel, sizes, crcs, blob = batch.leftovers()
        with self._lock:
            for ref in batch.full_refs:
                self._new_files[ref.file_id] = ref
            placed = self._add_leftovers(ids, rel, sizes, crcs, blob)
            committed = self._committed
            cur = batch.cur
            for pid, loc in batch.pages.items():
                if loc is None or loc[0] is not cur:
                    committed[pid] = loc
            for pid, loc in placed:
                committed[pid] = loc
            self._stats["commits"] += 1

    def _add_leftovers(self, ids, offs, sizes, crcs, blob) -> list:
        """Copy pages into the merged writer (shipping it whenever it fills); returns locs."""
        out = []
        n = len(ids)
        i = 0
        while i < n:
            w = self._merged.writer
            sizes_i = np.asarray(sizes[i:], np.int64)
            base = len(w.data)
            if w.pad:  # every page starts on a block boundary
                sizes_i = -(-sizes_i // w.block) * w.block
                base = -(-base // w.block) * w.block
            counts = np.arange(1, len(sizes_i) + 1)
            total = w._index_size(len(w) + counts) + base + np.cumsum(sizes_i)
            fits = np.flatnonzero(total <= w.max_file_size)
            take = int(fits[-1]) + 1 if len(fits) else (1 if len(w) == 0 else 0)
            if take == 0:
                self._ship_merged()
                continue
            ref = self._merged
            new_rel = w.add_many(ids[i:i + take], offs[i:i + take], sizes[i:i + take],
                                 crcs[i:i + take], blob)
            out.extend(zip(ids[i:i + take].tolist(),
                           [(ref, int(r), int(s), int(c)) for r, s, c in zip(
                               new_rel.tolist(), sizes[i:i + take].tolist(),
                               crcs[i:i + take].tolist(), strict=True)], strict=True))
            i += take
            if w.is_full():
                self._ship_merged()
        return out

    def _ship_merged(self) -> None:
        ref = self._merged
        self._merged = FileRef(new_writer(self.opts))
        if len(ref.writer):
            self._ship_full(ref)  # assigns the file id
            self._new_files[ref.file_id] = ref

    def absorb(self, runs: list[PageRun]) -> None:
        """Register files uploaded by tasks and merge the leftovers of all runs (driver side)."""
        self._check_open()
        self._uploader.raise_if_failed()
        with self._lock:
            for run in runs:
                if run is None:
                    continue
                if run.prefix != self.prefix:
                    raise InvalidInput(f"run {run.run_id!r} was written for {run.prefix!r}, "
                                       f"not {self.prefix!r}")
                refs = {}
                for nf in run.files:
                    if nf.file_id in self._state.files or nf.file_id in self._state.deleted_files:
                        raise InvalidInput(f"run {run.run_id!r} was already absorbed by an "
                                           f"earlier checkpoint (file {nf.file_id:016x})")
                    refs[nf.file_id] = FileRef(None, nf.file_id, 0, nf)
                    self._new_files[nf.file_id] = refs[nf.file_id]
                c = self._committed
                for pid, f, o, s, k in zip(run.file_page_ids.tolist(),
                                           run.file_page_file_ids.tolist(),
                                           run.file_page_offsets.tolist(),
                                           run.file_page_sizes.tolist(),
                                           run.file_page_crc32s.tolist(), strict=True):
                    c[pid] = (refs[f], o, s, k)
                for pid, loc in self._add_leftovers(run.leftover_ids, run.leftover_offsets,
                                                    run.leftover_sizes, run.leftover_crc32s,
                                                    run.leftover_data):
                    c[pid] = loc
                for pid in run.deleted_ids.tolist():
                    c[pid] = None
                self._stats["absorbed_runs"] += 1

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint(self, *, keep_from: int | None = None) -> int:
        """Make everything committed durable as checkpoint N+1; returns N+1. ``keep_from``:
        a retained checkpoint that must stay readable (its chain and files kept) although N+1
        supersedes it — a caller that may abandon N+1 and redo its work from ``keep_from``."""
        self._check_open()
        with self._ckpt_lock, self._lock:
            return self._checkpoint_locked(keep_from)

    def _checkpoint_locked(self, keep_from: int | None = None) -> int:
        if self._failure is not None:
            raise ReservoirFailed(f"a previous checkpoint failed ({self._failure}); call reset()")
        try:
            return write_checkpoint(self, keep_from)
        except BaseException as e:
            self._failure = e
            raise

    # -- maintenance -----------------------------------------------------------------------
    def _collect_garbage(self, old_reg: regfmt.Registry, new_reg: regfmt.Registry) -> None:
        """Delete files and checkpoint objects no retained checkpoint references."""
        state = self._state
        if len(new_reg) == 0:
            return
        oldest = int(new_reg.versions[0])
        doomed = state.gc_plan(oldest)
        keys = [data_key(self.prefix, f) for f in doomed]
        keep_live = state.referenced_file_ids() - set(doomed)
        retained = set(new_reg.versions.tolist())
        for i, v in enumerate(old_reg.versions.tolist()):
            if v in retained:
                continue
            key = self._ckpt_keys.pop(v, None) or self._default_ckpt_key(
                v, bool(old_reg.snapshot[i]), bool(old_reg.bundle[i]), int(old_reg.crc64s[i]))
            if not (bool(old_reg.bundle[i]) and bundle_id(v) in keep_live):
                keys.append(key)
        if keys:
            keys = sorted(set(keys))
            self.retry.call(lambda: self.store.delete_many(keys), what="delete unreferenced")
            self._stats["deleted_objects"] += len(keys)
        for f in doomed:
            state.deleted_files.pop(f, None)
            self._dead_bytes.pop(f, None)
            if self.source.cache is not None:
                self.source.cache.evict(f)

    def _default_ckpt_key(self, v: int, snapshot: bool, bundle: bool, crc: int) -> str:
        if bundle or self.bundled_registry:
            return checkpoint_key(self.prefix, v, snapshot=snapshot, bundle=True)
        return checkpoint_key(self.prefix, v, snapshot=snapshot, bundle=False, crc=crc)

    def sweep_orphans(self, grace_s: float | None = None, now: float | None = None) -> list[str]:
        """Delete data/checkpoint objects nothing references and older than the grace period."""
        return sweep_orphans(self, self.opts.orphan_grace_s if grace_s is None else grace_s,
                             time.time() if now is None else now)

    def compact(self, *, sweep: bool = True) -> int | None:
        """Repack files below the live-ratio threshold; returns the checkpoint that made it
        durable, or None when nothing needed compaction. Then (``sweep``) delete orphans older
        than ``orphan_grace_s`` (files of tasks that failed before being absorbed)."""
        self._check_open()
        version = compact(self)
        if sweep:
            self.sweep_orphans()
        return version

    def repack_sparse(self, max_live_ratio: float = 0.5, max_read_bytes: int = 64 << 20) -> int:
        """Before a checkpoint: copy the live pages of the sparsest files (at most
        ``max_live_ratio`` of their bytes live, reading at most ``max_read_bytes``) into it, so
        that files a writer keeps only partly alive — bundles whose pages later checkpoints
        mostly replaced — die whole. Returns the files chosen (0: nothing sparse)."""
        self._check_open()
        if not 0.0 <= max_live_ratio < 1.0:
            raise InvalidInput(f"max_live_ratio must be in [0, 1), got {max_live_ratio!r}")
        return repack_sparse(self, max_live_ratio, max_read_bytes)

    def reset(self) -> None:
        """Drop everything not checkpointed (after a failure), reset every session and reload
        the latest committed checkpoint: after CommitUnknown that tells whether the commit
        landed; after ConcurrentWriter the winner's checkpoint becomes this writer's base."""
        with self._ckpt_lock, self._lock:
            self._uploader.wait_idle()
            self._uploader.clear_error()
            self._committed = {}
            self._new_files = {}
            self._merged = FileRef(new_writer(self.opts))
            self._generation += 1
            try:
                loaded = self.loader.load(None)
            except BaseException as e:
                self._failure = e  # still failed: reset() again once the store answers
                raise
            self._failure = None
            self._adopt(loaded)

    def metrics(self) -> dict:
        with self._lock:
            m = dict(self._stats)
            m.update(version=self._state.version, pages=len(self._state),
                     files=len(self._state.files), pending_deletes=len(self._state.deleted_files),
                     uncheckpointed_pages=len(self._committed),
                     uploads_pending=self._uploader.pending(),
                     uploaded_files=self._uploader.uploaded_files,
                     uploaded_bytes=self._uploader.uploaded_bytes)
        if self.source.cache is not None:
            m.update({f"cache_{k}": v for k, v in self.source.cache.metrics().items()})
        return m

    def prometheus(self, labels: dict[str, object] | None = None) -> str:
        """``metrics()`` in Prometheus text format, labelled with the stream prefix."""
        return super().prometheus({"stream": self.prefix, **(labels or {})})

    def state(self) -> State:
        return self._state

    def _check_open(self) -> None:
        if self._closed:
            raise ReservoirFailed("ReservoirStorage is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._uploader.close()
        self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

