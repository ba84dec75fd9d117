"""Errors of the spine package (all rooted at HeadraceError)."""

from __future__ import annotations

from headrace.errors import HeadraceError


class SpineError(HeadraceError):
    """A spine cannot continue: a background merge failed, or it is closed."""


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
