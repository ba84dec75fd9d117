"""Model-based test: the CAS queue against a plain Python list, with transient store faults."""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.buffer import Fenced, QueueConsumer, QueueProducer
from headrace.buffer.types import Metadata
from headrace.retry import RetryPolicy
from headrace.store import FaultyStore, MemoryStore

M = "q/manifest"
_names = itertools.count()


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = FaultyStore(MemoryStore(f"model-{next(_names)}"), seed=5)
        self.store.set_faults(fail_rate=0.1, lost_reply_rate=0.1)
        policy = RetryPolicy(max_attempts=1000, base_delay_s=0, max_delay_s=0)
        self.producer = QueueProducer(self.store, M, policy, data_path_prefix="q")
        self.consumers: list[QueueConsumer] = []
        self.policy = policy
        self.model: list[tuple[int, str, bytes]] = []  # (sequence, location, payload)
        self.next_sequence = 0
        self.epoch = 0

    @rule(payload=st.binary(max_size=8))
    def enqueue(self, payload):
        loc = f"q/{self.next_sequence}-{len(payload)}.batch"
        seq = self.producer.enqueue(loc, [Metadata(0, 1, payload)])
        assert seq == self.next_sequence
        self.model.append((seq, loc, payload))
        self.next_sequence += 1

    @rule()
    def new_consumer(self):
        c = QueueConsumer(self.store, M, self.policy)
        # a lost reply on initialize may bump the epoch twice: the consumer learns its own
        self.epoch = c.initialize()
        self.consumers.append(c)

    @precondition(lambda self: self.consumers)
    @rule(k=st.integers(0, 5))
    def dequeue(self, k):
        c = self.consumers[-1]
        if not self.model:
            return
        through = self.model[min(k, len(self.model) - 1)][0]
        c.dequeue(through)
        self.model = [x for x in self.model if x[0] > through]

    @precondition(lambda self: len(self.consumers) > 1)
    @rule()
    def old_consumer_is_fenced(self):
        try:
            self.consumers[0].peek()
        except Fenced:
            return
        raise AssertionError("an older consumer was not fenced")

    @invariant()
    def manifest_matches_model(self):
        if not self.consumers:
            return
        m = self.consumers[-1].snapshot()
        assert [(e.sequence, e.location, e.metadata[0].payload) for e in m.entries] == self.model
        assert m.next_sequence == self.next_sequence and m.epoch == self.epoch


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)
