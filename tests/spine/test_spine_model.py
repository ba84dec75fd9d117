"""Model-based test: a Circuit's spine against a Python dict, through merges, commits, crashes.

A crash is simulated by abandoning the circuit without close(): nothing is flushed, only the
directory lock is released (as the kernel does when a process dies); the reopened spine must
equal the model as of its last checkpoint.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.spine import Batch, Circuit, ReservoirBatchStore, SpineConfig

CONFIG = SpineConfig(merge_fanout=2, base_rows=4, background_merge=False,
                     memory_budget_bytes=2000, block_bytes=512)
deltas = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), st.integers(-2, 2)),
                  min_size=1, max_size=25)


class SpineMachine(RuleBasedStateMachine):
    key_kind = "int"

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="hr-spine-model-")
        self.model: dict = defaultdict(int)
        self.committed: dict = {}
        self.bound = None
        self.committed_bound = None
        self.circuit = None
        self._open()

    def _key(self, k: int):
        return k if self.key_kind == "int" else f"k{k:03d}"

    def _location(self):
        return self.dir

    def _open(self):
        self.circuit = Circuit.open(self._location(), "graph-v1", config=CONFIG)
        kt = pa.int64() if self.key_kind == "int" else pa.large_string()
        self.spine = self.circuit.spine("state", kt, pa.int64())

    @rule(rows=deltas)
    def insert(self, rows):
        keys = [self._key(k) for k, _, _ in rows]
        self.spine.insert(Batch.from_arrow(pa.table({
            "key": pa.array(keys), "val": pa.array([v for _, v, _ in rows], pa.int64()),
            "w": pa.array([w for _, _, w in rows], pa.int64())})))
        for k, v, w in rows:
            self.model[(self._key(k), v)] += w

    @rule()
    def merge_step(self):
        self.spine.merge_step()

    @rule()
    def compact(self):
        self.spine.compact()

    @rule(bound=st.integers(0, 20))
    def truncate_below(self, bound):
        b = self._key(bound)
        self.spine.truncate_below(b)
        if self.bound is None or b > self.bound:
            self.bound = b

    @rule()
    def commit(self):
        self.circuit.commit()
        self.committed = dict(self.expected())
        self.committed_bound = self.bound

    @precondition(lambda self: len(self.circuit.checkpoints()) > 2)
    @rule()
    def gc_checkpoint(self):
        self.circuit.gc_checkpoint()

    @rule()
    def crash_and_reopen(self):
        self.circuit.store.close()  # the kernel drops the lock of a dead process; nothing else
        self._open()
        self.model = defaultdict(int, self.committed)
        self.bound = self.committed_bound

    def expected(self) -> dict:
        return {k: w for k, w in self.model.items()
                if w and (self.bound is None or k[0] >= self.bound)}

    @invariant()
    def view_equals_model(self):
        t = self.spine.to_table()
        got = {(k, v): w for k, v, w in
               zip(*(t.column(c).to_pylist() for c in ("key", "val", "w")), strict=True)}
        assert got == self.expected()

    @invariant()
    def lookups_equal_model(self):
        probe = [self._key(k) for k in (0, 3, 7, 19, 33, 41)]
        t = self.spine.lookup_many(pa.array(probe))
        got = {(k, v): w for k, v, w in
               zip(*(t.column(c).to_pylist() for c in ("key", "val", "w")), strict=True)}
        assert got == {k: w for k, w in self.expected().items() if k[0] in set(probe)}

    def teardown(self):
        try:
            self.circuit.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class StringKeySpineMachine(SpineMachine):
    key_kind = "str"


class ReservoirSpineMachine(SpineMachine):
    """The same model on ReservoirBatchStore; a crash = closing the reservoir without a
    checkpoint (only checkpointed pages survive either way)."""

    def _location(self):
        return ReservoirBatchStore(self.dir + "/bucket", page_bytes=4096)


_settings = settings(max_examples=15, stateful_step_count=20, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestSpineModelInt = SpineMachine.TestCase
TestSpineModelInt.settings = _settings
TestSpineModelStr = StringKeySpineMachine.TestCase
TestSpineModelStr.settings = _settings
TestSpineModelReservoir = ReservoirSpineMachine.TestCase
TestSpineModelReservoir.settings = settings(_settings, max_examples=5)
