"""Errors of backup and restore that name what a user mistyped or must decide."""

from __future__ import annotations

from headrace.errors import HeadraceError, NotFound


class BackupNotFound(NotFound):
    """A snapshot, a backup prefix or a store path that does not exist (a FileNotFoundError)."""

    def __init__(self, key: str, message: str):
        super().__init__(key)
        self.message = message

    def __str__(self) -> str:
        return self.message


class RestoreTargetNotEmpty(HeadraceError, FileExistsError):
    """Restore would replace a directory holding data it did not put there.

    A restore replaces its target wholesale; a non-empty target is replaced only when it is a
    previous restore of the same backup (or already equals the snapshot), else only with
    ``force=True`` (``--force``)."""

    def __init__(self, target: str, why: str):
        super().__init__(f"restore target {target!r} {why}; nothing was changed (pass "
                         f"force=True / --force to replace it)")
        self.target = target
        self.hint = "pass --force to replace it, or restore into an empty or new folder"

    def __str__(self) -> str:
        return str(self.args[0])
