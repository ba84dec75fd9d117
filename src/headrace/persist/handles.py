"""ReadHandle: reading a shard under a since-capability.

Every read holds a capability that keeps the shard's since at or below what it needs, for as
long as it reads: a leased reader (registered, heartbeated, expiring), a critical reader
(token-guarded, never expires), a one-shot lease taken for the duration of a single read
(``client.read_only``), or a capability another process holds (``client.attach_reader``: a Spark
executor reading for the driver's reader). After fetching the parts a read looks at the since
again: if the capability was lost meanwhile (its lease ran out) and since passed what the read
needs, it raises SinceViolation — it never returns data compaction may have changed.
``client.read_only(shard, lease=False)`` holds nothing at all (tools that must not write): it
relies on that re-check alone, so a compaction racing it makes it fail, never read wrong.

What a read needs: ``snapshot(as_of)`` needs ``since <= as_of``; ``updates_between(lo, hi)``
needs ``since < lo`` (times below since are advanced *to* since, so at ``since == lo`` older
updates would appear at lo), or ``since < hi`` for ``lo == 0``.

``snapshot(as_of)`` reads the parts with times ``<= as_of``, keeps times ``<= as_of`` and
consolidates (sum diff per row, drop zeros); times are *dropped*. ``listen`` yields updates with
their times, in time order, after as_of, plus the upper reached.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pyarrow as pa

from headrace.errors import HeadraceError, InvalidInput
from headrace.persist import parts as P
from headrace.persist.errors import (
    InvalidBounds,
    LeaseExpired,
    SinceViolation,
    SnapshotTimeout,
    TokenMismatch,
)
from headrace.persist.machine import ShardMachine
from headrace.persist.state import MAX_TIME, PartMeta, ShardState

log = logging.getLogger("headrace.persist")


@dataclass(frozen=True)
class ListenEvent:
    """Updates with ``lower <= time < progress`` (time-sorted); afterwards the upper is progress."""

    updates: pa.Table
    progress: int | None


ONE_SHOT_LEASE_S = 900.0


class ReadHandle:
    """A reader: leased, critical, one-shot (a lease per read), attached (held elsewhere) or
    lease-free (holds nothing; its reads only re-check since)."""

    def __init__(self, client, machine: ShardMachine, reader_id: str | None, kind: str,
                 lease_s: float = ONE_SHOT_LEASE_S):
        self.client = client
        self.machine = machine
        self.shard = machine.shard
        self.reader_id = reader_id
        self.kind = kind  # "leased" | "critical" | "one-shot" | "attached" | "lease-free"
        self.lease_s = lease_s
        self._last_heartbeat_ms = client.clock.now_ms()

    # -- frontiers -------------------------------------------------------------------------
    def since(self) -> int:
        state = self.machine.fetch()
        r = state.reader(self.reader_id) if self.reader_id else None
        return r.since if r is not None else state.since

    def upper(self) -> int | None:
        return self.machine.fetch().upper

    def _mine(self, state: ShardState):
        r = state.reader(self.reader_id)
        if r is None:
            raise LeaseExpired(f"reader {self.reader_id!r} of shard {self.shard!r} is gone")
        return r

    def downgrade_since(self, since: int) -> ShardState:
        """Promise never to read below ``since`` (leased readers); since never goes back."""
        if self.kind != "leased":
            raise InvalidInput(f"downgrade_since is for leased readers, this one is {self.kind}")
        _check_time(since, "since")
        now = self.client.clock.now_ms()

        def step(state):
            r = self._mine(state)
            leased = [replace(x, since=max(x.since, since), heartbeat_ms=now)
                      if x.reader_id == self.reader_id else x for x in state.leased]
            return None if r.since >= since and r.heartbeat_ms == now else \
                state.with_readers(leased=leased)
        self._last_heartbeat_ms = now
        return self.machine.apply(step)

    def heartbeat(self) -> ShardState:
        if self.kind != "leased":
            return self.machine.current()
        now = self.client.clock.now_ms()

        def step(state):
            self._mine(state)
            return state.with_readers(leased=[replace(x, heartbeat_ms=now)
                                              if x.reader_id == self.reader_id else x
                                              for x in state.leased])
        self._last_heartbeat_ms = now
        return self.machine.apply(step)

    def compare_and_downgrade_since(self, expected_token: str, new_token: str,
                                    since: int) -> ShardState:
        """Critical readers: move since (never back) and the token iff the token matches."""
        if self.kind != "critical":
            raise InvalidInput("compare_and_downgrade_since is for critical readers")
        _check_time(since, "since")

        def step(state):
            r = self._mine(state)
            if r.token != expected_token:
                raise TokenMismatch(self.reader_id, expected_token, r.token)
            critical = [replace(x, since=max(x.since, since), token=new_token)
                        if x.reader_id == self.reader_id else x for x in state.critical]
            return state.with_readers(critical=critical)
        return self.machine.apply(step, fresh=True)

    def expire(self) -> None:
        """Unregister: this reader no longer holds since back."""
        if self.kind not in ("leased", "critical"):
            return

        def step(state):
            if state.reader(self.reader_id) is None:
                return None
            return state.with_readers(
                leased=[x for x in state.leased if x.reader_id != self.reader_id],
                critical=[x for x in state.critical if x.reader_id != self.reader_id])
        self.machine.apply(step)

    close = expire

    def _maybe_heartbeat(self) -> None:
        if self.kind == "leased":
            r = self.machine.current().reader(self.reader_id)
            if r is not None and self.client.clock.now_ms() - self._last_heartbeat_ms > \
                    r.lease_ms // 2:
                self.heartbeat()

    # -- reads -----------------------------------------------------------------------------
    @contextmanager
    def _holding(self, needed: int):
        """Hold a capability for a read that needs ``since <= needed`` while it runs."""
        if self.kind != "one-shot":
            self._maybe_heartbeat()
            yield
            return
        lease = self.client.open_reader(self.shard, as_of=needed, lease_s=self.lease_s)
        try:
            yield
        finally:
            try:
                lease.expire()
            except HeadraceError as e:  # the lease runs out by itself
                log.info("shard %s: could not release read lease %s now: %s", self.shard,
                         lease.reader_id, e)

    def _recheck(self, needed: int) -> None:
        """After the parts were fetched: was since kept at or below ``needed`` all along?"""
        since = self.machine.fetch().since
        if needed < since:
            raise SinceViolation(self.shard, needed, since,
                                 "the reader's capability was lost while it read")

    def _wait_for(self, as_of: int, timeout_s: float | None) -> ShardState:
        clock = self.client.clock
        start, delay = clock.monotonic(), 0.005
        while True:
            state = self.machine.fetch()
            if as_of < state.since:
                raise SinceViolation(self.shard, as_of, state.since)
            if state.upper is None or as_of < state.upper:
                return state
            if timeout_s is not None and clock.monotonic() - start >= timeout_s:
                raise SnapshotTimeout(f"shard {self.shard!r}: upper {state.upper} did not pass "
                                      f"as_of {as_of} within {timeout_s} s")
            self._maybe_heartbeat()
            clock.sleep(delay)
            delay = min(delay * 2, 0.5)

    def snapshot(self, as_of: int, *, timeout_s: float | None = 60.0) -> pa.Table:
        """Consolidated contents at ``as_of``: data columns + diff (times dropped)."""
        _check_time(as_of, "as_of")
        with self._holding(as_of):
            state = self._wait_for(as_of, timeout_s)
            updates = self.client.read_updates(state, 0, as_of + 1)
            self._recheck(as_of)
        return P.consolidate_updates(updates, keep_time=False)

    def updates_between(self, lower: int, upper: int, *,
                        timeout_s: float | None = 60.0) -> pa.Table:
        """Updates with lower <= time < upper (as written, modulo compaction below since)."""
        _check_time(lower, "lower")
        _check_time(upper, "upper")
        if upper <= lower:
            return self.client.empty_updates(self.machine.current())
        needed = lower - 1 if lower > 0 else upper - 1
        with self._holding(needed):
            state = self._wait_for(upper - 1, timeout_s)
            if needed < state.since:
                raise SinceViolation(self.shard, lower, state.since,
                                     "updates from lower need since < lower")
            updates = self.client.read_updates(state, lower, upper)
            self._recheck(needed)
        return updates

    def listen(self, as_of: int, *, poll_s: float = 0.05,
               timeout_s: float | None = None) -> Iterator[ListenEvent]:
        """Updates after ``as_of`` in time order, one event per observed upper advance."""
        _check_time(as_of, "as_of")
        if self.kind == "one-shot":  # a listen is many reads: hold a lease for all of them
            reader = self.client.open_reader(self.shard, as_of=as_of, lease_s=self.lease_s)
            try:
                yield from reader.listen(as_of, poll_s=poll_s, timeout_s=timeout_s)
            finally:
                reader.expire()
            return
        state = self._wait_for(as_of, timeout_s)
        frontier = as_of + 1
        clock = self.client.clock
        idle_since = clock.monotonic()
        while True:
            state = self.machine.fetch()
            if frontier - 1 < state.since:
                raise SinceViolation(self.shard, frontier - 1, state.since)
            if state.upper is None or state.upper > frontier:
                hi = state.upper if state.upper is not None else MAX_TIME
                updates = self.client.read_updates(state, frontier, hi)
                self._recheck(frontier - 1)
                yield ListenEvent(updates.sort_by(P.TIME), state.upper)
                if state.upper is None:
                    return
                frontier = state.upper
                idle_since = clock.monotonic()
                if self.kind == "leased":
                    self.downgrade_since(frontier - 1)
            elif timeout_s is not None and clock.monotonic() - idle_since >= timeout_s:
                return
            else:
                self._maybe_heartbeat()
                clock.sleep(poll_s)


def _check_time(t: object, what: str) -> int:
    if type(t) is not int or not 0 <= t <= MAX_TIME:
        raise InvalidBounds(f"{what} {t!r} is not a u64 time")
    return t


def read_parts_parallel(store, parts: list[PartMeta], threads: int = 8) -> list[pa.Table]:
    if len(parts) <= 1:
        return [P.read_part(store, p) for p in parts]
    with ThreadPoolExecutor(min(threads, len(parts)), thread_name_prefix="hr-persist-read") as ex:
        return list(ex.map(lambda p: P.read_part(store, p), parts))


__all__ = ["ListenEvent", "ReadHandle", "read_parts_parallel"]
