"""RetryPolicy: retries only retryable errors, within max attempts and max elapsed time, with
full-jitter backoff (uniform in [0, min(max_delay, base * 2**n)])."""

from __future__ import annotations

import random

import pytest

from headrace.codec import ManualClock
from headrace.errors import NotFound, RetryExhausted, StoreError
from headrace.retry import RetryPolicy, is_retryable


class Flaky:
    def __init__(self, failures: int, exc: Exception):
        self.failures = failures
        self.exc = exc
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "ok"


def _policy(**kw) -> RetryPolicy:
    kw.setdefault("clock", ManualClock())
    kw.setdefault("rng", random.Random(0))
    return RetryPolicy(**kw)


def test_retryable_errors_are_retried_until_success():
    fn = Flaky(3, StoreError("503", retryable=True))
    assert _policy(max_attempts=5).call(fn) == "ok"
    assert fn.calls == 4


def test_non_retryable_errors_are_raised_at_once():
    fn = Flaky(3, StoreError("403", retryable=False))
    with pytest.raises(StoreError, match="403"):
        _policy().call(fn)
    assert fn.calls == 1
    fn = Flaky(1, NotFound("k"))
    with pytest.raises(NotFound):
        _policy().call(fn)
    assert fn.calls == 1
    fn = Flaky(1, ValueError("bug"))
    with pytest.raises(ValueError):
        _policy().call(fn)
    assert fn.calls == 1


def test_max_attempts_then_retry_exhausted_with_the_last_error():
    err = StoreError("still down", retryable=True)
    fn = Flaky(100, err)
    with pytest.raises(RetryExhausted) as ei:
        _policy(max_attempts=4).call(fn, what="put of k")
    assert fn.calls == 4
    assert ei.value.attempts == 4
    assert ei.value.__cause__ is err
    assert "put of k" in str(ei.value) and "still down" in str(ei.value)


def test_max_elapsed_stops_retrying_on_the_injected_clock():
    clock = ManualClock()
    fn = Flaky(10**6, StoreError("slow", retryable=True))

    def slow():
        clock.advance(1.0)  # every attempt takes a second
        return fn()

    with pytest.raises(RetryExhausted) as ei:
        RetryPolicy(max_attempts=1000, base_delay_s=0, max_delay_s=0, max_elapsed_s=5.0,
                    clock=clock).call(slow)
    assert ei.value.attempts == 5
    assert clock.monotonic() == pytest.approx(5.0)


def test_backoff_never_sleeps_past_max_elapsed():
    clock = ManualClock()
    policy = RetryPolicy(max_attempts=100, base_delay_s=10.0, max_delay_s=100.0,
                         max_elapsed_s=3.0, clock=clock, rng=random.Random(3))
    fn = Flaky(10**6, StoreError("down", retryable=True))
    with pytest.raises(RetryExhausted):
        policy.call(fn)
    assert clock.monotonic() <= 3.0
    assert fn.calls >= 2


def test_backoff_sleeps_on_the_clock_within_full_jitter_bounds():
    clock = ManualClock()
    policy = RetryPolicy(max_attempts=8, base_delay_s=0.1, max_delay_s=1.0, max_elapsed_s=1e6,
                         clock=clock, rng=random.Random(1))
    fn = Flaky(7, StoreError("x", retryable=True))
    assert policy.call(fn) == "ok"
    caps = [min(1.0, 0.1 * 2**n) for n in range(7)]
    assert 0 < clock.monotonic() <= sum(caps)


def test_full_jitter_bounds_and_cap():
    policy = _policy(base_delay_s=0.01, max_delay_s=0.5, rng=random.Random(42))
    for attempt in range(1, 40):
        cap = min(0.5, 0.01 * 2 ** (attempt - 1))
        samples = [policy.backoff(attempt) for _ in range(200)]
        assert all(0.0 <= s <= cap for s in samples)
        # full jitter spreads over the whole range, not just near the cap
        assert min(samples) < cap * 0.1 and max(samples) > cap * 0.9


def test_delays_yields_attempt_numbers():
    assert list(_policy(max_attempts=3).delays()) == [1, 2, 3]


def test_custom_retry_if_for_cas_loops():
    fn = Flaky(2, KeyError("lost race"))
    assert _policy().call(fn, retry_if=lambda e: isinstance(e, KeyError)) == "ok"
    assert fn.calls == 3


def test_is_retryable():
    assert is_retryable(StoreError("x", retryable=True))
    assert not is_retryable(StoreError("x"))
    assert not is_retryable(RuntimeError("x"))


@pytest.mark.parametrize("bad", [dict(max_attempts=0), dict(base_delay_s=-1),
                                 dict(base_delay_s=2.0, max_delay_s=1.0), dict(max_elapsed_s=0)])
def test_bad_policies_are_refused(bad):
    with pytest.raises(ValueError):
        RetryPolicy(**bad)
