"""Value types and errors shared by the buffer's producer, consumer and queue."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from headrace.buffer.batch_format import DecodedBlock
from headrace.errors import HeadraceError, InvalidInput, NotFound

_SKIP_HINT = "`headrace queue skip` (or headrace.buffer.skip_batch) records a skip of it"


class Fenced(HeadraceError):
    """A newer consumer bumped the manifest epoch: this consumer may no longer touch the queue."""

    def __init__(self, manifest_path: str, own_epoch: int, current_epoch: int):
        super().__init__(
            f"consumer fenced on {manifest_path!r}: its epoch is {own_epoch}, "
            f"the manifest's is now {current_epoch}"
        )
        self.manifest_path = manifest_path
        self.own_epoch = own_epoch
        self.current_epoch = current_epoch


class OutOfOrderAck(HeadraceError):
    """An ack that is not the sequence right after the last acknowledged one."""

    def __init__(self, sequence: int, expected: int | None, why: str = ""):
        exp = "nothing (no entry is acknowledgeable)" if expected is None else str(expected)
        super().__init__(f"out-of-order ack of sequence {sequence}: expected {exp}"
                         + (f" ({why})" if why else ""))
        self.sequence = sequence
        self.expected = expected


class MissingBatch(NotFound):
    """A queue entry whose batch file is gone: the consumer stays at it until it is skipped.

    Also a ``NotFound`` (and ``FileNotFoundError``): code that caught the raw store error keeps
    working, but this one names the entry. ``hint`` is what the CLI prints after it.
    """

    hint = ("restore the batch file if a copy exists; otherwise the skip is the way past it, "
            "recorded for audit")

    def __init__(self, manifest_path: str, sequence: int, location: str):
        super().__init__(location)
        self.manifest_path = manifest_path
        self.sequence = sequence
        self.location = location

    def __str__(self) -> str:
        return (f"queue {self.manifest_path!r}: the batch of sequence {self.sequence} at "
                f"{self.location!r} is missing; {_SKIP_HINT}")


class InvalidLocation(InvalidInput):
    """A queue entry whose location is not a key under the queue's data prefix (or any key):
    reading it would read (or escape to) objects that are not this queue's batches."""

    def __init__(self, manifest_path: str, sequence: int, location: str, why: str):
        super().__init__(f"queue {manifest_path!r}: sequence {sequence} has location "
                         f"{location!r}, refused: {why}; {_SKIP_HINT}")
        self.manifest_path = manifest_path
        self.sequence = sequence
        self.location = location
        self.why = why


class StaleBatch(HeadraceError):
    """An append refused because its batch file is old enough for the collector to have taken
    it: the producer uploads the batch again under a fresh name instead."""

    def __init__(self, location: str, age_ms: int, window_ms: int):
        super().__init__(f"batch {location!r} is {age_ms} ms old, past the {window_ms} ms "
                         "append window (half the collector's grace period): not appended")
        self.location = location
        self.age_ms = age_ms
        self.window_ms = window_ms


@dataclass(frozen=True)
class SkipRecord:
    """One recorded skip of an unreadable batch (the audit trail of ``headrace queue skip``).

    ``cause`` is ``missing``, ``unreadable`` (does not decode) or ``invalid_location``.
    """

    sequence: int
    location: str
    cause: str
    reason: str
    skipped_at_ms: int
    actor: str
    detail: str = ""


@dataclass(frozen=True)
class Metadata:
    """Per-range metadata of a batch: records from ``start_index`` up to the next item's."""

    start_index: int
    ingestion_time_ms: int
    payload: bytes = b""


@dataclass(frozen=True)
class ManifestEntry:
    """One queue entry: a batch location, its sequence and its metadata ranges."""

    sequence: int
    location: str
    metadata: tuple[Metadata, ...] = ()


@dataclass(frozen=True)
class ConsumedBatch:
    """A batch as the consumer hands it out.

    ``records`` holds the entries in place (one buffer plus offsets): ``records.view(i)``,
    ``records.fixed_width()`` and ``records.entry_array()`` read them without a copy per entry.
    ``entries`` is the same records as a list of ``bytes``, built on first use.
    """

    records: DecodedBlock
    sequence: int
    location: str
    metadata: list[Metadata] = field(default_factory=list)
    skipped: SkipRecord | None = None  # set (and records empty) for a recorded skip

    @cached_property
    def entries(self) -> list[bytes]:
        return self.records.entries()

