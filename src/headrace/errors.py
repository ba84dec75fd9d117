"""One error hierarchy for all of headrace.

Every error a caller can see derives from :class:`HeadraceError`; where a builtin already names
the situation (a missing object, a bad value) the class also inherits it, so
``except FileNotFoundError`` keeps working for code that does not know headrace.
``retryable`` tells the shared retry policy whether trying again can help.
"""

from __future__ import annotations


class HeadraceError(Exception):
    """Base of every headrace error."""

    retryable: bool = False


class StoreError(HeadraceError):
    """An object-store call failed; ``retryable`` says whether a retry may succeed."""

    def __init__(self, message: str, *, key: str | None = None, retryable: bool = False):
        super().__init__(message)
        self.key = key
        self.retryable = retryable


class NotFound(StoreError, FileNotFoundError):
    """The object does not exist."""

    def __init__(self, key: str):
        super().__init__(f"object not found: {key!r}", key=key)

    def __str__(self) -> str:  # FileNotFoundError would otherwise format errno/filename
        return f"object not found: {self.key!r}"


class AlreadyExists(StoreError, FileExistsError):
    """A put with mode Create lost: the object already exists."""

    def __init__(self, key: str):
        super().__init__(f"object already exists: {key!r}", key=key)

    def __str__(self) -> str:
        return f"object already exists: {self.key!r}"


class PreconditionFailed(StoreError):
    """A put with mode IfMatch lost: the object changed (or vanished) since its etag was read."""

    def __init__(self, key: str, expected_etag: str | None = None):
        super().__init__(
            f"precondition failed for {key!r}: etag is no longer {expected_etag!r}", key=key
        )
        self.expected_etag = expected_etag


class InvalidKey(HeadraceError, ValueError):
    """An object key that could escape the store root or is otherwise malformed."""

    def __init__(self, key: object, reason: str):
        super().__init__(f"invalid object key {key!r}: {reason}")
        self.key = key
        self.reason = reason


class MissingDependency(HeadraceError, ImportError):
    """An optional dependency needed for the requested backend is not installed."""


class InvalidInput(HeadraceError, ValueError):
    """A caller passed a value that cannot be accepted (e.g. an empty batch)."""


class FormatError(HeadraceError, ValueError):
    """Bytes that do not decode: names the object, the byte offset and what was wrong."""

    def __init__(self, key: str | None, offset: int | None, what: str):
        where = f"{key!r}" if key is not None else "<bytes>"
        at = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"bad format in {where}{at}: {what}")
        self.key = key
        self.offset = offset
        self.what = what


class ChecksumMismatch(FormatError):
    """A CRC over stored bytes does not match: the bytes are corrupt."""

    def __init__(
        self,
        key: str | None,
        offset: int | None,
        what: str,
        *,
        expected: int | None = None,
        actual: int | None = None,
    ):
        detail = what
        if expected is not None and actual is not None:
            detail = f"{what} (expected {expected:#x}, got {actual:#x})"
        super().__init__(key, offset, detail)
        self.expected = expected
        self.actual = actual


class RetryExhausted(HeadraceError):
    """The retry policy gave up; ``__cause__`` is the last error."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


class StoreTimeout(StoreError, TimeoutError):
    """A remote store did not answer within the configured timeout (``?timeout=``,
    ``?connect_timeout=`` in the store URL). Retryable: the request may pass later."""

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(message, key=key, retryable=True)

    def __str__(self) -> str:  # TimeoutError would otherwise format errno/strerror
        return self.args[0]


class CredentialsMissing(StoreError, PermissionError):
    """No credentials for a remote store: says which environment variables or URL parameters
    to set, and never shows a secret."""

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(message, key=key, retryable=False)

    def __str__(self) -> str:
        return self.args[0]
