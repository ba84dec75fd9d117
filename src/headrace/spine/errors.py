"""Errors of the spine package (all rooted at HeadraceError)."""

from __future__ import annotations

from headrace.errors import HeadraceError


class SpineError(HeadraceError):
    """A spine cannot continue: a background merge failed, or it is closed."""


class SpineWriteError(SpineError, OSError):
    """Writing a spine file failed for good (a permanent error, or a transient one that outlived
    the retries). Names the file and keeps the errno; what was committed before is intact."""

    def __init__(self, path: str, cause: OSError, attempts: int):
        reason = cause.strerror or str(cause) or type(cause).__name__
        message = (f"cannot write spine file {path!r}: {reason} (errno {cause.errno}, "
                   f"{attempts} attempt{'s' if attempts != 1 else ''})")
        super().__init__(message)
        self.errno = cause.errno
        self.strerror = cause.strerror
        self.filename = path
        self.path = path
        self.attempts = attempts
        self.message = message

    def __str__(self) -> str:  # OSError would otherwise format errno/strerror itself
        return self.message


class StorageLocked(HeadraceError):
    """Another process (or another open in this one) holds the storage directory."""


class FingerprintMismatch(HeadraceError):
    """The checkpoint was taken by a different operator graph than the one resuming it."""

    def __init__(self, checkpoint: str, stored: str, given: str):
        super().__init__(f"checkpoint {checkpoint} was written by circuit fingerprint "
                         f"{stored!r}, refusing to resume it as {given!r}")
        self.checkpoint = checkpoint
        self.stored = stored
        self.given = given


class CheckpointNotFound(HeadraceError, LookupError):
    """The requested checkpoint id is not in the catalog."""
