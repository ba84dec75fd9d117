"""Spine: an LSM of immutable Z-set batches with a consistent, consolidated view.

Inserted batches land at level 0; a batch's level grows with its row count (size-tiered, as in
DBSP): when ``merge_fanout`` batches share a level they are merged into one. Merges run in a
named background thread (or synchronously through ``merge_step``/``compact``) and are swapped in
atomically: a reader takes a snapshot of the batch list under a lock and then reads immutable
batches without it. With a BatchStore attached, batches beyond the memory budget are written to
it and read back through mmap, so state can exceed memory.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.metrics import PrometheusExport
from headrace.spine.batch import (
    DEFAULT_BLOCK_BYTES,
    Batch,
    _as_key_array,
    sorted_unique,
)
from headrace.spine.bloom import hash_keys
from headrace.spine.catalog import check_bound_value
from headrace.spine.errors import SpineError, SpineWriteError
from headrace.zset import consolidate

log = logging.getLogger("headrace.spine")


@dataclass
class SpineConfig:
    merge_fanout: int = 4  # batches of one level merged together
    base_rows: int = 4096  # batches up to this many rows are level 0
    background_merge: bool = True
    memory_budget_bytes: int = 256 << 20  # in-memory batches beyond this spill to the store
    block_bytes: int = DEFAULT_BLOCK_BYTES

    def __post_init__(self) -> None:
        for name, least in (("merge_fanout", 2), ("base_rows", 1), ("memory_budget_bytes", 0),
                            ("block_bytes", 512)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidInput(f"SpineConfig.{name} must be an int >= {least}, got {value!r}")
        if not isinstance(self.background_merge, bool):
            raise InvalidInput("SpineConfig.background_merge must be a bool, got "
                               f"{self.background_merge!r}")


class _Slot:
    """A place in the spine; its batch may be swapped for its persisted twin."""

    __slots__ = ("batch", "busy")

    def __init__(self, batch: Batch):
        self.batch = batch
        self.busy = False


class Spine(PrometheusExport):
    """State of one operator: insert batches, read the consolidated view, checkpoint."""

    metrics_prefix = "headrace_spine"

    def __init__(self, key_type: pa.DataType, val_type: pa.DataType, *, name: str = "spine",
                 config: SpineConfig | None = None, store=None,
                 batches: list[Batch] | None = None, lower_bound=None):
        self.schema = Batch.empty(key_type, val_type).schema
        self.name = name
        self.config = config or SpineConfig()
        self.store = store
        self._key_type = self.schema.field("key").type
        self.lower_bound = check_bound_value(lower_bound, self._key_type, f"spine {name!r}")
        self._slots: list[_Slot] = []
        self._lock = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False
        self._merging = False
        self._counters = {"inserted_batches": 0, "inserted_rows": 0, "merges": 0,
                          "merged_rows": 0, "merge_seconds": 0.0, "spilled_batches": 0,
                          "spill_failures": 0, "lookups": 0}
        for b in batches or []:
            self._check_schema(b)
            if len(b):
                self._slots.append(_Slot(b))
        self._thread: threading.Thread | None = None
        if self.config.background_merge:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"headrace-spine-merge-{name}")
            self._thread.start()

    @classmethod
    def from_batches(cls, batches: list[Batch], **kwargs) -> Spine:
        if not batches:
            raise InvalidInput("from_batches needs at least one batch (for the types)")
        kwargs.setdefault("config", SpineConfig(background_merge=False))
        return cls(batches[0].key_type, batches[0].val_type, batches=batches, **kwargs)

    # ---- writes -------------------------------------------------------------------------
    def _check_schema(self, batch: Batch) -> None:
        if not batch.schema.equals(self.schema):
            raise InvalidInput(f"spine {self.name!r} holds {self.schema}, batch is {batch.schema}")

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise SpineError(f"spine {self.name!r}: background merge failed: {self._error}") \
                from self._error
        if self._closed:
            raise SpineError(f"spine {self.name!r} is closed")

    def insert(self, batch: Batch) -> None:
        """Add a batch (already consolidated); a merge may follow in the background."""
        if not isinstance(batch, Batch):
            batch = Batch.from_arrow(batch)
        self._check_schema(batch)
        with self._lock:
            self._raise_if_failed()
            if len(batch):
                self._slots.append(_Slot(batch))
                self._counters["inserted_batches"] += 1
                self._counters["inserted_rows"] += len(batch)
                self._lock.notify_all()

    def truncate_below(self, bound) -> None:
        """Hide (and let merges drop) every key below ``bound``; bounds only ever rise."""
        if bound is None:
            raise InvalidInput(f"spine {self.name!r}: truncate_below needs a key, got None")
        bound = check_bound_value(bound, self._key_type, f"spine {self.name!r}")
        with self._lock:
            if self.lower_bound is None or bound > self.lower_bound:
                self.lower_bound = bound

    # ---- merging ------------------------------------------------------------------------
    def level_of(self, batch: Batch) -> int:
        rows = len(batch)
        if rows <= self.config.base_rows:
            return 0
        return 1 + int(math.log(rows / self.config.base_rows, self.config.merge_fanout))

    def levels(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for b in self.batches:
            lv = self.level_of(b)
            out[lv] = out.get(lv, 0) + 1
        return dict(sorted(out.items()))

    def _plan(self, everything: bool = False) -> list[_Slot] | None:
        """Pick slots to merge (caller holds the lock); marks them busy."""
        free = [s for s in self._slots if not s.busy]
        if everything:
            pick = free if len(free) > 1 or (free and self.lower_bound is not None) else None
        else:
            by_level: dict[int, list[_Slot]] = {}
            for s in free:
                by_level.setdefault(self.level_of(s.batch), []).append(s)
            pick = None
            for lv in sorted(by_level):
                if len(by_level[lv]) >= self.config.merge_fanout:
                    pick = by_level[lv][: self.config.merge_fanout]
                    break
        if pick:
            for s in pick:
                s.busy = True
        return pick

    def _merge(self, plan: list[_Slot]) -> None:
        t0 = time.perf_counter()
        try:
            out = Batch.merge([s.batch for s in plan], self.lower_bound)
            if self.store is not None and out.nbytes > self.config.memory_budget_bytes // 4:
                out = self._spill(out)
        except BaseException:
            with self._lock:
                for s in plan:
                    s.busy = False
            raise
        with self._lock:
            ids = {id(s) for s in plan}
            self._slots = [s for s in self._slots if id(s) not in ids]
            if len(out):
                self._slots.append(_Slot(out))
            self._counters["merges"] += 1
            self._counters["merged_rows"] += sum(len(s.batch) for s in plan)
            self._counters["merge_seconds"] += time.perf_counter() - t0
            self._lock.notify_all()
        if self.store is not None:
            self.store.discard([s.batch.name for s in plan if s.batch.persistent])
        self._enforce_budget()

    def merge_step(self) -> bool:
        """Run one merge the policy asks for, in this thread; False if none was due."""
        with self._lock:
            self._raise_if_failed()
            plan = self._plan()
        if not plan:
            return False
        self._merge(plan)
        return True

    def compact(self) -> None:
        """Merge everything into one batch (waits for a running background merge first)."""
        with self._lock:
            self._raise_if_failed()
            while any(s.busy for s in self._slots):
                self._lock.wait(0.05)
            plan = self._plan(everything=True)
        if plan:
            self._merge(plan)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no merge is due or running (background mode); True when idle.

        Without a background thread nothing merges on its own: returns True at once.
        """
        if self._thread is None:
            with self._lock:
                self._raise_if_failed()
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                self._raise_if_failed()
                if not self._merging and self._due_locked() is False:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(0.05 if left is None else min(left, 0.05))

    def _due_locked(self) -> bool:
        plan = self._plan()
        if plan:
            for s in plan:
                s.busy = False
            return True
        return False

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (plan := self._plan()) is None:
                    self._lock.wait()
                if self._closed:
                    return
                self._merging = True
            try:
                self._merge(plan)
            except BaseException as e:  # surfaced to callers by _raise_if_failed
                log.exception("spine %s: merge failed", self.name)
                with self._lock:
                    self._error = e
                    self._merging = False
                    self._lock.notify_all()
                return
            with self._lock:
                self._merging = False
                self._lock.notify_all()

    def _enforce_budget(self) -> None:
        """Write the largest in-memory batches to the store until the rest fit the budget."""
        if self.store is None:
            return
        while True:
            with self._lock:
                mem = [s for s in self._slots if not s.batch.persistent and not s.busy]
                total = sum(s.batch.nbytes for s in self._slots if not s.batch.persistent)
                if total <= self.config.memory_budget_bytes or not mem:
                    return
                slot = max(mem, key=lambda s: s.batch.nbytes)
                old = slot.batch
            persisted = self._spill(old)
            if persisted is old:  # the disk refused: keep it in memory, commit will say why
                return
            with self._lock:
                if slot.batch is old:
                    slot.batch = persisted

    def _spill(self, batch: Batch) -> Batch:
        """Write ``batch`` to the store to free memory; on a write error keep it in memory.

        Spilling is optional (the batch is not committed yet), so a full or failing disk must not
        kill the spine: the write is retried by the store, and if it still fails the batch stays
        in memory and the next ``persist_all`` (a commit) raises the error to its caller.
        """
        try:
            out = self.store.write_batch(batch, self.config.block_bytes)
        except SpineWriteError as e:
            log.warning("spine %s: cannot spill a batch, keeping it in memory: %s", self.name, e)
            self._counters["spill_failures"] += 1
            return batch
        self._counters["spilled_batches"] += 1
        return out

    def persist_all(self) -> list[str]:
        """Write every in-memory batch to the store; pin and return the names of all batches.

        A merge in progress is not waited for: its inputs are what the checkpoint records. The
        names are read and pinned under the spine lock, so a merge finishing meanwhile cannot
        discard a file the checkpoint is about to reference.
        """
        if self.store is None:
            raise SpineError(f"spine {self.name!r} has no BatchStore to persist to")
        while True:
            with self._lock:
                self._raise_if_failed()
                pending = [s for s in self._slots if not s.batch.persistent]
                if not pending:
                    names = [s.batch.name for s in self._slots]
                    self.store.pin(names)
                    return names
            for slot in pending:
                old = slot.batch
                new = self.store.write_batch(old, self.config.block_bytes)
                with self._lock:
                    if slot.batch is old and any(s is slot for s in self._slots):
                        slot.batch = new
                    else:  # merged away meanwhile: the copy is not needed
                        self.store.discard([new.name])

    # ---- reads --------------------------------------------------------------------------
    @property
    def batches(self) -> list[Batch]:
        with self._lock:
            return [s.batch for s in self._slots]

    def __len__(self) -> int:
        """Rows across batches (before consolidation between batches)."""
        return sum(len(b) for b in self.batches)

    def _snapshot(self):
        with self._lock:
            self._raise_if_failed()
            return [s.batch for s in self._slots], self.lower_bound

    def _finish(self, parts: list[pa.Table], bound, single: bool) -> pa.Table:
        if not parts:
            return Batch.empty(self.schema.field("key").type,
                               self.schema.field("val").type).table
        t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if bound is not None:
            t = t.filter(pc.greater_equal(t.column("key"), bound))
        return t if single else consolidate(t, sort=True)

    def lookup_many(self, keys) -> pa.Table:
        """(key, val, w) for every key in ``keys``, summed across batches, zeros dropped."""
        batches, bound = self._snapshot()
        self._counters["lookups"] += 1
        if not batches:
            return self._finish([], bound, True)
        keys = _as_key_array(keys, self.schema.field("key").type)
        if pa.types.is_int64(keys.type):
            keys = pa.array(sorted_unique(keys.to_numpy()))
        else:
            keys = pc.unique(keys)
        # int64: two searchsorted per batch cost less than Bloom probes; binary keys: the
        # filter saves routing probes through the sparse index (Python objects)
        hashes = hash_keys(keys) if not pa.types.is_int64(keys.type) and any(
            b.bloom_k for b in batches) else None
        parts = [b.lookup_many(keys, hashes=hashes, probe_sorted=True) for b in batches]
        return self._finish(parts, bound, len(parts) == 1)

    def range(self, lo=None, hi=None) -> pa.Table:
        """The consolidated rows with lo <= key < hi."""
        return self.snapshot().range(lo, hi)

    def snapshot(self) -> SpineSnapshot:
        """The batches and lower bound as they are now: later inserts, merges and truncations
        do not change what the snapshot reads (batches are immutable)."""
        batches, bound = self._snapshot()
        return SpineSnapshot(self, batches, bound)

    def to_table(self) -> pa.Table:
        """The whole consolidated contents."""
        return self.range()

    def cursor(self, lo=None, hi=None, chunk_rows: int = 65536):
        """A cursor over a snapshot taken now: merges running while it iterates do not change
        what it yields."""
        from headrace.spine.cursor import Cursor

        return Cursor(self.snapshot(), lo, hi, chunk_rows)

    def metrics(self) -> dict:
        batches = self.batches
        out = dict(self._counters)
        out.update(batches=len(batches), rows=sum(len(b) for b in batches),
                   persistent_batches=sum(b.persistent for b in batches),
                   memory_bytes=sum(b.nbytes for b in batches if not b.persistent))
        return out

    def close(self) -> None:
        """Stop the merge thread (a running merge finishes first); surfaces its error."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._error is not None:
            raise SpineError(f"spine {self.name!r}: background merge failed: {self._error}") \
                from self._error

    def __enter__(self) -> Spine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SpineSnapshot:
    """A spine's batch list and lower bound frozen at one moment (what a Cursor reads)."""

    __slots__ = ("_spine", "batches", "lower_bound")

    def __init__(self, spine: Spine, batches: list[Batch], lower_bound):
        self._spine = spine
        self.batches = batches
        self.lower_bound = lower_bound

    def range(self, lo=None, hi=None) -> pa.Table:
        """The consolidated rows with lo <= key < hi, as of the snapshot."""
        where = f"spine {self._spine.name!r} range"
        lo = check_bound_value(lo, self._spine._key_type, where)
        hi = check_bound_value(hi, self._spine._key_type, where)
        bound = self.lower_bound
        if bound is not None and (lo is None or lo < bound):
            lo = bound
        return self._spine._finish([b.range(lo, hi) for b in self.batches], None,
                                   len(self.batches) == 1)
