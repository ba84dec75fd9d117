"""Value types and errors shared by the buffer's producer, consumer and queue."""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.errors import HeadraceError


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
    """A batch as the consumer hands it out."""

    entries: list[bytes]
    sequence: int
    location: str
    metadata: list[Metadata] = field(default_factory=list)

