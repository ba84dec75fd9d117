"""PersistClient: the entry point. One client per process (or per Spark task) and store URL.

Layout on the store (docs/persist.md, docs/formats/persist-*.md):

    {root}/{shard}/consensus/{seqno:020}              state versions (Create-only), + hint, floor
    {root}/{shard}/parts/{writer_id}/{ULID}.parquet   write-once update parts

A client holds one writer lease per shard it writes (registered on its first upload, refreshed
by its links, released by ``close()``), shared by every WriteHandle it opens on that shard.
"""

from __future__ import annotations

import logging
import queue
import re
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.codec import Clock, SystemClock, new_ulid
from headrace.errors import HeadraceError, InvalidInput, NotFound
from headrace.metrics import PrometheusExport
from headrace.persist import parts as P
from headrace.persist.consensus import (
    DEFAULT_ROOT,
    Consensus,
    ObjectStoreConsensus,
    validate_root,
    validate_shard_name,
)
from headrace.persist.errors import SinceViolation
from headrace.persist.handles import ReadHandle, read_parts_parallel
from headrace.persist.machine import ShardMachine
from headrace.persist.state import CriticalReader, LeasedReader, ShardState
from headrace.persist.uploads import new_writer_id, validate_writer_id
from headrace.persist.writer import DEFAULT_WRITER_LEASE_S, WriteHandle, _Registration
from headrace.store import ObjectStore, open_store

log = logging.getLogger("headrace.persist")

DEFAULT_LEASE_S = 900.0
READ_ATTEMPTS = 5  # a part deleted under a read (compacted): fetch the state and read again
LEASED_READER_ID = re.compile(r"^l-[A-Za-z0-9]{1,60}$")


def _lease_ms(lease_s: object, what: str) -> int:
    if not isinstance(lease_s, int | float) or not 0 < lease_s <= 366 * 86400:
        raise InvalidInput(f"{what} {lease_s!r} must be a number of seconds in (0, 1 year]")
    return int(lease_s * 1000)


