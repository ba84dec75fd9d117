"""The manifest-backed queue: CAS appends by producers, epoch-fenced reads and dequeues.

Every write is read manifest + etag → modify → put with Create (no manifest yet) or
IfMatch(etag); a lost race (AlreadyExists / PreconditionFailed) or a transient store error
re-reads and retries with the shared backoff + jitter policy. A put whose reply was lost
(retryable error after the write may have landed) is *ambiguous*: before appending again the
producer looks for its own location in the manifest, so an entry is never enqueued twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from headrace.buffer.config import DEFAULT_DATA_PREFIX
from headrace.buffer.locations import check_enqueue_location
from headrace.buffer.manifest_format import (
    EMPTY_MANIFEST,
    U64_MAX,
    Footer,
    Manifest,
    append_entry,
    decode_manifest,
    drop_through,
    entry_after,
    location_after,
    read_footer,
    set_epoch,
)
from headrace.buffer.types import Fenced, ManifestEntry, Metadata, StaleBatch
from headrace.codec import Clock, SystemClock
from headrace.errors import (
    AlreadyExists,
    HeadraceError,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    RetryExhausted,
    StoreError,
)
from headrace.retry import RetryPolicy
from headrace.store import CREATE, IfMatch, ObjectStore

log = logging.getLogger("headrace.buffer.queue")
T = TypeVar("T")


def default_cas_policy() -> RetryPolicy:
    """Many short jittered retries: eight producers on one manifest must all get through."""
    return RetryPolicy(max_attempts=100_000, base_delay_s=0.002, max_delay_s=0.25,
                       max_elapsed_s=300.0)


def read_manifest_bytes(store: ObjectStore, path: str) -> tuple[bytes, str | None]:
    """The manifest's bytes and etag; a missing manifest is the empty one with etag None."""
    try:
        res = store.get(path)
    except NotFound:
        return EMPTY_MANIFEST, None
    return res.data, res.etag


def read_manifest(store: ObjectStore, path: str) -> Manifest:
    """Decode the manifest without any epoch check (read-only observers: GC, CLI, Spark)."""
    data, _ = read_manifest_bytes(store, path)
    return decode_manifest(data, path)


