"""The one retry policy: capped exponential backoff with full jitter.

Used for transient store errors (``retryable=True``) and, through :meth:`RetryPolicy.delays`,
for CAS loops that lost a race. Full jitter (sleep uniformly in [0, cap]) is what keeps many
contending writers from retrying in lock-step (AWS Architecture Blog, "Exponential Backoff And
Jitter").
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from headrace.codec.clock import Clock, SystemClock
from headrace.errors import RetryExhausted

T = TypeVar("T")
log = logging.getLogger("headrace.retry")


def is_retryable(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False))


@dataclass
class RetryPolicy:
    max_attempts: int = 10
    base_delay_s: float = 0.005
    max_delay_s: float = 1.0
    max_elapsed_s: float = 60.0
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")
        if self.max_elapsed_s <= 0:
            raise ValueError("max_elapsed_s must be > 0")

    def backoff(self, attempt: int) -> float:
        """Full-jitter delay before retry number ``attempt`` (1-based)."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** min(attempt - 1, 30)))
        return self.rng.uniform(0, cap)

    def delays(self) -> Iterator[int]:
        """Yield attempt numbers 1, 2, ... sleeping with backoff between them.

        Stops when attempts or elapsed time run out; the caller raises its own error then.
        """
        start = self.clock.monotonic()
        for attempt in range(1, self.max_attempts + 1):
            if attempt > 1:
                left = self.max_elapsed_s - (self.clock.monotonic() - start)
                if left <= 0:
                    return
                self.clock.sleep(min(self.backoff(attempt - 1), left))  # never past the deadline
            yield attempt

    def call(
        self,
        fn: Callable[[], T],
        *,
        retry_if: Callable[[BaseException], bool] = is_retryable,
        what: str = "operation",
    ) -> T:
        """Run ``fn`` until it succeeds or fails with an error ``retry_if`` rejects."""
        last: BaseException | None = None
        attempts = 0
        for attempts in self.delays():
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - filtered by retry_if
                if not retry_if(e):
                    raise
                last = e
                log.debug("%s failed (attempt %d), retrying: %s", what, attempts, e)
        raise RetryExhausted(f"{what} failed after {attempts} attempts: {last}", attempts) from last


DEFAULT_RETRY = RetryPolicy()
