"""Consensus on the local folder, memory and a real S3 endpoint (moto), plus its small objects."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.errors import FormatError
from headrace.persist.consensus import (
    ObjectStoreConsensus,
    decode_seqno_object,
    encode_seqno_object,
)
from headrace.store import CountingStore, LocalStore, MemoryStore, open_store
from headrace.testing.consensus_conformance import ConsensusTests


class TestLocalConsensus(ConsensusTests):
    @pytest.fixture
    def consensus(self, tmp_path):
        return ObjectStoreConsensus(LocalStore(tmp_path / "s"), hint_every=4, min_age_s=0, fresh_s=0)


class TestMemoryConsensus(ConsensusTests):
    @pytest.fixture
    def consensus(self):
        return ObjectStoreConsensus(MemoryStore(), hint_every=4, min_age_s=0, fresh_s=0)


class TestS3Consensus(ConsensusTests):
    @pytest.fixture
    def consensus(self, s3_url):
        return ObjectStoreConsensus(open_store(s3_url), hint_every=4, min_age_s=0, fresh_s=0)


def test_head_does_not_list_and_uses_few_requests():
    store = CountingStore(MemoryStore())
    c = ObjectStoreConsensus(store, hint_every=16)
    for i in range(1, 200):
        assert c.compare_and_set("s", i - 1 or None, b"v")
    store.reset()
    assert c.head("s").seqno == 199
    counts = store.counts()
    assert counts["lists"] == 0
    assert counts["heads"] + counts["gets"] <= 16


def test_corrupt_hint_is_ignored_corrupt_floor_is_loud(tmp_path):
    store = LocalStore(tmp_path / "s")
    c = ObjectStoreConsensus(store, hint_every=2)
    for i in range(1, 10):
        c.compare_and_set("s", i - 1 or None, b"v%d" % i)
    store.put(c.prefix("s") + "hint", b"garbage")
    assert c.head("s").seqno == 9
    store.put(c.prefix("s") + "hint", encode_seqno_object(10**6))  # a hint past the head
    assert c.head("s").seqno == 9
    store.put(c.prefix("s") + "floor", b"\x01" * 12)
    with pytest.raises(FormatError):
        c.head("s")


@given(st.binary(max_size=24))
def test_seqno_object_fuzz(data):
    try:
        value = decode_seqno_object(data, "k")
    except FormatError:
        return
    assert encode_seqno_object(value) == data


@given(st.integers(0, (1 << 63) - 1))
def test_seqno_object_roundtrip(n):
    assert decode_seqno_object(encode_seqno_object(n), "k") == n


def test_fresh_writer_skips_the_floor_read_and_young_versions_survive_truncation():
    store = CountingStore(MemoryStore())
    c = ObjectStoreConsensus(store)  # defaults: min_age_s=600, fresh_s=60
    assert c.compare_and_set("s", None, b"v1")
    for i in range(2, 40):
        store.reset()
        assert c.compare_and_set("s", i - 1, b"v%d" % i)
        assert store.counts()["gets"] == 0  # it knew the head: no floor GET
    assert c.metrics()["floor_checks"] == 1  # only the very first write
    assert c.truncate("s", 30) == 0  # all versions are younger than min_age_s
    assert c.floor("s") == 30 and c.head("s").seqno == 39
    other = ObjectStoreConsensus(store)  # a writer that never saw the head checks the floor
    assert not other.compare_and_set("s", 5, b"stale")
    assert other.metrics()["floor_checks"] == 0  # (lost on AlreadyExists: v6 still exists)


class ConsensusModel(RuleBasedStateMachine):
    """Consensus vs a list model: CAS with right/stale/future expectations, truncation, scans."""

    def __init__(self):
        super().__init__()
        self.c = ObjectStoreConsensus(MemoryStore(), hint_every=3, min_age_s=0, fresh_s=0)
        self.versions: list[bytes] = []  # versions[i] = data of seqno i + 1
        self.floor = 1

    @rule(delta=st.integers(-3, 2), data=st.binary(max_size=8))
    def cas(self, delta, data):
        head = len(self.versions)
        expected = head + delta
        if expected < 0:
            return
        ok = self.c.compare_and_set("k", expected or None, data + b"#%d" % len(self.versions))
        assert ok == (expected == head)
        if ok:
            self.versions.append(data + b"#%d" % head)

    @precondition(lambda self: len(self.versions) > 1)
    @rule(data=st.data())
    def truncate(self, data):
        to = data.draw(st.integers(1, len(self.versions)))
        self.c.truncate("k", to)
        self.floor = max(self.floor, to)

    @rule(start=st.integers(0, 30), limit=st.integers(1, 5))
    def scan(self, start, limit):
        got = self.c.scan("k", start, limit)
        first = max(start, self.floor, 1)
        want = [(s, self.versions[s - 1]) for s in range(first, len(self.versions) + 1)][:limit]
        assert [(v.seqno, v.data) for v in got] == want

    @invariant()
    def head_matches(self):
        head = self.c.head("k")
        if not self.versions:
            assert head is None
        else:
            assert (head.seqno, head.data) == (len(self.versions), self.versions[-1])


ConsensusModel.TestCase.settings = settings(max_examples=30, stateful_step_count=20,
                                            deadline=None)
TestConsensusModel = ConsensusModel.TestCase