class CasCounters:
    """Manifest writes and lost races of one role (producer or consumer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.writes = 0
        self.conflicts = 0
        self.transient_errors = 0

    def add(self, *, writes: int = 0, conflicts: int = 0, transient: int = 0) -> None:
        with self._lock:
            self.writes += writes
            self.conflicts += conflicts
            self.transient_errors += transient

    def as_dict(self, role: str) -> dict[str, float]:
        with self._lock:
            attempts = self.writes + self.conflicts
            return {
                f"{role}_manifest_writes": self.writes,
                f"{role}_manifest_conflicts": self.conflicts,
                f"{role}_manifest_conflict_rate": self.conflicts / attempts if attempts else 0.0,
                f"{role}_store_retries": self.transient_errors,
            }


def _cas_loop(store: ObjectStore, path: str, policy: RetryPolicy, counters: CasCounters,
              step: Callable[[bytes, bool], tuple[bytes | None, T]], what: str) -> T:
    """Run ``step(manifest_bytes, ambiguous)`` → (new bytes or None for no write, result)."""
    ambiguous = False
    last: BaseException | None = None
    attempts = 0
    for attempts in policy.delays():  # noqa: B007 - reported when giving up
        try:
            data, etag = read_manifest_bytes(store, path)
        except StoreError as e:
            if not e.retryable:
                raise
            counters.add(transient=1)
            last = e
            continue
        new, result = step(data, ambiguous)
        if new is None:
            return result
        try:
            store.put(path, new, CREATE if etag is None else IfMatch(etag))
        except (AlreadyExists, PreconditionFailed) as e:
            counters.add(conflicts=1)
            last = e
            continue
        except StoreError as e:
            if not e.retryable:
                raise
            counters.add(transient=1)
            ambiguous = True
            last = e
            continue
        counters.add(writes=1)
        return result
    raise RetryExhausted(f"{what} on {path!r} gave up after {attempts} attempts: {last}",
                         attempts) from last


class _ManifestRole:
    """What both roles share: the store, the manifest key, the CAS policy and its counters."""

    def __init__(self, store: ObjectStore, manifest_path: str,
                 policy: RetryPolicy | None = None):
        self.store = store
        self.manifest_path = manifest_path
        self.policy = policy or default_cas_policy()
        self.counters = CasCounters()


class QueueProducer(_ManifestRole):
    """Appends batch locations to the manifest; carries the epoch unchanged.

    Only locations under ``data_path_prefix`` are accepted: every reader would read them.
    """

    def __init__(self, store: ObjectStore, manifest_path: str,
                 policy: RetryPolicy | None = None, *,
                 data_path_prefix: str = DEFAULT_DATA_PREFIX, clock: Clock | None = None):
        super().__init__(store, manifest_path, policy)
        self.data_path_prefix = data_path_prefix
        self.clock = clock or SystemClock()

    def enqueue(self, location: str, metadata: Iterable[Metadata], *,
                named_at_ms: int | None = None, window_ms: int | None = None) -> int:
        """Append ``location`` and return its sequence.

        With ``named_at_ms``/``window_ms``, every manifest PUT is preceded by a check that the
        batch is younger than the window; else ``StaleBatch`` (nothing appended): the
        collector may already have deleted the file.
        """
        check_enqueue_location(location, self.data_path_prefix)
        metadata = tuple(metadata)

        def step(data: bytes, ambiguous: bool) -> tuple[bytes | None, int]:
            if ambiguous:  # our previous put may have landed: never append twice
                for entry in decode_manifest(data, self.manifest_path).entries:
                    if entry.location == location:
                        return None, entry.sequence
            if named_at_ms is not None and window_ms is not None:
                age_ms = self.clock.now_ms() - named_at_ms
                if age_ms >= window_ms:
                    raise StaleBatch(location, age_ms, window_ms)
            buf = bytearray(data)
            seq = append_entry(buf, location, metadata, self.manifest_path)
            return bytes(buf), seq

        return _cas_loop(self.store, self.manifest_path, self.policy, self.counters, step,
                         "enqueue")


class QueueConsumer(_ManifestRole):
    """The single active reader: ``initialize`` bumps the epoch, every call checks it."""

    def __init__(self, store: ObjectStore, manifest_path: str,
                 policy: RetryPolicy | None = None):
        super().__init__(store, manifest_path, policy)
        self.epoch: int | None = None

    def initialize(self) -> int:
        """Bump the epoch (wrapping past u64 max to 0), fencing any earlier consumer."""

        def step(data: bytes, ambiguous: bool) -> tuple[bytes, int]:
            buf = bytearray(data)
            epoch = (read_footer(buf, self.manifest_path).epoch + 1) & U64_MAX
            set_epoch(buf, epoch, self.manifest_path)
            return bytes(buf), epoch

        self.epoch = _cas_loop(self.store, self.manifest_path, self.policy, self.counters,
                               step, "initialize")
        log.info("consumer initialized on %s with epoch %d", self.manifest_path, self.epoch)
        return self.epoch

    def _check(self, data: bytes) -> None:
        if self.epoch is None:
            raise HeadraceError("queue consumer used before initialize()")
        current = read_footer(data, self.manifest_path).epoch
        if current != self.epoch:
            raise Fenced(self.manifest_path, self.epoch, current)

    def snapshot(self) -> Manifest:
        """The decoded manifest, after checking this consumer is not fenced."""
        return decode_manifest(self._checked_bytes(), self.manifest_path)

    def _checked_bytes(self) -> bytes:
        data = self.policy.call(lambda: read_manifest_bytes(self.store, self.manifest_path)[0],
                                what="read manifest")
        self._check(data)
        return data

    def peek(self) -> ManifestEntry | None:
        """The earliest entry, or None when the queue is empty."""
        return entry_after(self._checked_bytes(), -1, self.manifest_path)

    def read_after(self, sequence: int) -> ManifestEntry | None:
        """The first entry after ``sequence`` (None if not there yet); decodes only that one."""
        return entry_after(self._checked_bytes(), sequence, self.manifest_path)

    def read_after_and_next(self, sequence: int) -> tuple[ManifestEntry | None,
                                                          tuple[int, str] | None]:
        """``read_after`` plus the sequence and location of the entry after that one, from the
        same manifest read (for the consumer's read-ahead)."""
        data = self._checked_bytes()
        entry = entry_after(data, sequence, self.manifest_path)
        if entry is None:
            return None, None
        return entry, location_after(data, entry.sequence, self.manifest_path)

    def footer(self) -> Footer:
        """The manifest footer (entry count, next sequence, epoch), epoch-checked."""
        return read_footer(self._checked_bytes(), self.manifest_path)

    def dequeue(self, through_sequence: int) -> int:
        """Remove every entry with sequence <= ``through_sequence``; returns how many went."""

        def step(data: bytes, ambiguous: bool) -> tuple[bytes | None, int]:
            self._check(data)
            footer = read_footer(data, self.manifest_path)
            if through_sequence >= footer.next_sequence:
                raise InvalidInput(f"cannot dequeue through {through_sequence}: the queue has "
                                   f"only assigned sequences below {footer.next_sequence}")
            new, dropped = drop_through(data, through_sequence, self.manifest_path)
            return (new if dropped else None), dropped

        return _cas_loop(self.store, self.manifest_path, self.policy, self.counters, step,
                         "dequeue")
