"""Errors of headrace.persist. A mismatch (someone else moved the frontier) is not a bad request."""

from __future__ import annotations

from headrace.errors import HeadraceError, InvalidInput


class UpperMismatch(HeadraceError):
    """compare_and_append lost: the shard's upper is ``current``, not ``expected``.

    ``current`` is None when the shard is finished (its upper is the empty frontier).
    """

    def __init__(self, expected: int, current: int | None, shard: str = ""):
        super().__init__(f"upper mismatch on shard {shard!r}: expected {expected}, "
                         f"current {current if current is not None else 'finished (empty)'}")
        self.expected = expected
        self.current = current
        self.shard = shard


class InvalidBounds(InvalidInput):
    """The bounds of an append are malformed, or an update's time lies outside them."""


class SinceViolation(HeadraceError):
    """A read that needs times from ``as_of`` on, but the shard's since has passed it: those times
    may have been compacted away, so the read is refused rather than answered wrongly."""

    def __init__(self, shard: str, as_of: int, since: int, why: str = ""):
        super().__init__(f"shard {shard!r}: as_of {as_of} is below since {since}"
                         + (f" ({why})" if why else ""))
        self.shard, self.as_of, self.since = shard, as_of, since


class DefinitenessViolation(HeadraceError):
    """Different data for times the shard already holds (Materialize's persist: writers of a
    shard must be definite). A replay of the same updates is not this; ``differing`` counts the
    (row, time) groups whose diffs disagree."""

    def __init__(self, shard: str, lower: int, upper: int | None, differing: int,
                 detail: str = ""):
        hi = "∞" if upper is None else upper
        super().__init__(f"shard {shard!r}: times [{lower}, {hi}) were already written with "
                         f"different updates ({differing} (row, time) groups differ)"
                         + (f": {detail}" if detail else ""))
        self.shard, self.lower, self.upper, self.differing = shard, lower, upper, differing


class SnapshotTimeout(HeadraceError, TimeoutError):
    """snapshot(as_of) waited for the upper to pass as_of and gave up."""


class LeaseExpired(HeadraceError):
    """A lease ran out (or was released): a leased reader's since no longer holds, or a writer
    is no longer registered (its unlinked parts may be swept, so it may not link them)."""


class TokenMismatch(HeadraceError):
    """compare_and_downgrade_since on a critical reader lost: the opaque token differs."""

    def __init__(self, reader_id: str, expected: str, current: str | None):
        super().__init__(f"critical reader {reader_id!r}: token is {current!r}, not {expected!r}")
        self.reader_id, self.expected, self.current = reader_id, expected, current


class ConsensusContended(HeadraceError):
    """A state update lost its compare-and-set too many times in a row."""

    retryable = True
