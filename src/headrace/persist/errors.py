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
    """A read at ``as_of`` below the shard's since: those times have been compacted away."""

    def __init__(self, shard: str, as_of: int, since: int):
        super().__init__(f"shard {shard!r}: as_of {as_of} is below since {since}")
        self.shard, self.as_of, self.since = shard, as_of, since


class SnapshotTimeout(HeadraceError, TimeoutError):
    """snapshot(as_of) waited for the upper to pass as_of and gave up."""


class LeaseExpired(HeadraceError):
    """A leased reader's lease ran out (or it was expired): its since no longer holds."""


class TokenMismatch(HeadraceError):
    """compare_and_downgrade_since on a critical reader lost: the opaque token differs."""

    def __init__(self, reader_id: str, expected: str, current: str | None):
        super().__init__(f"critical reader {reader_id!r}: token is {current!r}, not {expected!r}")
        self.reader_id, self.expected, self.current = reader_id, expected, current


class ConsensusContended(HeadraceError):
    """A state update lost its compare-and-set too many times in a row."""

    retryable = True
