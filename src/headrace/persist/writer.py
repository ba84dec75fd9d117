"""Writing a shard: writer leases, linking, and the definiteness check of replays.

Write protocol (``compare_and_append``):

1. validate bounds, times and schema;
2. be registered: the writer's lease is in the shard state. A client registers once per shard
   (one CAS); every link refreshes the lease for free, so an explicit heartbeat CAS happens only
   after half a lease without a link;
3. upload the updates as a part ``{root}/{shard}/parts/{writer_id}/{ULID}.parquet`` (Create);
4. CAS: iff ``upper == expected_upper`` and the writer is still registered, link the parts and
   move the upper (the same CAS refreshes the lease).

The sweep deletes an unlinked part only when its writer is absent from a state read *after* the
part was listed (the writer was dropped or released; ids are never re-registered), so a part is
never deleted while a live writer may link it, and a dropped writer's link fails in step 4.

Split writes (a Spark driver and its tasks): the driver calls ``register()`` and hands the
writer id to the tasks; a task calls :func:`upload_part` (one PUT, no consensus access) and
returns the picklable PartMeta; the driver calls ``append_parts`` (or ``link_parts``) once per
micro-batch. Linking verifies the parts first: a HEAD per part (up to 8, in parallel), or one LIST
of the writer's prefix for more. ``append_parts`` starts from the writer's cached state: when
it says the batch is next, the CAS itself checks it (consensus versions are contiguous, so a
put of the cached seqno + 1 lands only if the cache was the head), and the head is read only
when the cache says otherwise or the CAS loses.

Definiteness: ``append`` and ``append_parts`` decide when times were already written; there they
compare the updates with what the shard holds for those times (a GET per part overlapping them;
none when the parts are byte-identical) and raise DefinitenessViolation if they differ.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput, NotFound
from headrace.persist import parts as P
from headrace.persist.definite import compare, held, overlaps, same_bytes
from headrace.persist.errors import (
    DefinitenessViolation,
    InvalidBounds,
    LeaseExpired,
    UpperMismatch,
)
from headrace.persist.handles import read_parts_parallel
from headrace.persist.machine import ShardMachine
from headrace.persist.state import MAX_TIME, PartMeta, ShardState, WriterLease
from headrace.persist.uploads import (
    new_writer_id,
    parts_prefix,
    upload_part,
    verify_parts,
)

log = logging.getLogger("headrace.persist")

DEFAULT_WRITER_LEASE_S = 900.0


class _Registration:
    """One writer id's lease on one shard, as this process knows it.

    ``owned``: the client's own writer for the shard; when its lease was lost it moves to a fresh
    id (ids are single-use). Not owned: an id registered elsewhere (the Spark driver's), which
    this process may refresh by linking but never registers.
    """

    def __init__(self, machine: ShardMachine, clock, writer_id: str, lease_ms: int, *,
                 owned: bool, registered: bool):
        self.machine, self.clock = machine, clock
        self.writer_id, self.lease_ms, self.owned = writer_id, lease_ms, owned
        self.heartbeat_ms: int | None = clock.now_ms() if registered else None
        self.lock = threading.Lock()

    def ensure(self) -> str:
        """Registered with at least half a lease left: register or heartbeat if needed."""
        with self.lock:
            now = self.clock.now_ms()
            if self.heartbeat_ms is not None and now - self.heartbeat_ms <= self.lease_ms // 2:
                return self.writer_id
            if self.heartbeat_ms is None and self.owned:
                self._register(now)
                return self.writer_id
            try:
                self._heartbeat(now)
            except LeaseExpired:
                if not self.owned:
                    raise
                self.writer_id = new_writer_id()
                self._register(now)
            return self.writer_id

    def _register(self, now: int) -> None:
        lease = WriterLease(self.writer_id, now, self.lease_ms)
        self.machine.apply(lambda s: replace(s, writers=s.writers + (lease,)))
        self.heartbeat_ms = now
        log.info("shard %s: writer %s registered (lease %d ms)", self.machine.shard,
                 self.writer_id, self.lease_ms)

    def _heartbeat(self, now: int) -> None:
        def step(state: ShardState) -> ShardState:
            return replace(state, writers=refresh(state, self.writer_id, now))
        self.machine.apply(step)
        self.heartbeat_ms = now

    def linked(self, now: int) -> None:
        with self.lock:
            self.heartbeat_ms = max(self.heartbeat_ms or 0, now)

    def release(self) -> None:
        """Unregister (the parts it uploaded and did not link become collectable)."""
        with self.lock:
            if self.heartbeat_ms is None:
                return
            wid = self.writer_id

            def step(state: ShardState):
                if state.writer(wid) is None:
                    return None
                return replace(state, writers=tuple(w for w in state.writers
                                                    if w.writer_id != wid))
            self.machine.apply(step)
            self.heartbeat_ms = None
            if self.owned:
                self.writer_id = new_writer_id()


def refresh(state: ShardState, writer_id: str, now: int) -> tuple[WriterLease, ...]:
    """The writers with ``writer_id``'s heartbeat set to now; LeaseExpired if it is gone."""
    if state.writer(writer_id) is None:
        raise LeaseExpired(f"writer {writer_id!r} of shard {state.shard!r} is no longer "
                           "registered (its lease ran out): its unlinked parts may be swept")
    return tuple(replace(w, heartbeat_ms=max(w.heartbeat_ms, now))
                 if w.writer_id == writer_id else w for w in state.writers)


class WriteHandle:
    def __init__(self, client, machine: ShardMachine, registration: _Registration):
        self.client = client
        self.machine = machine
        self.shard = machine.shard
        self._reg = registration

    @property
    def writer_id(self) -> str:
        return self._reg.writer_id

    def upper(self) -> int | None:
        return self.machine.fetch().upper

    def register(self) -> str:
        """Make sure this writer is registered (with half a lease left); returns its id, the one
        tasks pass to :func:`upload_part`."""
        return self._reg.ensure()

    heartbeat = register

    def release(self) -> None:
        """Unregister this writer now instead of letting its lease run out."""
        self._reg.release()

    # -- one-process writes ------------------------------------------------------------------
    def compare_and_append(self, updates: pa.Table, expected_upper: int,
                           new_upper: int | None) -> ShardState:
        """Append iff the shard's upper is ``expected_upper``; else raise UpperMismatch."""
        updates = P.check_updates(updates)
        _check_bounds(expected_upper, new_upper)
        tmax = _check_times(updates, expected_upper, new_upper)
        if self.machine.current().upper != expected_upper:
            self.machine.fetch()  # the cache may be stale; decide on the real head
        state = self.machine.current()
        if state.upper != expected_upper:
            raise UpperMismatch(expected_upper, state.upper, self.shard)
        schema = _update_schema(updates)
        if schema is not None:
            _check_schema(state, schema, self.shard)
        if not updates.num_rows:
            return self._link([], expected_upper, new_upper, schema, verify=False)
        hi = new_upper if new_upper is not None else tmax + 1
        table = updates.select(P.data_columns(updates.schema) + [P.TIME, P.DIFF])
        for attempt in (1, 2):
            writer_id = self._reg.ensure()
            part = replace(upload_part(self.client.store, self.shard, writer_id, table,
                                       root=self.client.root), lower=expected_upper, upper=hi)
            try:  # the part was just created under a registered id: no HEAD needed
                return self._link([part], expected_upper, new_upper, schema, verify=False)
            except LeaseExpired:
                P.delete_quietly(self.client.store, [part.key])
                if attempt == 2 or not self._reg.owned:
                    raise
                self._reg.heartbeat_ms = 0  # lost while uploading: move to a fresh id
            except UpperMismatch:
                P.delete_quietly(self.client.store, [part.key])  # never linked
                raise
        raise AssertionError("unreachable")

    def append(self, updates: pa.Table, lower: int, upper: int | None) -> bool:
        """Idempotent append of the updates for [lower, upper).

        Times the shard already holds (below its upper) are compared with ``updates``: equal is
        a replay (skipped), different raises DefinitenessViolation. The rest is appended.
        Returns False when nothing was left to append; raises UpperMismatch when the shard's
        upper is below ``lower`` (there would be a gap).
        """
        updates = P.check_updates(updates)
        _check_bounds(lower, upper)
        _check_times(updates, lower, upper)
        checked_to = lower
        for _ in range(1000):
            state = self.machine.fetch()
            current = state.upper
            if current is not None and current < lower:
                raise UpperMismatch(lower, current, self.shard)
            held_to = _min_upper(current, upper)  # the shard already holds [lower, held_to)
            if held_to is None or held_to > checked_to:
                self._check_definite(state, updates, checked_to, held_to)
                checked_to = MAX_TIME if held_to is None else held_to
            if current is None or (upper is not None and current >= upper):
                return False
            rest = updates.filter(pc.greater_equal(updates.column(P.TIME),
                                                   pa.scalar(current, pa.uint64())))
            try:
                self.compare_and_append(rest, current, upper)
                return True
            except UpperMismatch:
                continue  # someone else moved it: compare and trim again
        raise UpperMismatch(lower, self.machine.fetch().upper, self.shard)

    def finish(self, expected_upper: int) -> ShardState:
        """Advance the upper to the empty frontier: nothing more can be written."""
        return self._link([], expected_upper, None, None, verify=False)

    # -- split writes (tasks upload, the driver links) ----------------------------------------
    def link_parts(self, parts: list[PartMeta], expected_upper: int, new_upper: int | None,
                   schema: pa.Schema | None = None) -> ShardState:
        """CAS step for parts uploaded under this writer: verify them (exist, sizes), then link
        them iff the upper is ``expected_upper``. On UpperMismatch the parts stay where they
        are (see ``append_parts`` for the replay-safe form; ``discard`` deletes them)."""
        return self._link(list(parts), expected_upper, new_upper, schema, verify=True)

    def append_parts(self, parts: list[PartMeta], lower: int, upper: int) -> bool:
        """Idempotent ``link_parts`` for a batch [lower, upper) (a micro-batch: t, t + 1).

        Links when the upper is ``lower``. When the shard already holds [lower, upper) — a
        replay — the parts' contents are compared with it (DefinitenessViolation if different)
        and the parts are deleted; returns False. UpperMismatch if the upper is below ``lower``.
        """
        parts = list(parts)
        _check_bounds(lower, upper)
        if upper is None:
            raise InvalidBounds("append_parts needs a finite upper")
        # the cached head first: when it says [lower, upper) is next, the link's CAS decides
        # (a CAS that lands proves the cache was the head; one that loses reads it), so a
        # writer appending batch after batch makes one consensus write and no read
        state = self.machine.current()
        if state.upper != lower:
            state = self.machine.fetch()
        for _ in range(100):
            if state.upper is not None and state.upper < lower:
                raise UpperMismatch(lower, state.upper, self.shard)
            if state.upper is None or state.upper >= upper:
                self._check_definite_parts(state, parts, lower, upper)
                self.discard(parts)
                return False
            if state.upper > lower:
                raise UpperMismatch(lower, state.upper, self.shard)  # parts cannot be trimmed
            try:
                self.link_parts(parts, lower, upper)
                return True
            except UpperMismatch:
                state = self.machine.fetch()  # a concurrent link of the same batch: look again
        raise UpperMismatch(lower, self.machine.fetch().upper, self.shard)

    def discard(self, parts: list[PartMeta]) -> None:
        """Delete parts that will not be linked (best effort; the sweep collects what is left)."""
        P.delete_quietly(self.client.store, [p.key for p in parts])

    def verify_written(self, updates: pa.Table, lower: int, upper: int | None) -> None:
        """Raise DefinitenessViolation unless the shard holds exactly ``updates`` for
        [lower, upper) (which must be below its upper)."""
        updates = P.check_updates(updates)
        _check_bounds(lower, upper)
        _check_times(updates, lower, upper)
        state = self.machine.fetch()
        held_to = _min_upper(state.upper, upper)
        if held_to != upper:
            raise InvalidBounds(f"shard {self.shard!r} holds times below {state.upper}, not "
                                f"all of [{lower}, {upper})")
        self._check_definite(state, updates, lower, upper)

    # -- internals -----------------------------------------------------------------------------
    def _link(self, new_parts: list[PartMeta], expected_upper: int, new_upper: int | None,
              schema: pa.Schema | None, *, verify: bool) -> ShardState:
        _check_bounds(expected_upper, new_upper)
        if schema is None:
            schema = _parts_schema(new_parts, self.shard)
        schema_text = P.schema_to_text(schema) if schema is not None else None
        wid = self.writer_id
        now = self.client.clock.now_ms()
        if new_parts:
            self._check_parts(new_parts, expected_upper, new_upper)
            if verify:
                try:
                    verify_parts(self.client.store, new_parts,
                                 parts_prefix(self.client.root, self.shard, wid))
                except NotFound:
                    refresh(self.machine.fetch(), wid, now)  # LeaseExpired says why, if so
                    raise
        stored = tuple(replace(p, schema=None) for p in new_parts)
        keys = {p.key for p in stored}

        def step(state: ShardState) -> ShardState:
            if state.upper != expected_upper:
                raise UpperMismatch(expected_upper, state.upper, self.shard)
            writers = state.writers
            if new_parts:  # a dropped writer's parts may be swept: it must not link them
                writers = refresh(state, wid, now)
                if any(p.key in keys for p in state.parts):
                    raise InvalidInput(f"shard {self.shard!r}: a part is already linked")
            elif state.writer(wid) is not None:
                writers = refresh(state, wid, now)
            if schema is not None:
                _check_schema(state, schema, self.shard)
            return replace(state, upper=new_upper, parts=state.parts + stored, writers=writers,
                           schema=state.schema or schema_text)

        state = self.machine.apply(step)
        if state.writer(wid) is not None:
            self._reg.linked(now)
        limit = self.client.auto_compact_at
        if limit is not None and len(state.parts) > limit:
            self.client.request_compaction(self.shard)  # off the append's latency path
        return state

    def _check_parts(self, parts: list[PartMeta], lower: int, upper: int | None) -> None:
        prefix = parts_prefix(self.client.root, self.shard, self.writer_id)
        if len({p.key for p in parts}) != len(parts):
            raise InvalidInput("the same part is listed twice")
        for p in parts:
            if not isinstance(p, PartMeta):
                raise InvalidInput(f"expected PartMeta, got {type(p).__name__}")
            if not p.key.startswith(prefix) or "/" in p.key[len(prefix):]:
                raise InvalidInput(f"part {p.key!r} was not uploaded under writer "
                                   f"{self.writer_id!r} of shard {self.shard!r} "
                                   f"(use upload_part with this writer's id)")
            if not lower <= p.lower < p.upper or (upper is not None and p.upper > upper):
                hint = " (an untimed part: use part.at_time(t))" if p.upper == 0 else ""
                raise InvalidBounds(f"part {p.key!r} covers [{p.lower}, {p.upper}), outside "
                                    f"[{lower}, {upper}){hint}")
            if p.time_override is not None and not p.lower <= p.time_override < p.upper:
                raise InvalidBounds(f"part {p.key!r}: time {p.time_override} outside "
                                    f"[{p.lower}, {p.upper})")

    def _check_definite(self, state: ShardState, updates: pa.Table, lo: int,
                        hi: int | None) -> None:
        hi_ = MAX_TIME if hi is None else hi
        if lo >= hi_:
            return
        times = updates.column(P.TIME)
        ours = updates.filter(pc.and_(pc.greater_equal(times, pa.scalar(lo, pa.uint64())),
                                      pc.less(times, pa.scalar(hi_, pa.uint64()))))
        schema = _update_schema(ours)
        if schema is not None:
            _check_schema(state, schema, self.shard)
        compare(self.shard, ours, held(self.client, state, lo, hi_), lo, hi)

    def _check_definite_parts(self, state: ShardState, parts: list[PartMeta], lo: int,
                              hi: int) -> None:
        if same_bytes([p for p in state.parts if overlaps(p, lo, hi)], parts, lo, hi):
            return
        for p in parts:
            if not lo <= p.lower < p.upper <= hi:
                raise InvalidBounds(f"part {p.key!r} covers [{p.lower}, {p.upper}), outside "
                                    f"[{lo}, {hi})")
        tables = read_parts_parallel(self.client.store, parts)
        theirs = held(self.client, state, lo, hi)
        cols = theirs.column_names
        if tables:
            try:
                ours = pa.concat_tables([t.select(cols) for t in tables])
            except (KeyError, pa.ArrowException) as e:
                raise DefinitenessViolation(self.shard, lo, hi, -1,
                                            f"columns differ: {e}") from None
        else:
            ours = theirs.slice(0, 0)
        compare(self.shard, ours, theirs, lo, hi)


def _min_upper(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _check_bounds(lower: int, upper: int | None) -> None:
    if type(lower) is not int or not 0 <= lower <= MAX_TIME:
        raise InvalidBounds(f"lower/expected upper {lower!r} is not a u64 time")
    if upper is not None and (type(upper) is not int or not lower < upper <= MAX_TIME):
        raise InvalidBounds(f"new upper {upper!r} must be a u64 time > {lower} (or None)")


def _check_times(updates: pa.Table, lower: int, upper: int | None) -> int:
    """Every update time lies in [lower, upper); returns the largest (or -1 for no rows)."""
    if not updates.num_rows:
        return -1
    tmin, tmax = (int(x.as_py()) for x in pc.min_max(updates.column(P.TIME)).values())
    if tmin < lower or (upper is not None and tmax >= upper):
        raise InvalidBounds(f"update times [{tmin}, {tmax}] outside [{lower}, {upper})")
    return tmax


def _update_schema(updates: pa.Table) -> pa.Schema | None:
    schema = P.data_schema(updates).remove_metadata()
    if not updates.num_rows and any(pa.types.is_null(f.type) for f in schema):
        return None  # an untyped empty batch neither fixes nor checks the schema
    return schema


def _parts_schema(parts: list[PartMeta], shard: str) -> pa.Schema | None:
    texts = {p.schema for p in parts if p.schema is not None}
    if len(texts) > 1:
        raise InvalidInput(f"shard {shard!r}: the parts have different data columns")
    return P.schema_from_text(texts.pop()) if texts else None


def _check_schema(state: ShardState, schema: pa.Schema, shard: str) -> None:
    if state.schema is not None:
        have = P.schema_from_text(state.schema)
        if not have.equals(schema):
            raise InvalidInput(f"shard {shard!r} has data columns {have}, updates have {schema}")
