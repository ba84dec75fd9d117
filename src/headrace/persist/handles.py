"""WriteHandle and ReadHandle: the two ways to touch a shard.

Write protocol: (1) validate bounds and times, (2) upload the updates as a new Parquet part with a
Create put, (3) CAS the state forward: ``upper == expected_upper`` → ``upper = new_upper`` and the
part linked. A loser of step 3 gets UpperMismatch and its part is deleted (the sweep collects it if
the writer dies first). ``append`` is the idempotent form: it trims to the current upper.

Read protocol: ``snapshot(as_of)`` needs ``since <= as_of < upper``; it reads the parts whose
lower is ``<= as_of``, keeps times ``<= as_of`` and consolidates (sum diff per row, drop zeros).
Times are *dropped* from a snapshot (every row is "as of as_of"). ``listen`` yields updates with
their times, in time order, after as_of, plus the upper reached.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from headrace.codec import new_ulid
from headrace.errors import InvalidInput, NotFound
from headrace.persist import parts as P
from headrace.persist.errors import (
    InvalidBounds,
    LeaseExpired,
    SinceViolation,
    SnapshotTimeout,
    TokenMismatch,
    UpperMismatch,
)
from headrace.persist.machine import ShardMachine
from headrace.persist.state import MAX_TIME, PartMeta, ShardState

log = logging.getLogger("headrace.persist")


@dataclass(frozen=True)
class ListenEvent:
    """Updates with ``lower <= time < progress`` (time-sorted); afterwards the upper is progress."""

    updates: pa.Table
    progress: int | None


class WriteHandle:
    def __init__(self, client, machine: ShardMachine):
        self.client = client
        self.machine = machine
        self.shard = machine.shard
        self.writer_id = new_ulid()

    def upper(self) -> int | None:
        return self.machine.fetch().upper

    def compare_and_append(self, updates: pa.Table, expected_upper: int,
                           new_upper: int | None) -> ShardState:
        """Append iff the shard's upper is ``expected_upper``; else raise UpperMismatch."""
        updates = P.check_updates(updates)
        _check_bounds(expected_upper, new_upper)
        if updates.num_rows:
            tmin, tmax = pc.min_max(updates.column(P.TIME)).values()
            if tmin.as_py() < expected_upper or (new_upper is not None
                                                 and tmax.as_py() >= new_upper):
                raise InvalidBounds(f"update times [{tmin}, {tmax}] outside "
                                    f"[{expected_upper}, {new_upper})")
        if self.machine.current().upper != expected_upper:
            self.machine.fetch()  # the cache may be stale; decide on the real head
        state = self.machine.current()
        if state.upper != expected_upper:
            raise UpperMismatch(expected_upper, state.upper, self.shard)
        schema = P.data_schema(updates).remove_metadata()
        if not updates.num_rows and any(pa.types.is_null(f.type) for f in schema):
            schema = None  # an untyped empty batch neither fixes nor checks the schema
        else:
            _check_schema(state, schema, self.shard)
        part = None
        if updates.num_rows:
            hi = new_upper if new_upper is not None else int(tmax.as_py()) + 1
            part = P.write_part(self.client.store, self.client.root, self.shard,
                                updates.select(P.data_columns(updates.schema) + [P.TIME, P.DIFF]),
                                expected_upper, hi)
        return self.link_parts([part] if part else [], expected_upper, new_upper, schema)

    def link_parts(self, new_parts: list[PartMeta], expected_upper: int,
                   new_upper: int | None, schema: pa.Schema | None) -> ShardState:
        """CAS step of the write protocol for parts already uploaded (the Spark sink uses it)."""
        _check_bounds(expected_upper, new_upper)
        schema_text = P.schema_to_text(schema) if schema is not None else None

        def step(state: ShardState) -> ShardState:
            if state.upper != expected_upper:
                raise UpperMismatch(expected_upper, state.upper, self.shard)
            if schema is not None:
                _check_schema(state, schema, self.shard)
            return replace(state, upper=new_upper, parts=state.parts + tuple(new_parts),
                           schema=state.schema or schema_text)

        try:
            state = self.machine.apply(step)
        except UpperMismatch:
            P.delete_quietly(self.client.store, [p.key for p in new_parts])  # never linked
            raise
        limit = self.client.auto_compact_at
        if limit is not None and len(state.parts) > limit:
            self.client.request_compaction(self.shard)  # off the append's latency path
        return state

    def append(self, updates: pa.Table, lower: int, upper: int | None) -> bool:
        """Idempotent append of the updates for [lower, upper): trims to the current upper.

        Returns False (a no-op) when the shard is already at or past ``upper``; raises
        UpperMismatch when the shard's upper is below ``lower`` (there would be a gap).
        """
        updates = P.check_updates(updates)
        _check_bounds(lower, upper)
        for _ in range(1000):
            current = self.machine.fetch().upper
            if current is None or (upper is not None and current >= upper):
                return False
            if current < lower:
                raise UpperMismatch(lower, current, self.shard)
            if current > lower and updates.num_rows:
                updates = updates.filter(pc.greater_equal(updates.column(P.TIME),
                                                          pa.scalar(current, pa.uint64())))
            try:
                self.compare_and_append(updates, current, upper)
                return True
            except UpperMismatch:
                continue  # someone else moved it: trim again
        raise UpperMismatch(lower, self.machine.fetch().upper, self.shard)

    def finish(self, expected_upper: int) -> ShardState:
        """Advance the upper to the empty frontier: nothing more can be written."""
        return self.link_parts([], expected_upper, None, None)


