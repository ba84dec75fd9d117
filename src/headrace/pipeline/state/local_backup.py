"""The ``local+backup`` state backend: a bucket's spine in a directory on executor disk, backed up
incrementally to the object store at every checkpoint, restored with host affinity.

Each (operator, side, bucket) owns a spine storage directory (a :class:`Circuit` with one spine,
``"state"``) at ``{local_root}/{pipeline}/op{op}-s{side}-b{bucket}`` and a backup prefix
``{pipeline}.backup/op{op}-s{side}-b{bucket}`` in the object store. The driver records, per
bucket, the index blob id of the last committed snapshot (the *expected index*) and hands it to
the task that opens the bucket next.

Protocol of one micro-batch, per bucket:

1. **open**: take the bucket's host lock (``….lock`` next to the directory: one process at a
   time, held until ``commit``/``close``), then ``RestoreManager.restore(expected)`` into the
   directory. Restore is *with host affinity*: when the directory already equals the snapshot
   (the same executor ran the bucket last time, which is what Spark's locality preference makes
   the common case) nothing is downloaded; when it is ahead of or behind the snapshot (a crash
   after a local commit, a task moved between hosts and back), matching files are hard-linked
   and only the others are downloaded. Either way the directory is exactly the committed
   snapshot, never a local state the driver did not commit. Restore also redoes the snapshot's
   (idempotent) cleanup, so a driver crash between recording an index and ``finalize`` heals
   the next time the bucket is opened. ``expected=None`` wipes the directory: empty state.

   Restore compares local files with the snapshot by size + content hash (BLAKE3 over chunk
   digests), not by crc32 alone: the catalog ``checkpoints.headrace`` is rewritten in place and
   ends with its own little-endian crc32, so every catalog has the same whole-file crc32 (the
   CRC residue), and a stale catalog of the same size is still told apart and downloaded. Every
   file is checked at every open, so a directory changed by a crash while it was open (a
   half-used circuit, a half-rewritten catalog) needs no marker: what differs is downloaded.
2. **apply**: the kernel reads (``lookup_many``) and writes (``insert_updates``) the spine.
3. **commit(checkpoint_id)**: unchanged → ``None`` (the driver keeps the previous index).
   Otherwise ``Circuit.commit``, drop checkpoints beyond the last two, close the circuit (its
   ``LOCK`` is released and removed, so the directory is a quiescent, deterministic tree), then
   ``BackupManager.upload`` diffing against the expected index: batch files are immutable, so
   only batches written since then are sent, plus the catalog and the new manifest (packed
   into one blob). The new index id goes back to the driver. No cleanup here: until the driver
   durably records the id, the new blobs carry a TTL and the old snapshot stays intact.
4. **finalize** (driver, after recording every new id): ``cleanup`` each new index — mark it
   permanent, delete the blobs and the previous index it replaced. Idempotent.

What a crash leaves (each step is safe to redo):

- during 1–2: the directory may hold a half-used circuit (and its ``LOCK``) or a restore staging
  folder; the next open removes staging folders and rebuilds the directory from the expected
  index (hard links for what matches, the rest, e.g. a changed catalog, downloaded).
- during 3, before the upload finished: the directory is ahead of the expected index; blobs
  already sent are TTL garbage (the backup sweep deletes them). The next open restores the
  expected index (hard-linking what is unchanged).
- between upload and the driver's record: the new index is an orphan with a TTL; the previous
  index was never touched (no cleanup ran) and still restores.
- between the record and ``finalize``: the new index is committed but not permanent yet; the
  driver redoes ``finalize``, or the next restore of that index redoes its cleanup — both well
  inside the TTL (30 days by default).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from headrace.backup import (
    DEFAULT_IMMUTABLE_PATTERNS,
    BackupConfig,
    BackupManager,
    RestoreManager,
)
from headrace.errors import InvalidInput
from headrace.pipeline.operators.kernel import ZSET_SCHEMA
from headrace.spine.batch import Batch
from headrace.spine.circuit import Circuit
from headrace.spine.errors import StorageLocked
from headrace.spine.spine import Spine, SpineConfig
from headrace.store import ObjectStore, open_store

FINGERPRINT = "headrace.spark.local_state/v2"  # v2: binary keys and values
SPINE = "state"
_BUCKET_KEY = re.compile(r"\Aop(\d+)-s(\d+)-b(\d+)\Z")
_FINALIZE_WORKERS = 16
# a checkpoint folder's manifests are written once (the folder is new per checkpoint): compared
# by name + size + crc32 like batch files, not re-sent at every commit
IMMUTABLE_PATTERNS = (*DEFAULT_IMMUTABLE_PATTERNS, "spine-*.dat")


def backup_config() -> BackupConfig:
    return BackupConfig(immutable_patterns=IMMUTABLE_PATTERNS)


def bucket_key(op: int, side: int, bucket: int) -> str:
    """The name of a bucket's directory and backup prefix (and its key in ``finalize``)."""
    for name, v in (("op", op), ("side", side), ("bucket", bucket)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidInput(f"{name} must be an int >= 0, got {v!r}")
    return f"op{op}-s{side}-b{bucket}"


def backup_prefix(pipeline: str, key: str) -> str:
    return f"{pipeline}.backup/{key}"


def _check_pipeline(pipeline: str) -> str:
    if not isinstance(pipeline, str) or not pipeline or "/" in pipeline or pipeline in (".", ".."):
        raise InvalidInput(f"pipeline must be a non-empty name without '/', got {pipeline!r}")
    return pipeline


class _HostLock:
    """An exclusive flock on a file next to the bucket's directory, waited for up to a timeout
    (a speculative or retried attempt of the same task may still be finishing)."""

    def __init__(self, path: Path, timeout_s: float):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise StorageLocked(f"bucket directory lock {str(path)!r} is held by another "
                                        f"task (waited {timeout_s:g} s)") from None
                time.sleep(0.05)
        self.fd: int | None = fd

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class SpineZSet:
    """The kernels' view (StateSpine) of one bucket's spine; ``_new`` holds what this task
    added."""

    spine: Spine
    _new: list

    def lookup_many(self, keys: pa.Array) -> pa.Table:
        keys = pc.cast(keys, pa.large_binary())
        return self.spine.lookup_many(keys).cast(ZSET_SCHEMA)  # the spine keeps large_binary

    def insert_updates(self, updates: pa.Table) -> None:
        if updates.num_rows == 0:
            return
        batch = Batch.from_arrow(updates.cast(pa.schema([("key", pa.large_binary()),
                                                         ("val", pa.large_binary()),
                                                         ("w", pa.int64())])))
        if len(batch):
            self.spine.insert(batch)
            self._new.append(batch)

    @property
    def changed(self) -> bool:
        return bool(self._new)

    def to_table(self) -> pa.Table:
        return self.spine.to_table()


class LocalBackupBucketState(SpineZSet):
    """The state of one (operator, side, bucket) in a local spine directory with backups.

    Same interface for the kernels as :class:`headrace.spark.state.BucketState`
    (``lookup_many``, ``insert_updates``, ``changed``, ``to_table``); ``commit`` replaces
    ``write``. ``url`` may also be an :class:`ObjectStore` (e.g. a ``CountingStore``).
    Use as a context manager, or call ``commit``/``close``: the bucket stays locked until then.
    """

    def __init__(self, local_root: str | os.PathLike, url: str | ObjectStore, pipeline: str,
                 op: int, side: int, bucket: int, expected_index: str | None, *,
                 lock_timeout_s: float = 60.0):
        self.op, self.side, self.bucket = op, side, bucket
        self.key = bucket_key(op, side, bucket)
        self.pipeline = _check_pipeline(pipeline)
        self.prefix = backup_prefix(pipeline, self.key)
        self.expected_index = expected_index
        self.url = url
        base = Path(local_root) / pipeline
        self.path = base / self.key
        self.restore_result = None
        self.index_id: str | None = None  # set by a commit that uploaded a snapshot
        self._circuit: Circuit | None = None
        self._store: ObjectStore | None = None
        self._new: list = []  # batches added since open (SpineZSet)
        self._lock: _HostLock | None = _HostLock(base / f"{self.key}.lock", lock_timeout_s)
        try:
            if expected_index is None:
                shutil.rmtree(self.path, ignore_errors=True)
            else:
                with RestoreManager(self._object_store(), prefix=self.prefix,
                                    config=backup_config()) as rm:
                    self.restore_result = rm.restore(expected_index, self.path)
            self._circuit = Circuit.open(self.path, FINGERPRINT,
                                         config=SpineConfig(background_merge=False))
            self.spine = self._circuit.spine(SPINE, pa.large_binary(), pa.large_binary())
        except BaseException:
            self.close()
            raise

    def _object_store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def commit(self, checkpoint_id: str) -> str | None:
        """Checkpoint and back up the changes; the new index blob id, or None if unchanged.

        The bucket is closed afterwards (whatever the outcome). The caller hands the id to the
        driver, which records it and then calls :func:`finalize`."""
        try:
            if self._circuit is None:
                raise InvalidInput(f"bucket {self.key} is closed")
            if not self.changed:
                return None
            self._circuit.commit(identifier=str(checkpoint_id))
            if len(self._circuit.checkpoints()) > 2:
                self._circuit.gc_checkpoint(keep=2)
            self._close_circuit()
            with BackupManager(self._object_store(), prefix=self.prefix, config=backup_config(),
                               previous_index_blob_id=self.expected_index) as bm:
                self.index_id = bm.upload(self.path, str(checkpoint_id))
                self.backup_metrics = bm.metrics()
            self._new = []
            return self.index_id
        finally:
            self.close()

    def _close_circuit(self) -> None:
        """Close the circuit and remove its LOCK file (it holds the pid, which would make two
        otherwise equal directories differ for backup and host affinity). Safe under the
        bucket's host lock: no other user of the directory can be waiting on LOCK."""
        circuit, self._circuit = self._circuit, None
        if circuit is not None:
            try:
                circuit.close()
            finally:
                (self.path / "LOCK").unlink(missing_ok=True)

    def close(self) -> None:
        """Release the bucket without committing (uncommitted changes stay local only and are
        replaced by the next restore)."""
        try:
            self._close_circuit()
        finally:
            store, self._store = self._store, None
            if store is not None and store is not self.url:
                store.close()
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()

    def __enter__(self) -> LocalBackupBucketState:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def finalize(url: str | ObjectStore, pipeline: str, index_ids: dict[str, str]) -> None:
    """After the driver durably recorded ``index_ids`` ({"op{op}-s{side}-b{bucket}": index id}):
    make each snapshot permanent and delete what it replaced. Idempotent; buckets in parallel."""
    _check_pipeline(pipeline)
    for key in index_ids:
        if not isinstance(key, str) or not _BUCKET_KEY.match(key):
            raise InvalidInput(f"bad bucket key {key!r} (expected 'op<n>-s<n>-b<n>')")
    if not index_ids:
        return
    store = open_store(url)
    try:
        def one(item: tuple[str, str]) -> None:
            key, index_id = item
            with BackupManager(store, prefix=backup_prefix(pipeline, key),
                               config=backup_config()) as bm:
                bm.cleanup(index_id)

        workers = min(_FINALIZE_WORKERS, len(index_ids))
        with ThreadPoolExecutor(workers, thread_name_prefix="headrace-local-state-finalize") as ex:
            for fut in [ex.submit(one, item) for item in sorted(index_ids.items())]:
                fut.result()
    finally:
        if store is not url:
            store.close()