class PersistClient(PrometheusExport):
    metrics_prefix = "headrace_persist_client"

    def __init__(self, store_or_url: ObjectStore | str, *, root: str = DEFAULT_ROOT,
                 clock: Clock | None = None, consensus: Consensus | None = None,
                 auto_compact_at: int | None = 64, compact_to: int = 16):
        """``auto_compact_at``: after an append leaves more parts than this, the shard is
        compacted down to ``compact_to`` parts by a background thread (None: only explicit
        ``compact``). ``close()`` waits for it and raises its error, if any."""
        if auto_compact_at is not None and (type(auto_compact_at) is not int or
                                            type(compact_to) is not int or
                                            not 1 <= compact_to < auto_compact_at):
            raise InvalidInput(f"compact_to {compact_to!r} must be an int in [1, auto_compact_at "
                               f"{auto_compact_at!r})")
        self.auto_compact_at = auto_compact_at
        self.compact_to = compact_to
        self.store = open_store(store_or_url)
        self.root = validate_root(root)
        self.clock = clock or SystemClock()
        self.consensus = consensus or ObjectStoreConsensus(self.store, self.root)
        self._machines: dict[str, ShardMachine] = {}
        self._writers: dict[str, _Registration] = {}  # this client's own writer per shard
        self._lock = threading.Lock()
        self._metrics = {"snapshots": 0, "parts_read": 0, "bytes_read": 0, "compactions": 0}
        self._compact_queue: queue.Queue[str | None] = queue.Queue()
        self._compact_pending: set[str] = set()
        self._compactor: threading.Thread | None = None
        self._compact_error: BaseException | None = None

    def machine(self, shard: str) -> ShardMachine:
        validate_shard_name(shard)
        with self._lock:
            m = self._machines.get(shard)
            if m is None:
                m = self._machines[shard] = ShardMachine(self.consensus, shard, self.clock)
            return m

    # -- handles ---------------------------------------------------------------------------
    def open_writer(self, shard: str, writer_id: str | None = None, *,
                    lease_s: float = DEFAULT_WRITER_LEASE_S) -> WriteHandle:
        """A writer. Default: this client's own writer for ``shard`` (registered on its first
        upload, once). ``writer_id``: act for a writer registered elsewhere (a Spark driver's
        commit linking the parts its tasks uploaded); it is never registered from here."""
        machine = self.machine(shard)
        if writer_id is not None:
            reg = _Registration(machine, self.clock, validate_writer_id(writer_id),
                                _lease_ms(lease_s, "lease_s"), owned=False, registered=True)
            return WriteHandle(self, machine, reg)
        with self._lock:
            reg = self._writers.get(shard)
            if reg is None:
                reg = self._writers[shard] = _Registration(
                    machine, self.clock, new_writer_id(), _lease_ms(lease_s, "lease_s"),
                    owned=True, registered=False)
        return WriteHandle(self, machine, reg)

    def register_writer(self, shard: str, *, lease_s: float = DEFAULT_WRITER_LEASE_S,
                        tag: str = "") -> WriteHandle:
        """Register a fresh writer id now (one CAS) and return a handle acting for it; its
        lease is refreshed by its links and otherwise runs out (or ``release()`` it)."""
        machine = self.machine(shard)
        reg = _Registration(machine, self.clock, new_writer_id(tag),
                            _lease_ms(lease_s, "lease_s"), owned=True, registered=False)
        reg.ensure()
        reg.owned = False  # from now on this id is only refreshed, never replaced
        return WriteHandle(self, machine, reg)

    def open_reader(self, shard: str, reader_id: str | None = None, *,
                    lease_s: float = DEFAULT_LEASE_S, as_of: int | None = None) -> ReadHandle:
        """``reader_id=None``: a leased reader (new id, expires after ``lease_s`` without a
        heartbeat), registered at the current since; with ``as_of`` it refuses to register
        (SinceViolation) when since has already passed as_of. A ``reader_id``: the critical
        reader of that name (created at the current since with token ""), whose since moves only
        by compare_and_downgrade_since."""
        machine = self.machine(shard)
        if reader_id is None:
            return self._lease_reader(machine, "l-" + new_ulid(), as_of, lease_s, resume=False)
        validate_shard_name(reader_id)

        def add_critical(state: ShardState):
            if state.reader(reader_id) is not None:
                return None
            r = CriticalReader(reader_id, state.since, "")
            return state.with_readers(critical=state.critical + (r,))
        machine.apply(add_critical)
        return ReadHandle(self, machine, reader_id, "critical")

    def resume_reader(self, shard: str, reader_id: str, *, since: int | None,
                      lease_s: float = DEFAULT_LEASE_S) -> ReadHandle:
        """Take up leased reader ``reader_id`` again (a restarted Spark stream): heartbeat it if
        it is still registered, else register it anew at the current since — refused with
        SinceViolation when that has passed ``since``, what the reader still needs (None: no
        need yet)."""
        if not isinstance(reader_id, str) or not LEASED_READER_ID.match(reader_id):
            raise InvalidInput(f"bad leased reader id {reader_id!r}")
        return self._lease_reader(self.machine(shard), reader_id, since, lease_s, resume=True)

    def _lease_reader(self, machine: ShardMachine, rid: str, needed: int | None,
                      lease_s: float, *, resume: bool) -> ReadHandle:
        lease_ms = _lease_ms(lease_s, "lease_s")
        if needed is not None and (type(needed) is not int or needed < 0):
            raise InvalidInput(f"as_of/since {needed!r} is not a u64 time")
        now = self.clock.now_ms()

        def add_leased(state: ShardState):
            mine = state.reader(rid)
            if mine is not None and not resume:
                raise InvalidInput(f"reader id {rid!r} is taken")
            if mine is not None:
                leased = [LeasedReader(rid, x.since, now, lease_ms) if x.reader_id == rid else x
                          for x in state.leased]
                return state.with_readers(leased=leased)
            if needed is not None and needed < state.since:
                raise SinceViolation(machine.shard, needed, state.since,
                                     "cannot register a reader there any more")
            r = LeasedReader(rid, state.since, now, lease_ms)
            return state.with_readers(leased=state.leased + (r,))
        machine.apply(add_leased, fresh=resume)
        return ReadHandle(self, machine, rid, "leased", lease_s)

    def attach_reader(self, shard: str, reader_id: str) -> ReadHandle:
        """Read under a capability another process holds (a Spark executor reading for the
        driver's reader): no registration, no CAS; reads still re-check since afterwards."""
        return ReadHandle(self, self.machine(shard), reader_id, "attached")

    def read_only(self, shard: str, *, lease: bool = True,
                  lease_s: float = DEFAULT_LEASE_S) -> ReadHandle:
        """A handle for one-off reads (tools). ``lease=True``: each read registers a leased
        reader at the current since for as long as it runs and expires it after (two CASes per
        read), so compaction waits for it. ``lease=False``: for tools that must not write (the
        CLI): nothing is written; each read fetches the state, reads its parts and checks since
        again after, and if since passed what the read needs meanwhile it raises SinceViolation
        (read again) — never data compaction changed."""
        if not isinstance(lease, bool):
            raise InvalidInput(f"lease must be True or False, got {lease!r}")
        if not lease:
            return ReadHandle(self, self.machine(shard), None, "lease-free")
        _lease_ms(lease_s, "lease_s")
        return ReadHandle(self, self.machine(shard), None, "one-shot", lease_s)

    # -- frontiers -------------------------------------------------------------------------
    def state(self, shard: str) -> ShardState:
        return self.machine(shard).fetch()

    def upper(self, shard: str) -> int | None:
        """The write frontier: every time below it is final. 0 for an empty shard."""
        return self.state(shard).upper

    def since(self, shard: str) -> int:
        return self.state(shard).since

    def schema(self, shard: str) -> pa.Schema | None:
        """The data columns fixed by the first write (None before it)."""
        text = self.state(shard).schema
        return P.schema_from_text(text) if text else None

    def list_shards(self) -> list[str]:
        return sorted(self.consensus.list_keys())

    # -- reading parts ---------------------------------------------------------------------
    def read_updates(self, state: ShardState, lower: int, upper: int) -> pa.Table:
        """Updates with ``lower <= time < upper`` from the parts of ``state``."""
        return self.read_range(state, lower, upper)[0]

    def read_range(self, state: ShardState, lower: int,
                   upper: int) -> tuple[pa.Table, ShardState]:
        """``read_updates`` and the state whose parts were read (a part compacted and swept
        under the read makes it fetch the state again)."""
        for attempt in range(READ_ATTEMPTS):
            chosen = [p for p in state.parts if p.lower < upper and p.upper > lower
                      or (p.time_override is not None and lower <= p.time_override < upper)]
            try:
                tables = read_parts_parallel(self.store, chosen)
                break
            except NotFound as e:
                state = self.machine(state.shard).fetch()  # compacted meanwhile?
                if attempt == READ_ATTEMPTS - 1 or any(p.key == e.key for p in state.parts):
                    raise  # still referenced: the part is lost, not compacted

        self._metrics["parts_read"] += len(chosen)
        self._metrics["bytes_read"] += sum(p.size for p in chosen)
        cols = None
        if state.schema is not None:
            cols = P.schema_from_text(state.schema).names + [P.TIME, P.DIFF]
        tables = [t.select(cols) if cols else t for t in tables]
        if not tables:
            return self.empty_updates(state), state
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        times = table.column(P.TIME)
        mask = pc.and_(pc.greater_equal(times, pa.scalar(lower, pa.uint64())),
                       pc.less(times, pa.scalar(upper, pa.uint64())))
        return table.filter(mask), state

    def verify(self, shard: str) -> ShardState:
        """Read every part the shard references and check its size, CRC32 and Parquet pages;
        returns the state checked. A part compacted away meanwhile is not an error: the state
        is fetched again. A part the state still references but the store lacks is NotFound."""
        state = self.state(shard)
        for attempt in range(READ_ATTEMPTS):
            try:
                read_parts_parallel(self.store, list(state.parts))
                return state
            except NotFound as e:
                state = self.state(shard)
                if attempt == READ_ATTEMPTS - 1 or any(p.key == e.key for p in state.parts):
                    raise
        return state

    def empty_updates(self, state: ShardState) -> pa.Table:
        fields = list(P.schema_from_text(state.schema)) if state.schema else []
        schema = pa.schema(fields + [pa.field(P.TIME, pa.uint64()), pa.field(P.DIFF, pa.int64())])
        return schema.empty_table()

    # -- maintenance -----------------------------------------------------------------------
    def compact(self, shard: str, **kw):
        from headrace.persist.compaction import compact
        return compact(self, shard, **kw)

    def request_compaction(self, shard: str) -> None:
        """Queue ``shard`` for the background compactor (started on first use)."""
        with self._lock:
            if shard in self._compact_pending:
                return
            self._compact_pending.add(shard)
            if self._compactor is None:
                self._compactor = threading.Thread(target=self._compact_loop, daemon=True,
                                                   name="hr-persist-compactor")
                self._compactor.start()
        self._compact_queue.put(shard)

    def _compact_loop(self) -> None:
        while True:
            shard = self._compact_queue.get()
            try:
                if shard is None:
                    return
                with self._lock:
                    self._compact_pending.discard(shard)
                self.compact(shard, max_parts=self.compact_to)
                self._metrics["compactions"] += 1
            except Exception as e:  # noqa: BLE001 - kept and raised by close()
                log.warning("background compaction of %s failed: %s", shard, e)
                self._compact_error = e
            finally:
                self._compact_queue.task_done()

    def wait_for_compactions(self) -> None:
        """Block until queued compactions are done; raise the first error they hit."""
        self._compact_queue.join()
        if self._compact_error is not None:
            err, self._compact_error = self._compact_error, None
            raise err

    def writer_registration(self, shard: str) -> _Registration:
        """This client's own writer lease on ``shard`` (compaction uploads under it too)."""
        return self.open_writer(shard)._reg

    def close(self) -> None:
        """Finish queued compactions, stop the compactor thread and release writer leases."""
        with self._lock:
            thread, self._compactor = self._compactor, None
        if thread is not None:
            self._compact_queue.put(None)
            thread.join()
        with self._lock:
            regs = list(self._writers.values())
        for reg in regs:
            try:
                reg.release()
            except HeadraceError as e:  # it runs out by itself
                log.info("could not release writer %s now: %s", reg.writer_id, e)
        self.wait_for_compactions()

    def __enter__(self) -> PersistClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def sweep(self, *, grace_s: float = 600.0, dry_run: bool = False):
        from headrace.persist.compaction import sweep
        return sweep(self, grace_s=grace_s, dry_run=dry_run)

    def truncate_log(self, shard: str, keep: int = 128) -> int:
        """Drop consensus versions more than ``keep`` behind the head (every one is a rollup)."""
        head = self.state(shard).seqno
        if head - keep <= 1:
            return 0
        return self.consensus.truncate(shard, head - keep)

    def delete_shard(self, shard: str) -> int:
        keys = [m.key for m in self.store.list(f"{self.root}/{validate_shard_name(shard)}/")]
        self.store.delete_many(keys)
        with self._lock:
            self._machines.pop(shard, None)
            self._writers.pop(shard, None)
        return len(keys)

    def metrics(self) -> dict:
        out = dict(self._metrics)
        if hasattr(self.consensus, "metrics"):
            out.update({f"consensus_{k}": v for k, v in self.consensus.metrics().items()})
        with self._lock:
            machines = list(self._machines.values())
        for key in ("fetches", "cas_ok", "cas_retries"):
            out[f"state_{key}"] = sum(m.metrics[key] for m in machines)
        return out


def make_updates(columns: dict, times, diffs=None) -> pa.Table:
    """Convenience: an update table from data columns, times and diffs (default +1)."""
    n = len(times)
    diffs = np.ones(n, dtype=np.int64) if diffs is None else np.asarray(diffs, dtype=np.int64)
    names = [*columns, P.TIME, P.DIFF]
    arrays = [c if isinstance(c, pa.Array | pa.ChunkedArray) else pa.array(c)
              for c in columns.values()]
    arrays += [pa.array(np.asarray(times, dtype=np.uint64)), pa.array(diffs)]
    return pa.Table.from_arrays(arrays, names=names)  # pa.table(dict) would import pandas