class ReadHandle:
    """A reader: leased (expires unless heartbeated), critical (token-guarded), or read-only."""

    def __init__(self, client, machine: ShardMachine, reader_id: str | None, kind: str):
        self.client = client
        self.machine = machine
        self.shard = machine.shard
        self.reader_id = reader_id
        self.kind = kind  # "leased" | "critical" | "read-only"
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
        if self.kind == "read-only":
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
        if not 0 <= as_of <= MAX_TIME:
            raise InvalidBounds(f"as_of {as_of} out of range")
        state = self._wait_for(as_of, timeout_s)
        updates = self.client.read_updates(state, 0, as_of + 1)
        return P.consolidate(updates, keep_time=False)

    def updates_between(self, lower: int, upper: int, *,
                        timeout_s: float | None = 60.0) -> pa.Table:
        """Updates with lower <= time < upper (as written, modulo compaction below since)."""
        if upper > lower:
            self._wait_for(upper - 1, timeout_s)
        state = self.machine.current()
        if lower < state.since and lower > 0:
            raise SinceViolation(self.shard, lower, state.since)
        return self.client.read_updates(state, lower, upper)

    def listen(self, as_of: int, *, poll_s: float = 0.05,
               timeout_s: float | None = None) -> Iterator[ListenEvent]:
        """Updates after ``as_of`` in time order, one event per observed upper advance."""
        state = self._wait_for(as_of, timeout_s)
        frontier = as_of + 1
        clock = self.client.clock
        idle_since = clock.monotonic()
        while True:
            state = self.machine.fetch()
            if state.upper is None or state.upper > frontier:
                hi = state.upper if state.upper is not None else MAX_TIME
                updates = self.client.read_updates(state, frontier, hi)
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


def _check_bounds(lower: int, upper: int | None) -> None:
    if type(lower) is not int or not 0 <= lower <= MAX_TIME:
        raise InvalidBounds(f"lower/expected upper {lower!r} is not a u64 time")
    if upper is not None and (type(upper) is not int or not lower < upper <= MAX_TIME):
        raise InvalidBounds(f"new upper {upper!r} must be a u64 time > {lower} (or None)")


def _check_schema(state: ShardState, schema: pa.Schema, shard: str) -> None:
    if state.schema is not None:
        have = P.schema_from_text(state.schema)
        if not have.equals(schema):
            raise InvalidInput(f"shard {shard!r} has data columns {have}, updates have {schema}")


def read_parts_parallel(store, parts: list[PartMeta], threads: int = 8) -> list[pa.Table]:
    if len(parts) <= 1:
        return [P.read_part(store, p) for p in parts]
    with ThreadPoolExecutor(min(threads, len(parts)), thread_name_prefix="hr-persist-read") as ex:
        return list(ex.map(lambda p: P.read_part(store, p), parts))


__all__ = ["ListenEvent", "NotFound", "ReadHandle", "WriteHandle", "read_parts_parallel"]
