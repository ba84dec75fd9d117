"""The one retry policy: capped exponential backoff with full jitter.

Used for transient store errors (``retryable=True``) and, through :meth:`RetryPolicy.delays`,
for CAS loops that lost a race. Full jitter (sleep uniformly in [0, cap]) is what keeps many
contending writers from retrying in lock-step (AWS Architecture Blog, "Exponential Backoff And
Jitter").
"""

from __future__ import annotations

import errno
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from headrace.codec.clock import Clock, SystemClock
from headrace.errors import InvalidInput, RetryExhausted

T = TypeVar("T")
log = logging.getLogger("headrace.retry")


#: OS errors on a local write that may pass: space or quota freed by a gc or another process,
#: an I/O error of a flaky device or network file system, an interrupted or busy call. Anything
#: else (read-only file system, permissions, a bad path) will fail the same way again.
TRANSIENT_OS_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN,
                                 errno.EINTR, errno.EBUSY, errno.ETIMEDOUT, errno.ENOMEM})


def is_retryable(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False))


def is_transient_os_error(exc: BaseException) -> bool:
    """An OSError whose errno is in TRANSIENT_OS_ERRNOS (for retrying local disk writes)."""
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_OS_ERRNOS


@dataclass
class RetryPolicy:
    max_attempts: int = 10
    base_delay_s: float = 0.005
    max_delay_s: float = 1.0
    max_elapsed_s: float = 60.0
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or self.max_attempts < 1:
            raise InvalidInput(f"RetryPolicy.max_attempts must be an int >= 1, got "
                               f"{self.max_attempts!r}")
        if not 0 <= self.base_delay_s <= self.max_delay_s:
            raise InvalidInput(f"RetryPolicy needs 0 <= base_delay_s <= max_delay_s, got "
                               f"{self.base_delay_s!r} and {self.max_delay_s!r}")
        if not self.max_elapsed_s > 0:
            raise InvalidInput(f"RetryPolicy.max_elapsed_s must be > 0, got "
                               f"{self.max_elapsed_s!r}")

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
