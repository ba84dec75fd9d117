"""BackupManager: incremental snapshots of a local directory to the object store.

``upload(dir, checkpoint_id)`` diffs the directory against the last *committed* snapshot, uploads
new and mutable files (large ones as several chunks, all chunks in parallel on a named thread
pool, each put retried by the shared policy), writes the index blob and returns its id. The
caller records that id durably, then calls ``cleanup(id)``; until then the new blobs carry a TTL
and a crash leaves only garbage that the sweep removes.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from headrace.backup.blobs import BlobStore
from headrace.backup.config import BackupConfig
from headrace.backup.crc import combine_chunks
from headrace.backup.diff import DirDiffer, LocalFile, build_dir_index
from headrace.backup.digest import chunk_digest, content_hash
from headrace.backup.index import FileBlob, FileIndex, SnapshotIndex
from headrace.backup.lifecycle import SweepReport, cleanup_counted, sweep
from headrace.backup.progress import ProgressCallback, ProgressTracker
from headrace.backup.target import lineage_of, mark_directory
from headrace.codec import Clock, SystemClock, crc32
from headrace.errors import HeadraceError, InvalidInput
from headrace.metrics import PrometheusExport
from headrace.store import ObjectStore, open_store

log = logging.getLogger("headrace.backup")


class BackupManager(PrometheusExport):
    """Backs up one local directory (one store of one task) under ``prefix`` of an object store."""

    metrics_prefix = "headrace_backup"

    def __init__(self, store_or_url: ObjectStore | str, *, prefix: str = "backup",
                 config: BackupConfig | None = None, clock: Clock | None = None,
                 previous_index_blob_id: str | None = None,
                 progress: ProgressCallback | None = None, keep_previous: bool = False):
        """``keep_previous``: snapshots this manager uploads keep the one they diff against
        (its cleanup makes it permanent instead of deleting it): a branch point the caller
        named, as ``headrace backup --previous X`` does. Default: Samza's lifecycle, where
        committing a snapshot retires its predecessor."""
        self.config = config or BackupConfig()
        self.store = open_store(store_or_url)
        self._owns_store = not isinstance(store_or_url, ObjectStore)  # opened from a URL
        self.clock = clock or SystemClock()
        self.blobs = BlobStore(self.store, prefix, retry=self.config.retry, clock=self.clock,
                               ttl_ms=self.config.ttl_ms)
        self.progress = progress
        self.keep_previous = bool(keep_previous)
        self._differ = DirDiffer(self.config)
        self._pool = ThreadPoolExecutor(self.config.upload_workers,
                                        thread_name_prefix="headrace-backup-upload")
        self._hash_pool = ThreadPoolExecutor(min(self.config.upload_workers, os.cpu_count() or 1),
                                             thread_name_prefix="headrace-backup-hash")
        self._lock = threading.Lock()
        self._closed = False
        self._prev_id: str | None = None
        self._prev_index: SnapshotIndex | None = None
        self._uploaded: dict[str, SnapshotIndex] = {}  # recent uploads, not yet cleaned up
        self._metrics = dict.fromkeys(
            ("uploads", "files_uploaded", "files_retained", "blobs_to_release", "blobs_uploaded",
             "bytes_uploaded", "bytes_retained", "index_bytes", "cleanups", "blobs_deleted",
             "sweeps"), 0)
        if previous_index_blob_id is not None:
            self.init(previous_index_blob_id)

    # -- lifecycle -------------------------------------------------------------------------------
    def init(self, committed_index_blob_id: str | None) -> None:
        """Start from the last committed snapshot: redo its (idempotent) cleanup, diff against it."""
        if committed_index_blob_id is None:
            self._prev_id, self._prev_index = None, None
            return
        self.cleanup(committed_index_blob_id)

    def upload(self, directory: str | os.PathLike, checkpoint_id: str | int) -> str:
        """Upload a snapshot of ``directory``; returns the new index blob id (not yet committed)."""
        self._check_open()
        if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool):
            checkpoint_id = str(checkpoint_id)
        root = Path(directory)
        if not root.is_dir():
            raise InvalidInput(f"backup source {str(root)!r} is not a directory")
        if not isinstance(checkpoint_id, str) or not checkpoint_id or len(checkpoint_id) > 256:
            raise InvalidInput(f"checkpoint_id must be a non-empty str (<= 256 chars), "
                               f"got {checkpoint_id!r}")
        prev = self._prev_index.dir_index if self._prev_index else None
        diff = self._differ.diff(str(root), prev)
        added = list(diff.added_files())
        retained = list(diff.retained_files())
        total = sum(f.size for f in added)
        tracker = ProgressTracker("upload", len(added), total, self.progress)
        uploaded = self._upload_files(added, tracker)
        index = SnapshotIndex(
            checkpoint_id=checkpoint_id, created_time_ms=self.clock.now_ms(),
            dir_index=build_dir_index(diff, uploaded),
            prev_snapshot_index_blob_id=self._prev_id,
            keep_previous=self.keep_previous and self._prev_id is not None,
            job_name=self.config.job_name, job_instance=self.config.job_instance,
            task_name=self.config.task_name, store_name=self.config.store_name)
        index_id, index_bytes = self.blobs.put_index(index)
        self._mark_source(root, index_id)
        with self._lock:  # cleanup(index_id) will not need to read it back
            self._uploaded[index_id] = index
            while len(self._uploaded) > 4:
                self._uploaded.pop(next(iter(self._uploaded)))
        released = len(index.dir_index.removed_blob_ids() - index.dir_index.present_blob_ids())
        with self._lock:
            m = self._metrics
            m["uploads"] += 1
            m["files_uploaded"] += len(added)
            m["files_retained"] += len(retained)
            m["blobs_to_release"] += released
            m["bytes_uploaded"] += total
            m["bytes_retained"] += sum(f.size for f in retained)
            m["index_bytes"] += index_bytes
        log.info("uploaded snapshot %s (checkpoint %s): %d files / %d bytes sent, %d retained",
                 index_id, checkpoint_id, len(added), total, len(retained))
        return index_id

    def cleanup(self, index_blob_id: str) -> None:
        """After the caller durably recorded ``index_blob_id``: make it permanent, drop the old."""
        self._check_open()
        with self._lock:
            index = self._uploaded.pop(index_blob_id, None)
        if index is None and self._prev_id == index_blob_id:
            index = self._prev_index
        known = {self._prev_id: self._prev_index} if self._prev_index is not None else {}
        index, deleted = cleanup_counted(self.blobs, index_blob_id, index, known)
        with self._lock:
            self._metrics["cleanups"] += 1
            self._metrics["blobs_deleted"] += deleted
            self._prev_id, self._prev_index = index_blob_id, index

    def sweep(self, *, dry_run: bool = False) -> SweepReport:
        """Delete expired garbage of crashed commits (see lifecycle.sweep)."""
        self._check_open()
        report = sweep(self.blobs, dry_run=dry_run)
        with self._lock:
            self._metrics["sweeps"] += 1
        return report

    def metrics(self) -> dict[str, int]:
        with self._lock:
            return dict(self._metrics)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._hash_pool.shutdown(wait=True, cancel_futures=True)
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> BackupManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise HeadraceError("BackupManager is closed")

    # -- uploads ---------------------------------------------------------------------------------
    def _upload_files(self, files: list[LocalFile], tracker: ProgressTracker
                      ) -> dict[str, FileIndex]:
        """Upload chunks of large files and packs of small files in parallel."""
        chunk = self.config.chunk_size
        tasks: list[list[tuple[LocalFile, int, int]]] = []  # each task = one blob
        pack: list[tuple[LocalFile, int, int]] = []
        pack_bytes = 0
        for f in files:
            if f.size == 0:
                tracker.add(files=1)
            elif f.size < self.config.pack_below:
                if pack and pack_bytes + f.size > chunk:
                    tasks.append(pack)
                    pack, pack_bytes = [], 0
                pack.append((f, 0, f.size))
                pack_bytes += f.size
            else:
                tasks.extend([(f, off, min(chunk, f.size - off))] for off in range(0, f.size, chunk))
        if pack:
            tasks.append(pack)
        remaining: dict[str, int] = {}
        for task in tasks:
            for f, _, _ in task:
                remaining[f.rel] = remaining.get(f.rel, 0) + 1
        remaining_lock = threading.Lock()

        def upload_blob(task: list[tuple[LocalFile, int, int]]
                        ) -> list[tuple[str, FileBlob, bytes]]:
            parts = [_read_exact(f, off, size) for f, off, size in task]
            # checksums and content hashes (BLAKE3: the CPU-heavy part) are computed on the
            # hash pool while this worker waits for the put (on the local store: write + fsync)
            sums = self._hash_pool.submit(_checksums, parts)
            try:
                blob_id = self.blobs.put_blob(parts)  # a gather put: packed files not joined
            finally:
                checksums = sums.result()  # ``parts`` stay untouched until both are done
            out = []
            pos = 0
            finished = 0
            for (f, off, size), (value, digest) in zip(task, checksums, strict=True):
                out.append((f.rel, FileBlob(blob_id, off, size, value, pos), digest))
                pos += size
                with remaining_lock:
                    remaining[f.rel] -= 1
                    finished += remaining[f.rel] == 0
            tracker.add(files=finished, nbytes=pos)
            return out

        futures = [self._pool.submit(upload_blob, task) for task in tasks]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((fut for fut in done if fut.exception() is not None), None)
        if failed is not None:
            for fut in pending:
                fut.cancel()
            wait(pending)
            raise failed.exception()  # type: ignore[misc]
        chunks: dict[str, list[tuple[FileBlob, bytes]]] = {f.rel: [] for f in files}
        for fut in futures:
            for rel, blob, digest in fut.result():
                chunks[rel].append((blob, digest))
        out: dict[str, FileIndex] = {}
        for f in files:
            done = sorted(chunks[f.rel], key=lambda c: c[0].offset)
            blobs = tuple(b for b, _ in done)
            value = combine_chunks((b.crc32, b.size) for b in blobs)
            out[f.rel] = FileIndex(f.name, blobs, f.mtime_ms, f.ctime_ms, f.size, value, f.mode,
                                   content_hash(d for _, d in done))
        with self._lock:
            self._metrics["blobs_uploaded"] += len(tasks)
        return out

    def _mark_source(self, root: Path, index_id: str) -> None:
        """Record next to ``root`` that it was backed up here: a later restore of this backup
        into it is then no restore into an unrelated folder. Best effort: a read-only parent
        only means such a restore needs ``force``."""
        try:
            mark_directory(root.absolute(), lineage_of(self.blobs), index_id, self.clock,
                           fsync=True)
        except OSError as e:
            log.info("cannot write the backup marker next to %s: %s", root, e)

    @property
    def last_committed(self) -> str | None:
        """The index id this manager diffs against (the last one cleaned up)."""
        return self._prev_id


def _checksums(parts: list[bytes]) -> list[tuple[int, bytes]]:
    """(crc32, BLAKE3 digest) of each part (both release the GIL)."""
    return [(crc32(p), chunk_digest(p)) for p in parts]


def _read_exact(f: LocalFile, offset: int, size: int) -> bytes:
    try:
        fd = os.open(f.path, os.O_RDONLY)
        try:
            data = os.pread(fd, size, offset)
        finally:
            os.close(fd)
    except OSError as e:
        raise InvalidInput(f"cannot read {f.rel!r} ({f.path}) for backup: "
                           f"{e.strerror or e}") from e
    if len(data) != size:
        raise InvalidInput(f"{f.rel!r} shrank while being backed up (read {len(data)} of "
                           f"{size} bytes at offset {offset}): back up a checkpoint, not a "
                           f"live directory")
    return data
