"""Which locations a queue entry may name: a valid object key under the queue's data prefix.

A location is read by every reader of the queue, so one hostile entry (``../../etc/passwd``,
an absolute path, another tenant's object) would poison all of them: it is refused when it is
enqueued (``InvalidInput``) and again by each reader (``InvalidLocation``, naming the entry),
since a manifest may have been written by older code or by hand.
"""

from __future__ import annotations

from headrace.buffer.types import InvalidLocation, ManifestEntry
from headrace.errors import InvalidInput, InvalidKey
from headrace.store import validate_key


def location_problem(location: object, data_path_prefix: str | None) -> str | None:
    """Why ``location`` cannot be a batch of the queue (None if it can).

    ``data_path_prefix=None`` checks only that it is a safe object key (for read-only helpers
    that do not know the queue's prefix).
    """
    if not isinstance(location, str):
        return f"locations are str, not {type(location).__name__}"
    try:
        validate_key(location)
    except InvalidKey as e:
        return e.reason
    except UnicodeError:
        return "not encodable as UTF-8"
    if data_path_prefix is not None:
        head = data_path_prefix.rstrip("/") + "/"
        if not location.startswith(head):
            return f"not under the queue's data prefix {head!r}"
    return None


def check_enqueue_location(location: object, data_path_prefix: str) -> str:
    """``location`` if a producer may enqueue it, else ``InvalidInput`` naming it."""
    why = location_problem(location, data_path_prefix)
    if why is not None:
        raise InvalidInput(f"cannot enqueue location {location!r}: {why}")
    return location  # type: ignore[return-value]


def check_entry_location(manifest_path: str, entry: ManifestEntry,
                         data_path_prefix: str | None) -> None:
    """Raise ``InvalidLocation`` (naming sequence and location) for an entry no reader may read."""
    why = location_problem(entry.location, data_path_prefix)
    if why is not None:
        raise InvalidLocation(manifest_path, entry.sequence, entry.location, why)
