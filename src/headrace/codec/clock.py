"""Injectable time, so behaviour that depends on time (flush timers, TTLs, leases) is testable."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds from a monotonic source, for measuring intervals."""

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to; ``sleep`` advances it instead of waiting."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self._ms = start_ms
        self._mono = 0.0
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._ms

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._ms += int(seconds * 1000)
            self._mono += seconds

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)
