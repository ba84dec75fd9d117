"""FaultyStore: every fault kind, reproducible from its seed, and the retry policy riding it out."""

from __future__ import annotations

import time

import pytest

from headrace.codec import ChecksumMismatch, ManualClock, crc32, verify_crc32
from headrace.errors import AlreadyExists, StoreError
from headrace.retry import RetryPolicy
from headrace.store import CREATE, FaultyStore, InjectedFault, MemoryStore


def _outcomes(store: FaultyStore, n: int) -> list[bool]:
    """True where the call failed."""
    out = []
    for i in range(n):
        try:
            store.put(f"k/{i}", b"v")
            out.append(False)
        except InjectedFault:
            out.append(True)
    return out


def test_fail_nth_calls_before_they_reach_the_store():
    inner = MemoryStore()
    store = FaultyStore(inner, fail_calls=[2, 4])
    assert _outcomes(store, 5) == [False, True, False, True, False]
    assert [m.key for m in inner.list("")] == ["k/0", "k/2", "k/4"]  # failed puts did not land
    assert store.injected["fail"] == 2


def test_injected_faults_are_retryable_store_errors():
    store = FaultyStore(MemoryStore(), fail_calls=[1])
    with pytest.raises(StoreError) as ei:
        store.get("x")
    assert isinstance(ei.value, InjectedFault)
    assert ei.value.retryable and ei.value.verb == "get"


def test_fail_rate_is_reproducible_from_the_seed():
    a = _outcomes(FaultyStore(MemoryStore(), seed=7, fail_rate=0.3), 400)
    b = _outcomes(FaultyStore(MemoryStore(), seed=7, fail_rate=0.3), 400)
    c = _outcomes(FaultyStore(MemoryStore(), seed=8, fail_rate=0.3), 400)
    assert a == b
    assert a != c
    assert 0.2 < sum(a) / len(a) < 0.4


def test_faults_limited_to_verbs_and_keys():
    store = FaultyStore(MemoryStore(), fail_rate=1.0, verbs=["put"],
                        keys=lambda k: k.startswith("bad/"))
    store.put("good/1", b"1")
    assert store.get("good/1").data == b"1"
    with pytest.raises(InjectedFault):
        store.put("bad/1", b"1")
    store.set_faults(fail_rate=1.0, verbs=["list"])
    store.put("bad/1", b"1")
    with pytest.raises(InjectedFault):
        store.list("")


def test_lost_reply_lands_the_write():
    inner = MemoryStore()
    store = FaultyStore(inner, lost_reply_rate=1.0)
    with pytest.raises(StoreError) as ei:
        store.put("k", b"landed", CREATE)
    assert ei.value.retryable
    assert inner.get("k").data == b"landed"
    # what a naive retry of a Create then meets: the caller must treat this as 'maybe mine'
    with pytest.raises(AlreadyExists):
        store.put("k", b"landed", CREATE)
    assert store.injected["lost_reply"] == 1  # the refused Create never reached the reply


def test_latency_is_added_to_every_call():
    store = FaultyStore(MemoryStore(), latency_s=0.03)
    t0 = time.perf_counter()
    store.put("a", b"1")
    store.get("a")
    assert time.perf_counter() - t0 >= 0.06


def test_flip_corrupts_exactly_one_byte_and_a_crc_catches_it():
    inner = MemoryStore()
    data = bytes(range(256)) * 8
    inner.put("obj", data)
    store = FaultyStore(inner, seed=3, corrupt_get="flip")
    got = store.get("obj").data
    assert len(got) == len(data)
    assert sum(x != y for x, y in zip(got, data, strict=True)) == 1
    with pytest.raises(ChecksumMismatch):
        verify_crc32(got, crc32(data), key="obj", offset=0, what="object")
    assert inner.get("obj").data == data  # the stored bytes are untouched


def test_truncate_returns_a_strict_prefix():
    inner = MemoryStore()
    data = b"abcdefghij" * 10
    inner.put("obj", data)
    store = FaultyStore(inner, seed=5, corrupt_get="truncate")
    got = store.get("obj").data
    assert len(got) < len(data) and data.startswith(got)
    got = store.get_range("obj", 10, 60)
    assert len(got) < 50 and data[10:60].startswith(got)


def test_corruption_limited_to_matching_keys_and_rate():
    inner = MemoryStore()
    for k in ("keep/1", "hit/1"):
        inner.put(k, b"0123456789")
    store = FaultyStore(inner, seed=1, corrupt_get="flip", corrupt_keys=lambda k: "hit" in k)
    assert store.get("keep/1").data == b"0123456789"
    assert store.get("hit/1").data != b"0123456789"
    store.set_faults(corrupt_get="flip", corrupt_rate=0.0)
    assert store.get("hit/1").data == b"0123456789"


def test_corruption_is_reproducible_from_the_seed():
    def run(seed: int) -> list[bytes]:
        inner = MemoryStore()
        inner.put("o", bytes(100))
        store = FaultyStore(inner, seed=seed, corrupt_get="flip", corrupt_rate=0.5)
        return [store.get("o").data for _ in range(20)]

    assert run(11) == run(11)
    assert run(11) != run(12)


@pytest.mark.parametrize("bad", [dict(corrupt_get="zero"), dict(fail_rate=1.5),
                                 dict(lost_reply_rate=-0.1), dict(verbs=["nope"])])
def test_bad_fault_plans_are_refused(bad):
    with pytest.raises(ValueError):
        FaultyStore(MemoryStore(), **bad)


def test_retry_policy_rides_out_injected_faults():
    inner = MemoryStore()
    store = FaultyStore(inner, seed=2, fail_rate=0.5)
    policy = RetryPolicy(max_attempts=50, clock=ManualClock())
    for i in range(50):
        policy.call(lambda i=i: store.put(f"r/{i}", b"x"))
    assert len(list(inner.list("r/"))) == 50
    assert store.injected["fail"] > 10
