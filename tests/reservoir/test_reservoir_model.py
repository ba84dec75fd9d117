"""Model-based test: random writes/deletes/commits/checkpoints/reopens/compactions/repacks vs a
dict; a version a checkpoint was told to keep (``keep_from``) reads back as it was."""

from __future__ import annotations

import pickle
import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.reservoir import (
    PageNotFound,
    PageRunWriter,
    ReservoirOptions,
    ReservoirReader,
    ReservoirStorage,
)
from headrace.store import LocalStore

PIDS = st.integers(min_value=-3, max_value=12)


class ReservoirModel(RuleBasedStateMachine):
    registry = "bundled"
    adaptive = False

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="hr-res-model-")
        self.store = LocalStore(self.dir + "/store", fsync=False)
        self.opts = ReservoirOptions(max_file_size=4096, snapshot_interval=3,
                                     registry=self.registry, in_flight_capacity=2,
                                     compaction_ratio_threshold=0.5,
                                     snapshot_dead_ratio=0.25 if self.adaptive else 0.0)
        self.storage = self._open()
        self.session = self.storage.session()
        self.pending: dict[int, bytes | None] = {}
        self.committed: dict[int, bytes] = {}
        self.durable: dict[int, bytes] = {}
        self.counter = 0
        self.runs = 0
        self.history: dict[int, dict[int, bytes]] = {}  # version -> its pages
        self.kept: int | None = None  # the version the last checkpoint kept readable

    def _open(self):
        return ReservoirStorage.open(self.store, options=self.opts, cache_dir=self.dir + "/cache")

    @rule(pid=PIDS, size=st.integers(min_value=0, max_value=1500))
    def write(self, pid, size):
        self.counter += 1
        data = bytes([self.counter % 251]) * size + self.counter.to_bytes(4, "little")
        self.session.write(pid, data)
        self.pending[pid] = data

    @rule(pid=PIDS)
    def delete(self, pid):
        self.session.delete(pid)
        self.pending[pid] = None

    @rule()
    def commit(self):
        self.session.commit()
        for pid, data in self.pending.items():
            if data is None:
                self.committed.pop(pid, None)
            else:
                self.committed[pid] = data
        self.pending = {}
        self.session = self.storage.session()

    @rule()
    def checkpoint(self):
        v = self.storage.checkpoint()
        assert v == self.storage.version
        self.durable = dict(self.committed)
        self.history[v] = self.durable
        self.kept = None

    @rule()
    def checkpoint_keeping_the_previous(self):
        """As the pipeline checkpoints: the version before stays readable (a restart may redo
        the batch from it), even when the new one is a snapshot."""
        prev = self.storage.version
        v = self.storage.checkpoint(keep_from=prev or None)
        self.durable = dict(self.committed)
        self.history[v] = self.durable
        self.kept = prev or None

    @precondition(lambda self: self.kept is not None)
    @rule()
    def read_the_kept_version(self):
        with ReservoirReader.open(self.store, version=self.kept, options=self.opts) as r:
            for pid in range(-3, 13):
                if pid in self.history[self.kept]:
                    assert bytes(r.read(pid)) == self.history[self.kept][pid], pid
                else:
                    assert not r.contains(pid), pid

    @rule()
    def repack_sparse(self):
        """Live pages of mostly dead files move into the next checkpoint: nothing reads
        differently."""
        self.storage.repack_sparse(0.5, 8192)

    @rule()
    def reopen(self):
        self.storage.close()
        self.storage = self._open()
        self.session = self.storage.session()
        self.pending = {}
        self.committed = dict(self.durable)
        self._check(self.durable)

    @rule(ops=st.lists(st.tuples(PIDS, st.integers(min_value=-1, max_value=1500)),
                       max_size=12))
    def absorb_run_from_another_process(self, ops):
        """A task's PageRunWriter (full files uploaded by the task), absorbed by the driver."""
        self.runs += 1
        w = PageRunWriter(self.store, run_id=f"run{self.runs}", options=self.opts)
        final: dict[int, bytes | None] = {}
        for pid, size in ops:
            if size < 0:
                w.delete(pid)
                final[pid] = None
            else:
                self.counter += 1
                data = bytes([self.counter % 251]) * size + self.counter.to_bytes(4, "little")
                w.write(pid, data)
                final[pid] = data
        self.storage.absorb([pickle.loads(pickle.dumps(w.finish()))])
        for pid, data in final.items():
            if data is None:
                self.committed.pop(pid, None)
            else:
                self.committed[pid] = data

    @precondition(lambda self: not self.pending)
    @rule()
    def sweep_orphans(self):
        self.storage.sweep_orphans(grace_s=0)

    @precondition(lambda self: not self.pending)
    @rule()
    def compact(self):
        if self.storage.compact() is not None:
            self.durable = dict(self.committed)
            self.history[self.storage.version] = self.durable
            self.kept = None

    def _check(self, model):
        for pid in range(-3, 13):
            if pid in model:
                assert bytes(self.storage.read(pid)) == model[pid], pid
            else:
                try:
                    self.storage.read(pid)
                except PageNotFound:
                    continue
                raise AssertionError(f"page {pid} should not exist")

    @invariant()
    def reads_match_committed(self):
        self._check(self.committed)
        for pid, data in self.pending.items():
            if data is not None:
                assert self.session.read(pid) == data

    def teardown(self):
        self.storage.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class ReservoirModelFileRegistry(ReservoirModel):
    registry = "file"


class ReservoirModelAdaptiveSnapshots(ReservoirModel):
    adaptive = True


SETTINGS = settings(max_examples=20, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestReservoirModel = ReservoirModel.TestCase
TestReservoirModel.settings = SETTINGS
TestReservoirModelFileRegistry = ReservoirModelFileRegistry.TestCase
TestReservoirModelFileRegistry.settings = SETTINGS
TestReservoirModelAdaptiveSnapshots = ReservoirModelAdaptiveSnapshots.TestCase
TestReservoirModelAdaptiveSnapshots.settings = SETTINGS
