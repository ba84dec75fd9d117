"""BatchStore: where spine batches and checkpoints live. LocalBatchStore keeps a directory.

Directory layout (the DBSP storage directory, docs/spine.md):

    LOCK                      fcntl lock: one process per directory
    checkpoints.headrace      the catalog; atomically replacing it commits a checkpoint
    <ULID>.batch              batch files (shared by checkpoints)
    <uuid>/spine-<name>.dat   per checkpoint: each spine's batch list and metadata
    *.mut                     a file being written; renamed when complete

Every file is written as ``*.mut``, fsynced, renamed, and its directory fsynced. A write that
fails with a transient OS error (ENOSPC, EIO, ...: ``headrace.retry.TRANSIENT_OS_ERRNOS``) is
retried under a bounded RetryPolicy; a permanent one, or one that outlives the retries, raises
SpineWriteError naming the file. Nothing committed is touched by a failed write: the catalog is
only replaced once everything it names is on disk. On open the store removes ``*.mut`` files,
checkpoint folders the catalog does not name, and batch files no checkpoint references (left by
merges or commits that never finished).
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from headrace.codec import new_ulid
from headrace.errors import NotFound, RetryExhausted
from headrace.metrics import PrometheusExport
from headrace.retry import RetryPolicy, is_transient_os_error
from headrace.spine.batch import Batch
from headrace.spine.catalog import (
    BATCH_NAME,
    CheckpointInfo,
    SpineManifest,
    check_spine_name,
    decode_catalog,
    decode_manifest,
    encode_catalog,
    encode_manifest,
)
from headrace.spine.errors import (
    CheckpointNotFound,
    SpineError,
    SpineWriteError,
    StorageLocked,
)

log = logging.getLogger("headrace.spine.store")
CATALOG = "checkpoints.headrace"
#: retries of a local write: a few attempts within seconds, then the error surfaces
DEFAULT_WRITE_RETRY = RetryPolicy(max_attempts=5, base_delay_s=0.05, max_delay_s=1.0,
                                  max_elapsed_s=10.0)


class BatchStore(abc.ABC, PrometheusExport):
    """The seam between spines and storage; ``BatchStoreTests`` is its contract."""

    metrics_prefix = "headrace_spine_batchstore"

    @abc.abstractmethod
    def write_batch(self, batch: Batch, block_bytes: int = 64 * 1024) -> Batch:
        """Persist ``batch``; return the persisted twin (same contents, named)."""

    @abc.abstractmethod
    def open_batch(self, name: str) -> Batch: ...

    @abc.abstractmethod
    def discard(self, names: list[str]) -> None:
        """The caller no longer uses these batches; delete those no checkpoint needs."""

    @abc.abstractmethod
    def pin(self, names: list[str]) -> None:
        """Keep these batches until the next commit_checkpoint records them."""

    @abc.abstractmethod
    def commit_checkpoint(self, step: int, fingerprint: str,
                          manifests: dict[str, SpineManifest],
                          identifier: str = "") -> CheckpointInfo:
        """Record all manifests as one checkpoint: all or nothing."""

    @abc.abstractmethod
    def checkpoints(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first."""

    @abc.abstractmethod
    def read_manifests(self, checkpoint_id: str) -> dict[str, SpineManifest]: ...

    @abc.abstractmethod
    def remove_checkpoint(self, checkpoint_id: str) -> None: ...

    def remove_checkpoints(self, checkpoint_ids: list[str]) -> None:
        """Remove several checkpoints; a store overrides it to make that one commit."""
        for cid in checkpoint_ids:
            self.remove_checkpoint(cid)

    @abc.abstractmethod
    def batch_names(self) -> list[str]:
        """Every batch the store holds (referenced or not)."""

    @abc.abstractmethod
    def gc(self) -> list[str]:
        """Delete batches neither referenced by a checkpoint, pinned, nor in use; their names."""

    def close(self) -> None:
        """Release the store (locks, maps); the default holds none."""
        return None

    def metrics(self) -> dict:
        return {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, parts: list) -> int:
    """Write ``parts`` to a new file at ``path`` and fsync it: the one place spine bytes reach
    the disk (tests inject disk faults here)."""
    size = 0
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)
            size += len(p) if not hasattr(p, "size") else p.size
        f.flush()
        os.fsync(f.fileno())
    return size


