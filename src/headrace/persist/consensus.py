"""Consensus: a linearizable log of state versions per shard, on nothing but the object store.

Protocol (each step and why):

1. Version ``N`` of shard ``s`` lives at ``{root}/{s}/consensus/{N:020}``; seqnos start at 1 and
   grow by exactly 1. ``compare_and_set(s, expected=N, data)`` writes version ``N+1`` with a
   Create put: of all racers exactly one Create lands (S3 ``If-None-Match: *``; the local
   store's flock CAS), so exactly one caller wins each expected seqno.
2. Versions are contiguous from the *floor* (``{root}/{s}/consensus/floor``, the lowest retained
   seqno, 0 if never truncated) to the head. ``head`` therefore never lists: it starts from
   ``max(hint, floor)`` (``…/consensus/hint`` is rewritten every ``hint_every`` versions) and
   gallops forward with HEAD requests (+1, +2, +4 … then bisects). Growth by exactly one makes
   "``lo`` exists and ``lo+1`` does not" mean ``lo`` was the head at some instant of the call.
3. ``truncate(s, T)`` first raises the floor to ``T`` (a CAS on the floor object), *then*
   deletes versions below ``T`` that are older than ``min_age_s`` (10 min, by the store's
   last-modified time). A writer holding a state older than the floor could re-create a deleted
   seqno (Create succeeds on a deleted key); so after a successful Create the writer reads the
   floor, and a version below it is a zombie: it is deleted and the CAS reports a loss. Readers
   never look below the floor, so nobody observes the zombie.
   The floor read is skipped when this process *knew* the head was ``expected`` less than
   ``fresh_s`` (60 s) before its Create returned: the real version ``expected+1`` was then created
   less than ``fresh_s`` ago, too young to be truncated, so ours cannot be a zombie. (This assumes
   the truncator's clock is within ``min_age_s - fresh_s`` of the store's.)
4. ``expected`` must exist: a writer that has not itself seen ``expected`` as the head HEADs it
   first, so a made-up expectation cannot open a hole in the log.
5. A Create whose reply is lost (transient error after the write landed) is resolved by reading
   the version back: identical bytes mean we won. State versions carry a unique op id, so two
   writers never write identical bytes.
"""

from __future__ import annotations

import abc
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from headrace.codec import U64, crc32
from headrace.errors import (
    AlreadyExists,
    FormatError,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from headrace.metrics import PrometheusExport
from headrace.retry import RetryPolicy
from headrace.store import CREATE, OVERWRITE, IfMatch, ObjectStore, open_store, validate_key

log = logging.getLogger("headrace.persist")

SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=~-]{0,199}$")
DEFAULT_ROOT = "persist/shards"
MAX_SEQNO = (1 << 63) - 1


def validate_shard_name(name: object) -> str:
    """Shard names become one key segment: letters, digits and ``._=~-``, at most 200."""
    if not isinstance(name, str) or not SHARD_NAME.match(name) or ".." in name:
        raise InvalidInput(f"bad shard name {name!r}: use [A-Za-z0-9][A-Za-z0-9._=~-]*, "
                           "at most 200 characters")
    return name


def validate_root(root: object) -> str:
    """The key prefix shards live under: a relative key (a trailing '/' is allowed)."""
    if not isinstance(root, str):
        raise InvalidInput(f"root must be a str, got {type(root).__name__}")
    return validate_key(root[:-1] if root.endswith("/") else root)


@dataclass(frozen=True)
class VersionedData:
    seqno: int
    data: bytes


class Consensus(abc.ABC):
    """The seam persist's state machine needs (Materialize's Consensus trait)."""

    @abc.abstractmethod
    def head(self, key: str) -> VersionedData | None:
        """The latest version, or None if the key has none."""

    @abc.abstractmethod
    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> bool:
        """Write version ``(expected or 0) + 1`` iff the head is ``expected``; True on success."""

    @abc.abstractmethod
    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        """Up to ``limit`` retained versions with seqno >= from_seqno, in order."""

    @abc.abstractmethod
    def truncate(self, key: str, seqno: int) -> int:
        """Drop versions below ``seqno`` (<= head); returns how many were deleted."""

    @abc.abstractmethod
    def list_keys(self) -> Iterator[str]:
        """Every key that has (or had) versions."""


def encode_seqno_object(seqno: int) -> bytes:
    body = U64.pack(seqno)
    return body + crc32(body).to_bytes(4, "little")


