"""ULIDs: time-ordered unique names for immutable objects (batch files, parts)."""

from __future__ import annotations

from ulid import ULID

from headrace.codec.clock import Clock, SystemClock
from headrace.errors import FormatError

_CROCKFORD = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def new_ulid(clock: Clock | None = None) -> str:
    """A new ULID string whose timestamp comes from ``clock`` (the system clock by default)."""
    clock = clock or SystemClock()
    return str(ULID.from_timestamp(clock.now_ms() / 1000.0))


def is_ulid(text: str) -> bool:
    return len(text) == 26 and set(text.upper()) <= _CROCKFORD and text[0] in "01234567"


def parse_ulid(text: str, *, key: str | None = None) -> ULID:
    """Parse a ULID string, raising FormatError (naming ``key``) when it is not one."""
    if not isinstance(text, str) or not is_ulid(text):
        raise FormatError(key, None, f"not a ULID: {text!r}")
    return ULID.from_str(text.upper())


def ulid_timestamp_ms(text: str, *, key: str | None = None) -> int:
    """Milliseconds since the epoch encoded in a ULID string."""
    return int(parse_ulid(text, key=key).milliseconds)