def disk_io(path: Path, fn, retry: RetryPolicy = DEFAULT_WRITE_RETRY):
    """Run ``fn`` (a write concerning ``path``), retrying transient OS errors; SpineWriteError
    naming ``path`` when it fails for good."""
    attempts = 0

    def attempt():
        nonlocal attempts
        attempts += 1
        return fn()

    try:
        return retry.call(attempt, retry_if=is_transient_os_error, what=f"write of {path}")
    except RetryExhausted as e:
        raise SpineWriteError(str(path), e.__cause__, attempts) from e.__cause__
    except SpineWriteError:
        raise
    except OSError as e:
        raise SpineWriteError(str(path), e, attempts) from e


def write_atomic(path: Path, parts, retry: RetryPolicy = DEFAULT_WRITE_RETRY) -> int:
    """Write ``parts`` to ``path.mut``, fsync, rename over ``path``, fsync the directory.

    Either ``path`` holds all of ``parts`` or it is unchanged; a failed attempt removes its
    ``.mut`` file (without hiding the error that failed it).
    """
    parts = list(parts)
    tmp = path.with_name(path.name + ".mut")

    def once() -> int:
        try:
            size = _write_file(tmp, parts)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
        return size

    return disk_io(path, once, retry)


class LocalBatchStore(BatchStore):
    """A storage directory on the local disk, locked for one process, read through mmap."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True,
                 read_only: bool = False, write_retry: RetryPolicy | None = None):
        self.path = Path(path)
        self.read_only = read_only
        self._retry = write_retry or DEFAULT_WRITE_RETRY
        if read_only:
            create = False
        if create:
            self.path.mkdir(parents=True, exist_ok=True)
        elif not self.path.is_dir():
            raise NotFound(str(self.path))
        self._lock_fd = self._acquire_lock()
        self._mu = threading.Lock()
        self._live: set[str] = set()
        self._pinned: set[str] = set()
        self._counters = {"batches_written": 0, "bytes_written": 0, "batches_deleted": 0,
                          "checkpoints": 0, "startup_gc_removed": 0}
        try:
            self._entries = self._read_catalog()
            self._refs_of = self._referenced(self._entries)
            self._refs = set().union(*self._refs_of.values())
            if not read_only:
                self._counters["startup_gc_removed"] = len(self._startup_gc())
        except BaseException:
            self.close()
            raise

    def _acquire_lock(self) -> int:
        if self.read_only and not (self.path / "LOCK").exists():
            raise NotFound(str(self.path / "LOCK"))
        fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:  # readers (inspect, verify) share the lock; a circuit holds it alone
            fcntl.flock(fd, (fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StorageLocked(f"storage directory {str(self.path)!r} is locked by another "
                                f"user (pid {holder}); two circuits cannot share it") from None
        if not self.read_only:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _writable(self) -> None:
        if self.read_only:
            raise SpineError(f"storage directory {str(self.path)!r} is open read-only")

    # ---- catalog ------------------------------------------------------------------------
    def _read_catalog(self) -> list[CheckpointInfo]:
        p = self.path / CATALOG
        if not p.exists():
            return []
        return decode_catalog(p.read_bytes(), str(p))

    def _referenced(self, entries: list[CheckpointInfo]) -> dict[str, set[str]]:
        """Per checkpoint id, the batches its manifests name (read once, on open)."""
        return {e.id: {b for m in self.read_manifests(e.id).values() for b in m.batches}
                for e in entries}

    def _startup_gc(self) -> list[str]:
        removed = []
        keep_dirs = {e.id for e in self._entries}
        refs = self._refs
        for child in self.path.iterdir():
            name = child.name
            if name.endswith(".mut"):
                child.unlink(missing_ok=True) if not child.is_dir() else shutil.rmtree(child)
                removed.append(name)
            elif child.is_dir() and name not in keep_dirs and len(name) == 32:
                shutil.rmtree(child, ignore_errors=True)
                removed.append(name)
            elif name.endswith(".batch") and name not in refs:
                child.unlink(missing_ok=True)
                removed.append(name)
        for d in keep_dirs:
            for child in (self.path / d).glob("*.mut"):
                child.unlink(missing_ok=True)
                removed.append(f"{d}/{child.name}")
        if removed:
            fsync_dir(self.path)
            log.info("startup gc in %s removed %d files", self.path, len(removed))
        return removed

    # ---- batches ------------------------------------------------------------------------
    def write_batch(self, batch: Batch, block_bytes: int = 64 * 1024) -> Batch:
        self._writable()
        name = f"{new_ulid()}.batch"
        size = write_atomic(self.path / name, batch.encode(block_bytes), self._retry)
        with self._mu:
            self._live.add(name)
            self._counters["batches_written"] += 1
            self._counters["bytes_written"] += size
        return Batch.open_file(self.path / name, name)

    def open_batch(self, name: str) -> Batch:
        if not BATCH_NAME.match(name):
            raise NotFound(name)
        p = self.path / name
        if not p.exists():
            raise NotFound(str(p))
        with self._mu:
            self._live.add(name)
        return Batch.open_file(p, name)

    def discard(self, names: list[str]) -> None:
        self._writable()
        with self._mu:
            refs = self._refs
            for name in names:
                if name is None:
                    continue
                self._live.discard(name)
                if name not in refs and name not in self._pinned:
                    (self.path / name).unlink(missing_ok=True)
                    self._counters["batches_deleted"] += 1

    def pin(self, names: list[str]) -> None:
        with self._mu:
            self._pinned.update(n for n in names if n)

    def batch_names(self) -> list[str]:
        return sorted(p.name for p in self.path.glob("*.batch"))

    # ---- checkpoints --------------------------------------------------------------------
    def commit_checkpoint(self, step: int, fingerprint: str,
                          manifests: dict[str, SpineManifest],
                          identifier: str = "") -> CheckpointInfo:
        self._writable()
        ck = uuid.uuid4().hex
        folder = self.path / ck
        info = CheckpointInfo(ck, step, fingerprint, int(time.time() * 1000), identifier)
        try:
            disk_io(folder, lambda: folder.mkdir(exist_ok=True), self._retry)
            for name, m in manifests.items():
                check_spine_name(name)
                write_atomic(folder / f"spine-{name}.dat", [encode_manifest(m)], self._retry)
            disk_io(self.path, lambda: fsync_dir(self.path), self._retry)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)  # no catalog names it yet
            raise
        with self._mu:
            entries = self._entries + [info]
            try:  # the commit point
                write_atomic(self.path / CATALOG, [encode_catalog(entries)], self._retry)
            except BaseException:
                self._drop_uncommitted(folder)
                raise
            self._entries = entries
            self._refs_of[info.id] = {b for m in manifests.values() for b in m.batches}
            self._refs.update(self._refs_of[info.id])
            self._pinned.clear()
            self._counters["checkpoints"] += 1
        return info

    def _drop_uncommitted(self, folder: Path) -> None:
        """After a failed catalog write: remove the new checkpoint's folder unless the catalog
        on disk names it (the rename landed and only the directory fsync failed)."""
        try:
            named = {e.id for e in self._read_catalog()}
        except Exception:  # noqa: BLE001 - unreadable now: leave it to startup gc
            return
        if folder.name not in named:
            shutil.rmtree(folder, ignore_errors=True)

    def checkpoints(self) -> list[CheckpointInfo]:
        with self._mu:
            return list(self._entries)

    def read_manifests(self, checkpoint_id: str) -> dict[str, SpineManifest]:
        folder = self.path / checkpoint_id
        if len(checkpoint_id) != 32 or not folder.is_dir():
            raise CheckpointNotFound(f"checkpoint {checkpoint_id!r} not found in {self.path}")
        out = {}
        for p in sorted(folder.glob("spine-*.dat")):
            m = decode_manifest(p.read_bytes(), str(p))
            out[m.name] = m
        return out

    def remove_checkpoint(self, checkpoint_id: str) -> None:
        self._writable()
        with self._mu:
            entries = [e for e in self._entries if e.id != checkpoint_id]
            if len(entries) == len(self._entries):
                raise CheckpointNotFound(f"checkpoint {checkpoint_id!r} not found")
            write_atomic(self.path / CATALOG, [encode_catalog(entries)], self._retry)
            self._entries = entries
            self._refs_of.pop(checkpoint_id, None)
            self._refs = set().union(*self._refs_of.values())
        shutil.rmtree(self.path / checkpoint_id, ignore_errors=True)
        fsync_dir(self.path)
        self.gc()

    def gc(self) -> list[str]:
        self._writable()
        with self._mu:
            keep = self._refs | self._pinned | self._live
            removed = [n for n in self.batch_names() if n not in keep]
            for n in removed:
                (self.path / n).unlink(missing_ok=True)
            self._counters["batches_deleted"] += len(removed)
        return removed

    def metrics(self) -> dict:
        with self._mu:
            return dict(self._counters, live_batches=len(self._live),
                        checkpoints_kept=len(self._entries))

    def close(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
