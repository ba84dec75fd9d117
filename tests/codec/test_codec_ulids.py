"""ULID helpers: time from the injected clock, sortable names, strict parsing."""

from __future__ import annotations

import pytest

from headrace.codec import (
    FormatError,
    ManualClock,
    is_ulid,
    new_ulid,
    parse_ulid,
    ulid_timestamp_ms,
)


def test_new_ulid_carries_the_clock_time():
    clock = ManualClock(start_ms=1_700_000_123_456)
    u = new_ulid(clock)
    assert is_ulid(u)
    assert ulid_timestamp_ms(u) == 1_700_000_123_456


def test_ulids_sort_by_time():
    clock = ManualClock()
    names = []
    for _ in range(50):
        names.append(new_ulid(clock))
        clock.advance(0.001)
    assert sorted(names) == names
    assert len(set(names)) == 50


def test_ulids_are_unique_within_one_millisecond():
    clock = ManualClock()
    assert len({new_ulid(clock) for _ in range(1000)}) == 1000


def test_system_clock_ulid_is_recent():
    import time

    assert abs(ulid_timestamp_ms(new_ulid()) - time.time() * 1000) < 60_000


def test_lowercase_is_accepted():
    u = new_ulid(ManualClock())
    assert parse_ulid(u.lower()) == parse_ulid(u)


@pytest.mark.parametrize("bad", ["", "short", "01ARZ3NDEKTSV4RRFFQ69G5FAVX",  # 27 chars
                                 "01ARZ3NDEKTSV4RRFFQ69G5FAU".replace("U", "I"),  # not Crockford
                                 "81ARZ3NDEKTSV4RRFFQ69G5FAV",  # first char > 7: overflows 128 bits
                                 "01ARZ3NDEKTSV4RRFFQ69G5FA-"])
def test_invalid_ulids_are_refused_with_the_key(bad):
    assert not is_ulid(bad)
    with pytest.raises(FormatError) as ei:
        parse_ulid(bad, key="data/x.batch")
    assert ei.value.key == "data/x.batch"


def test_non_string_is_refused():
    with pytest.raises(FormatError):
        parse_ulid(12345)  # type: ignore[arg-type]
