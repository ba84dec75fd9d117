"""Model-based test: appends, reads, since downgrades, compaction and sweeps vs a list model.

Invariant checked after every step: for every t in [since, upper), snapshot(t) equals the model's
updates with time <= t, consolidated.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.persist import PersistClient, UpperMismatch, make_updates
from headrace.store import MemoryStore


class ShardModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.client = PersistClient(MemoryStore())
        self.writer = self.client.open_writer("m")
        self.reader = self.client.open_reader("m")
        self.updates: list[tuple[str, int, int]] = []
        self.upper = 0
        self.since = 0

    @rule(batch=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3),
                                   st.integers(-2, 2)), max_size=6),
          width=st.integers(1, 4))
    def append(self, batch, width):
        new_upper = self.upper + width
        rows = [(k, self.upper + min(dt, width - 1), d) for k, dt, d in batch]
        self.writer.compare_and_append(
            make_updates({"k": pa.array([r[0] for r in rows], pa.string())}, [r[1] for r in rows], [r[2] for r in rows]),
            self.upper, new_upper)
        self.updates += rows
        self.upper = new_upper

    @rule(stale=st.integers(0, 3))
    def stale_append_loses(self, stale):
        expected = max(0, self.upper - 1 - stale)
        if expected == self.upper:
            return
        try:
            self.writer.compare_and_append(make_updates({"k": ["z"]}, [expected]), expected,
                                           self.upper + 1)
            raise AssertionError("a stale compare_and_append won")
        except UpperMismatch as e:
            assert e.current == self.upper

    @precondition(lambda self: self.upper > 0)
    @rule(data=st.data())
    def downgrade_since(self, data):
        target = data.draw(st.integers(self.since, self.upper - 1))
        self.reader.downgrade_since(target)
        self.since = target

    @rule(max_parts=st.integers(1, 4))
    def compact(self, max_parts):
        self.client.compact("m", max_parts=max_parts)
        assert len(self.client.state("m").parts) <= max(max_parts, 1)

    @rule()
    def sweep(self):
        self.client.sweep(grace_s=0)

    def model_at(self, t: int) -> Counter:
        acc: Counter = Counter()
        for k, time, d in self.updates:
            if time <= t:
                acc[k] += d
        return Counter({k: v for k, v in acc.items() if v})

    @invariant()
    def snapshots_match_model(self):
        assert self.client.upper("m") == self.upper
        assert self.client.since("m") == self.since
        for t in sorted({self.since, (self.since + self.upper) // 2, self.upper - 1}):
            if not self.since <= t < self.upper:
                continue
            snap = self.reader.snapshot(t)
            got = Counter(dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(),
                                   strict=True)))
            assert got == self.model_at(t), t


ShardModel.TestCase.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
TestShardModel = ShardModel.TestCase
