"""Consumer: the single active reader of the queue, with read-ahead and in-order acks.

``initialize`` bumps the manifest epoch (fencing any earlier consumer); ``next_batch`` reads the
entry after the read cursor and its batch file (an unreadable one raises, naming the entry,
until ``skip_batch`` records a skip of it: then it comes back empty with ``skipped`` set);
``ack`` must name the sequence right after the last acked one; every ``acks_per_dequeue`` acks (and on ``flush``/``close``) acked entries are
dequeued. Every call that touches the queue checks the epoch and raises ``Fenced`` if it moved.

With ``read_ahead``, ``next_batch`` also starts reading the following batch in a background
thread (zstd and file reads release the GIL); the next call uses it only if the epoch-checked
manifest still names that sequence at that location and its metadata fits it, and any failure
falls back to the plain read, so errors, skips and retries are the same either way.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from headrace.buffer.batch_format import DecodedBlock
from headrace.buffer.batches import UNREADABLE, check_block, fetch_batch, read_block
from headrace.buffer.config import ConsumerConfig
from headrace.buffer.gc import GarbageCollector
from headrace.buffer.manifest_format import read_footer
from headrace.buffer.queue import QueueConsumer, read_manifest, read_manifest_bytes
from headrace.buffer.types import (
    ConsumedBatch,
    Fenced,
    ManifestEntry,
    OutOfOrderAck,
)
from headrace.codec import Clock, SystemClock
from headrace.errors import HeadraceError, InvalidInput
from headrace.metrics import PrometheusExport
from headrace.retry import RetryPolicy
from headrace.store import ObjectStore

log = logging.getLogger("headrace.buffer.consumer")
_ONE_ATTEMPT = RetryPolicy(max_attempts=1)


def read_entries(store: ObjectStore, manifest_path: str, after_sequence: int | None,
                 max_batches: int | None = None, *,
                 data_path_prefix: str | None = None) -> list[ConsumedBatch]:
    """Read-only: the batches with sequence > ``after_sequence`` (all if None), in order.

    Never bumps the epoch and never dequeues; for drivers and tools that track their own
    position. An unreadable batch raises (``MissingBatch``, ``InvalidLocation``,
    ``FormatError``) unless its skip is recorded; ``data_path_prefix`` also refuses locations
    outside the queue's prefix.
    """
    entries = list_entries(store, manifest_path, after_sequence, max_batches)
    return [fetch_batch(store, e, manifest_path=manifest_path,
                        data_path_prefix=data_path_prefix) for e in entries]


def list_entries(store: ObjectStore, manifest_path: str, after_sequence: int | None,
                 max_batches: int | None = None) -> list[ManifestEntry]:
    """Read-only: the manifest entries with sequence > ``after_sequence``."""
    if after_sequence is not None:
        _check_sequence(after_sequence, "after_sequence")
    entries = read_manifest(store, manifest_path).entries
    if after_sequence is not None:
        entries = [e for e in entries if e.sequence > after_sequence]
    return entries if max_batches is None else entries[:max_batches]


def _check_sequence(value: object, name: str = "sequence") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name}: must be an integer, got {value!r}")


class Consumer(PrometheusExport):
    metrics_prefix = "headrace_buffer_consumer"

    def __init__(self, config: ConsumerConfig, clock: Clock | None = None):
        self.config = config
        self.clock = clock or SystemClock()
        self.store = config.open_store()
        self._retry = config.retry or RetryPolicy()
        self._queue = QueueConsumer(self.store, config.manifest_path, config.cas_retry)
        self._lock = threading.RLock()
        self._acked: int | None = None  # last acknowledged sequence (-1: none ever)
        self._cursor: int | None = None  # last sequence handed out by next_batch
        self._dequeued_through = -1
        self._acks_since_dequeue = 0
        self._known_next_sequence = 0
        self._queue_length = 0
        self._stats = {"batches_consumed": 0, "records_consumed": 0, "bytes_consumed": 0,
                       "batches_skipped": 0}
        self.gc: GarbageCollector | None = None
        self._closed = False
        self._ahead: tuple[int, str, Future] | None = None  # (sequence, location, read)
        self._ahead_pool: ThreadPoolExecutor | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def initialize(self, last_acked_sequence: int | None = None) -> None:
        """Bump the epoch; resume after ``last_acked_sequence`` or at the earliest entry.

        A ``last_acked_sequence`` the queue never assigned is refused before the epoch moves:
        only an assigned sequence can have been acked, so such a position belongs to another
        queue (or a recreated manifest), and resuming there would silently skip the entries
        producers append up to it.
        """
        with self._lock:
            if last_acked_sequence is not None:
                self._check_resume_position(last_acked_sequence)
            self._queue.initialize()
            self._drop_ahead()
            manifest = self._queue.snapshot()
            self._note(manifest.entries, manifest.next_sequence)
            if last_acked_sequence is None:
                first = manifest.first_sequence
                acked = (first if first is not None else manifest.next_sequence) - 1
            else:
                acked = last_acked_sequence
                first = manifest.first_sequence
                if first is not None and first > acked + 1:
                    log.warning("resuming after %d but the queue starts at %d: entries %d..%d "
                                "were dequeued earlier", acked, first, acked + 1, first - 1)
            self._acked = self._cursor = acked
            first = manifest.first_sequence
            self._dequeued_through = (manifest.next_sequence if first is None else first) - 1
            if acked > self._dequeued_through:
                self._acks_since_dequeue = acked - self._dequeued_through
            if self.config.gc_interval_s > 0 and self.gc is None:
                self.gc = GarbageCollector(
                    self.store, manifest_path=self.config.manifest_path,
                    data_path_prefix=self.config.data_path_prefix,
                    grace_period_s=self.config.gc_grace_period_s,
                    interval_s=self.config.gc_interval_s, clock=self.clock)
                self.gc.start()

    def _check_resume_position(self, last_acked: object) -> None:
        if isinstance(last_acked, bool) or not isinstance(last_acked, int) or last_acked < -1:
            raise InvalidInput("last_acked_sequence: must be an integer >= 0 (or None), "
                               f"got {last_acked!r}")
        # unfenced read: next_sequence only grows, so a position below it stays valid
        path = self.config.manifest_path
        data = self._retry.call(lambda: read_manifest_bytes(self.store, path)[0],
                                what="read manifest")
        next_sequence = read_footer(data, path).next_sequence
        if last_acked >= next_sequence:
            raise InvalidInput(f"last_acked_sequence: {last_acked} was never assigned by the "
                               f"queue {path!r} (it has only assigned sequences below "
                               f"{next_sequence}): a position from another queue or an earlier "
                               "manifest would skip the entries produced up to it")

    def close(self) -> None:
        """Dequeue what was acked and stop the collector; a fenced consumer just stops."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._acked is not None:
                self.flush()
        except Fenced as e:
            log.info("consumer closed while fenced: %s", e)
        finally:
            self._drop_ahead()
            if self._ahead_pool is not None:
                self._ahead_pool.shutdown(wait=True, cancel_futures=True)
            if self.gc is not None:
                self.gc.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------------
    def _ready(self) -> None:
        if self._acked is None:
            raise HeadraceError("consumer used before initialize()")
        if self._closed:
            raise HeadraceError("consumer is closed")

    def _note(self, entries: list[ManifestEntry], next_sequence: int) -> None:
        self._known_next_sequence = next_sequence
        self._queue_length = len(entries)

    def next_batch(self) -> ConsumedBatch | None:
        """The batch after the read cursor, or None when there is none yet."""
        with self._lock:
            self._ready()
            if self.config.read_ahead:  # epoch-checked
                entry, following = self._queue.read_after_and_next(self._cursor)
            else:
                entry, following = self._queue.read_after(self._cursor), None
            if entry is None:
                return None
            if entry.sequence != self._cursor + 1:
                log.warning("read cursor at %d but the next entry is %d", self._cursor,
                            entry.sequence)
            block = self._take_ahead(entry)
            if block is not None:
                batch = ConsumedBatch(block, entry.sequence, entry.location, list(entry.metadata))
            else:  # unreadable → a typed error naming the entry; the cursor stays (unless skipped)
                batch = fetch_batch(self.store, entry, manifest_path=self.config.manifest_path,
                                    data_path_prefix=self.config.data_path_prefix,
                                    retry=self._retry,
                                    max_batch_bytes=self.config.max_batch_bytes)
            self._cursor = entry.sequence
            if following is not None:
                self._start_ahead(*following)
            self._stats["batches_skipped"] += batch.skipped is not None
            self._stats["batches_consumed"] += 1
            self._stats["records_consumed"] += len(batch.records)
            self._stats["bytes_consumed"] += batch.records.nbytes
            return batch

    # -- read-ahead --------------------------------------------------------------------------------
    def _start_ahead(self, sequence: int, location: str) -> None:
        """Read and decode the batch at ``location`` in the background (the same location and
        decode checks as a plain read). One attempt only: a failure is left to the plain read,
        which retries, consults the skip log and raises the typed error."""
        if self._ahead_pool is None:
            self._ahead_pool = ThreadPoolExecutor(1, thread_name_prefix="headrace-buffer-ahead")
        read = self._ahead_pool.submit(
            read_block, self.store, self.config.manifest_path, sequence, location,
            data_path_prefix=self.config.data_path_prefix, retry=_ONE_ATTEMPT,
            max_batch_bytes=self.config.max_batch_bytes)
        self._ahead = (sequence, location, read)

    def _take_ahead(self, entry: ManifestEntry) -> DecodedBlock | None:
        """The read-ahead batch if it is ``entry``'s (same sequence and location, as the
        epoch-checked manifest read names it now) and it read and checks fine; else None."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        sequence, location, read = ahead
        if (sequence, location) != (entry.sequence, entry.location):
            read.cancel()
            return None
        try:
            block = read.result()
            check_block(self.config.manifest_path, entry, block)
        except UNREADABLE:  # the plain read repeats it and raises (or finds the skip)
            return None
        except Exception as e:  # noqa: BLE001 - e.g. a transient store error: retried there
            log.debug("read-ahead of %s failed, reading it again: %s", location, e)
            return None
        return block

    def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[2].cancel()

    def pending_entries(self, max_batches: int | None = None) -> list[ManifestEntry]:
        """Epoch-checked: the manifest entries after the last ack (for the Spark driver)."""
        with self._lock:
            self._ready()
            manifest = self._queue.snapshot()
            self._note(manifest.entries, manifest.next_sequence)
            entries = [e for e in manifest.entries if e.sequence > self._acked]
            return entries if max_batches is None else entries[:max_batches]

    # -- acknowledging ---------------------------------------------------------------------------
    def ack(self, sequence: int) -> None:
        """Acknowledge ``sequence``, which must directly follow the last acked one."""
        _check_sequence(sequence)
        with self._lock:
            self._ready()
            if sequence != self._acked + 1:
                raise OutOfOrderAck(sequence, self._acked + 1)
            self._ack_to(sequence)

    def ack_through(self, sequence: int) -> None:
        """Acknowledge every sequence up to ``sequence``; acking an acked range is a no-op."""
        _check_sequence(sequence)
        with self._lock:
            self._ready()
            if sequence <= self._acked:
                self._check_epoch()
                return
            self._ack_to(sequence)

    def _check_epoch(self) -> None:
        footer = self._queue.footer()
        self._known_next_sequence = footer.next_sequence
        self._queue_length = footer.entry_count

    def _ack_to(self, sequence: int) -> None:
        self._check_epoch()  # fencing is checked on every ack, as the RFC asks
        if sequence >= self._known_next_sequence:
            raise OutOfOrderAck(sequence, self._acked + 1,
                                f"no entry {sequence} exists yet (next is "
                                f"{self._known_next_sequence})")
        self._acks_since_dequeue += sequence - self._acked
        self._acked = sequence
        if self._acks_since_dequeue >= self.config.acks_per_dequeue:
            self.flush()

    def flush(self) -> None:
        """Dequeue every acked entry now."""
        with self._lock:
            if not self._closed:
                self._ready()
            if self._acked is not None and self._acked > self._dequeued_through:
                self._queue.dequeue(self._acked)  # checks the epoch under the CAS
                self._dequeued_through = self._acked
            elif self._acked is not None:
                self._check_epoch()
            self._acks_since_dequeue = 0

    # -- observability ---------------------------------------------------------------------------
    @property
    def acked_sequence(self) -> int | None:
        return None if self._acked is None or self._acked < 0 else self._acked

    @property
    def epoch(self) -> int | None:
        return self._queue.epoch

    def metrics(self) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = dict(self._stats)
            out["queue_length"] = self._queue_length
            out["acked_sequence"] = -1 if self._acked is None else self._acked
            out["read_sequence"] = -1 if self._cursor is None else self._cursor
        out.update(self._queue.counters.as_dict("consumer"))
        if self.gc is not None:
            out.update(self.gc.metrics())
        return out