def decode_seqno_object(data: bytes, key: str) -> int:
    """The 12-byte hint/floor object: u64 seqno LE + crc32 LE of those 8 bytes."""
    if len(data) != 12:
        raise FormatError(key, 0, f"seqno object is {len(data)} bytes, expected 12")
    (seqno,) = U64.unpack_from(data, 0)
    if crc32(data[:8]) != int.from_bytes(data[8:12], "little"):
        raise FormatError(key, 8, "seqno object crc32 mismatch")
    if seqno > MAX_SEQNO:
        raise FormatError(key, 0, f"seqno {seqno} out of range")
    return seqno


class ObjectStoreConsensus(Consensus, PrometheusExport):
    metrics_prefix = "headrace_persist_consensus"

    def __init__(self, store: ObjectStore | str, root: str = DEFAULT_ROOT, *,
                 hint_every: int = 16, retry: RetryPolicy | None = None,
                 min_age_s: float = 600.0, fresh_s: float = 60.0):
        if type(hint_every) is not int or hint_every < 1:
            raise InvalidInput(f"hint_every {hint_every!r} must be an int >= 1")
        if fresh_s < 0 or min_age_s < 0 or (fresh_s and fresh_s >= min_age_s):
            raise InvalidInput(f"need fresh_s == 0 or 0 < fresh_s < min_age_s (got fresh_s "
                               f"{fresh_s!r}, min_age_s {min_age_s!r})")
        self.min_age_s = min_age_s
        self.fresh_s = fresh_s
        self._known: dict[str, tuple[int, float]] = {}  # key -> (head seqno, monotonic when)
        self._known_lock = threading.Lock()
        self.store = open_store(store)
        self.root = validate_root(root)
        self.hint_every = hint_every
        self.retry = retry or RetryPolicy(max_attempts=8)
        self._metrics = {"cas_ok": 0, "cas_lost": 0, "zombies_removed": 0, "heads": 0,
                         "probes": 0, "truncated": 0, "floor_checks": 0}

    # -- keys ------------------------------------------------------------------------------
    def prefix(self, key: str) -> str:
        return f"{self.root}/{validate_shard_name(key)}/consensus/"

    def version_key(self, key: str, seqno: int) -> str:
        return f"{self.prefix(key)}{seqno:020d}"

    def metrics(self) -> dict:
        return dict(self._metrics)

    # -- small objects ---------------------------------------------------------------------
    def _get(self, k: str):
        return self.retry.call(lambda: self.store.get(k), what=f"get {k}")

    def _exists(self, k: str) -> bool:
        self._metrics["probes"] += 1

        def probe() -> bool:
            try:
                self.store.head(k)
                return True
            except NotFound:
                return False
        return self.retry.call(probe, what=f"head {k}")

    def _read_seqno(self, k: str, *, strict: bool) -> tuple[int, str | None]:
        try:
            res = self._get(k)
        except NotFound:
            return 0, None
        try:
            return decode_seqno_object(res.data, k), res.etag
        except FormatError:
            if strict:
                raise
            log.warning("ignoring corrupt consensus hint %s", k)
            return 0, None

    def floor(self, key: str) -> int:
        return self._read_seqno(self.prefix(key) + "floor", strict=True)[0]

    # -- the contract ----------------------------------------------------------------------
    def head(self, key: str) -> VersionedData | None:
        self._metrics["heads"] += 1
        for _ in range(16):
            started = time.monotonic()
            floor = self.floor(key)
            hint = self._read_seqno(self.prefix(key) + "hint", strict=False)[0]
            last = self._last_existing(key, max(floor, hint), floor)
            if last == 0:
                return None
            try:
                found = VersionedData(last, self._get(self.version_key(key, last)).data)
                self._learn(key, last, started)
                return found
            except NotFound:
                continue  # truncated or deleted under us: look again
        raise StoreError(f"consensus head of {key!r} kept moving under truncation", key=key,
                         retryable=True)

    def _last_existing(self, key: str, start: int, floor: int) -> int:
        if start > 0 and not self._exists(self.version_key(key, start)):
            if start != floor and floor > 0 and self._exists(self.version_key(key, floor)):
                start = floor
            else:  # the hint or floor names a deleted version: fall back to listing once
                seqnos = self._listed_seqnos(key)
                start = seqnos[-1] if seqnos else 0
        lo, step = start, 1
        while True:
            probe = lo + step
            if self._exists(self.version_key(key, probe)):
                lo, step = probe, step * 2
            else:
                hi = probe
                break
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._exists(self.version_key(key, mid)):
                lo = mid
            else:
                hi = mid
        return lo

    def _listed_seqnos(self, key: str) -> list[int]:
        prefix = self.prefix(key)
        out = []
        for m in self.store.list(prefix):
            name = m.key[len(prefix):]
            if len(name) == 20 and name.isdigit():
                out.append(int(name))
        return sorted(out)

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> bool:
        if expected is not None and not 0 <= expected < MAX_SEQNO:
            raise InvalidInput(f"expected seqno {expected} out of range")
        seqno = (expected or 0) + 1
        vkey = self.version_key(key, seqno)
        with self._known_lock:
            known = self._known.get(key)
        if expected and (known is None or known[0] != expected) and \
                not self._exists(self.version_key(key, expected)):
            self._metrics["cas_lost"] += 1
            return False  # ``expected`` was never the head: writing would open a hole
        started = time.monotonic()
        for attempt in self.retry.delays():
            try:
                self.store.put(vkey, data, CREATE)
                break
            except AlreadyExists:
                if attempt > 1 and self._landed(vkey, data):
                    break  # an earlier attempt landed and only its reply was lost
                self._metrics["cas_lost"] += 1
                return False
            except StoreError as e:
                if not e.retryable:
                    raise
                if self._landed(vkey, data):
                    break
        else:
            raise StoreError(f"compare_and_set of {vkey!r} kept failing", key=vkey,
                             retryable=True)
        fresh = known is not None and known[0] == (expected or 0) and \
            time.monotonic() - known[1] < self.fresh_s
        if not fresh:
            self._metrics["floor_checks"] += 1
        if not fresh and seqno < self.floor(key):  # a zombie: undo it (protocol step 3)
            self.store.delete(vkey)
            self._metrics["zombies_removed"] += 1
            self._metrics["cas_lost"] += 1
            return False
        self._metrics["cas_ok"] += 1
        self._learn(key, seqno, started)  # version seqno+1 cannot predate our put of seqno
        if seqno % self.hint_every == 0:
            try:
                self.store.put(self.prefix(key) + "hint", encode_seqno_object(seqno), OVERWRITE)
            except StoreError as e:  # a hint is only a hint
                log.debug("hint write failed for %s: %s", key, e)
        return True

    def _learn(self, key: str, seqno: int, when: float) -> None:
        with self._known_lock:
            if key not in self._known or self._known[key][0] <= seqno:
                self._known[key] = (seqno, when)

    def _landed(self, vkey: str, data: bytes) -> bool:
        try:
            return self._get(vkey).data == data
        except NotFound:
            return False

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        if limit < 1:
            raise InvalidInput("scan limit must be >= 1")
        out: list[VersionedData] = []
        seqno = max(from_seqno, self.floor(key), 1)
        while len(out) < limit:
            try:
                out.append(VersionedData(seqno, self._get(self.version_key(key, seqno)).data))
            except NotFound:
                break
            seqno += 1
        return out

    def truncate(self, key: str, seqno: int) -> int:
        head = self.head(key)
        if head is None or seqno > head.seqno:
            raise InvalidInput(f"cannot truncate {key!r} at {seqno}: head is "
                               f"{head.seqno if head else None}")
        fkey = self.prefix(key) + "floor"
        for _ in self.retry.delays():
            current, etag = self._read_seqno(fkey, strict=True)
            if current >= seqno:
                break
            mode = IfMatch(etag) if etag is not None else CREATE
            try:
                self.store.put(fkey, encode_seqno_object(seqno), mode)
                break
            except (AlreadyExists, PreconditionFailed):
                continue  # another truncation moved the floor: read it again
            except StoreError as e:
                if not e.retryable:
                    raise
        prefix = self.prefix(key)
        oldest_ok = time.time() - self.min_age_s
        doomed = []
        for m in self.store.list(prefix):
            name = m.key[len(prefix):]
            if len(name) == 20 and name.isdigit() and int(name) < seqno \
                    and m.last_modified <= oldest_ok:
                doomed.append(m.key)
        self.store.delete_many(doomed)
        self._metrics["truncated"] += len(doomed)
        return len(doomed)

    def delete_all(self, key: str) -> int:
        """Remove every object of ``key``'s log (a garbage-collected shard)."""
        keys = [m.key for m in self.store.list(self.prefix(key))]
        self.store.delete_many(keys)
        return len(keys)

    def list_keys(self) -> Iterator[str]:
        prefix = self.root + "/"
        seen: set[str] = set()
        for m in self.store.list(prefix):
            rest = m.key[len(prefix):].split("/")
            if len(rest) >= 3 and rest[1] == "consensus" and rest[0] not in seen:
                seen.add(rest[0])
                yield rest[0]
