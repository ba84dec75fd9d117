"""PersistClient: the entry point. One client per process (or per Spark task) and store URL.

Layout on the store (docs/formats/persist-layout.md):

    {root}/{shard}/consensus/{seqno:020}   state versions (Create-only), + hint, floor
    {root}/{shard}/parts/{ULID}.parquet    write-once update parts
"""

from __future__ import annotations

import logging
import queue
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.codec import Clock, SystemClock, new_ulid
from headrace.errors import NotFound
from headrace.metrics import PrometheusExport
from headrace.persist import parts as P
from headrace.persist.consensus import (
    DEFAULT_ROOT,
    Consensus,
    ObjectStoreConsensus,
    validate_shard_name,
)
from headrace.persist.handles import ReadHandle, WriteHandle, read_parts_parallel
from headrace.persist.machine import ShardMachine
from headrace.persist.state import CriticalReader, LeasedReader, ShardState
from headrace.store import ObjectStore, open_store

log = logging.getLogger("headrace.persist")

DEFAULT_LEASE_S = 900.0


class PersistClient(PrometheusExport):
    metrics_prefix = "headrace_persist_client"

    def __init__(self, store_or_url: ObjectStore | str, *, root: str = DEFAULT_ROOT,
                 clock: Clock | None = None, consensus: Consensus | None = None,
                 auto_compact_at: int | None = 64, compact_to: int = 16):
        """``auto_compact_at``: after an append leaves more parts than this, the shard is
        compacted down to ``compact_to`` parts by a background thread (None: only explicit
        ``compact``). ``close()`` waits for it and raises its error, if any."""
        if auto_compact_at is not None and not 1 <= compact_to < auto_compact_at:
            raise ValueError("compact_to must be in [1, auto_compact_at)")
        self.auto_compact_at = auto_compact_at
        self.compact_to = compact_to
        self.store = open_store(store_or_url)
        self.root = root.strip("/")
        self.clock = clock or SystemClock()
        self.consensus = consensus or ObjectStoreConsensus(self.store, self.root)
        self._machines: dict[str, ShardMachine] = {}
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
    def open_writer(self, shard: str) -> WriteHandle:
        return WriteHandle(self, self.machine(shard))

    def open_reader(self, shard: str, reader_id: str | None = None, *,
                    lease_s: float = DEFAULT_LEASE_S) -> ReadHandle:
        """``reader_id=None``: a leased reader (new id, expires after ``lease_s`` without a
        heartbeat). A ``reader_id``: the critical reader of that name (created at the current
        since with token ""), whose since moves only by compare_and_downgrade_since."""
        machine = self.machine(shard)
        now = self.clock.now_ms()
        if reader_id is None:
            rid = "l-" + new_ulid()

            def add_leased(state: ShardState):
                r = LeasedReader(rid, state.since, now, int(lease_s * 1000))
                return state.with_readers(leased=state.leased + (r,))
            machine.apply(add_leased)
            return ReadHandle(self, machine, rid, "leased")
        validate_shard_name(reader_id)

        def add_critical(state: ShardState):
            if state.reader(reader_id) is not None:
                return None
            r = CriticalReader(reader_id, state.since, "")
            return state.with_readers(critical=state.critical + (r,))
        machine.apply(add_critical)
        return ReadHandle(self, machine, reader_id, "critical")

    def read_only(self, shard: str) -> ReadHandle:
        """A reader that holds nothing back (CLI, one-off reads; compaction may outrun it)."""
        return ReadHandle(self, self.machine(shard), None, "read-only")

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
        for attempt in range(3):
            chosen = [p for p in state.parts if p.lower < upper and p.upper > lower
                      or (p.time_override is not None and lower <= p.time_override < upper)]
            try:
                tables = read_parts_parallel(self.store, chosen)
                break
            except NotFound:
                if attempt == 2:
                    raise
                state = self.machine(state.shard).fetch()  # compacted and swept meanwhile
        self._metrics["parts_read"] += len(chosen)
        self._metrics["bytes_read"] += sum(p.size for p in chosen)
        cols = None
        if state.schema is not None:
            cols = P.schema_from_text(state.schema).names + [P.TIME, P.DIFF]
        tables = [t.select(cols) if cols else t for t in tables]
        if not tables:
            return self.empty_updates(state)
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        times = table.column(P.TIME)
        mask = pc.and_(pc.greater_equal(times, pa.scalar(lower, pa.uint64())),
                       pc.less(times, pa.scalar(upper, pa.uint64())))
        return table.filter(mask)

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

    def close(self) -> None:
        """Finish queued compactions and stop the compactor thread."""
        with self._lock:
            thread, self._compactor = self._compactor, None
        if thread is not None:
            self._compact_queue.put(None)
            thread.join()
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
