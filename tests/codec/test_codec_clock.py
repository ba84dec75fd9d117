"""Clocks: ManualClock moves only when told (sleep advances it); SystemClock follows real time."""

from __future__ import annotations

import threading
import time

from headrace.codec import Clock, ManualClock, SystemClock


def test_manual_clock_moves_only_when_told():
    c = ManualClock(start_ms=1000)
    assert (c.now_ms(), c.monotonic()) == (1000, 0.0)
    time.sleep(0.01)
    assert c.now_ms() == 1000
    c.advance(1.5)
    assert (c.now_ms(), c.monotonic()) == (2500, 1.5)


def test_manual_sleep_advances_instead_of_waiting():
    c = ManualClock(start_ms=0)
    t0 = time.perf_counter()
    c.sleep(3600)
    assert time.perf_counter() - t0 < 1.0
    assert c.now_ms() == 3_600_000 and c.monotonic() == 3600
    c.sleep(0)
    c.sleep(-1)
    assert c.now_ms() == 3_600_000


def test_manual_clock_is_thread_safe():
    c = ManualClock(start_ms=0)
    threads = [threading.Thread(target=lambda: [c.advance(0.001) for _ in range(1000)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.now_ms() == 4000


def test_system_clock_follows_real_time():
    c: Clock = SystemClock()
    assert abs(c.now_ms() - time.time() * 1000) < 1000
    m0 = c.monotonic()
    c.sleep(0.02)
    assert c.monotonic() - m0 >= 0.02
