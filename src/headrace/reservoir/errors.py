"""Every error the reservoir raises, in one module under :class:`headrace.HeadraceError` (each
also inheriting the builtin it stands for where one fits)."""

from __future__ import annotations

from headrace.errors import HeadraceError, NotFound


class PageNotFound(HeadraceError, KeyError):
    """The page id has no committed data (never written, or deleted)."""

    def __init__(self, page_id: int, version: int | None = None):
        at = f" as of checkpoint {version}" if version is not None else ""
        super().__init__(f"page {page_id} not found{at}")
        self.page_id = page_id

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class ConcurrentWriter(HeadraceError):
    """Another writer of the stream committed first: this writer is fenced (nothing it wrote is
    visible); ``reset()`` drops its uncheckpointed work and reloads the winner's checkpoint."""


class ReservoirFailed(HeadraceError):
    """A background upload failed: uncheckpointed state was dropped; call reset() or reopen."""


class CommitUnknown(ReservoirFailed):
    """A checkpoint's commit reply was lost and reading it back failed too: it may or may not
    have landed. ``reset()`` reloads what is committed (and so learns which)."""


class CacheTooSmall(HeadraceError, ValueError):
    """The local cache cannot hold one data file (max_cache_size_bytes < max_file_size)."""


class CacheFull(HeadraceError):
    """The local cache could not free space for a download within the wait timeout."""


class CheckpointNotFound(NotFound):
    """The requested checkpoint version is not (or no longer) retained."""

    def __init__(self, key: str, version: int):
        super().__init__(key)
        self.version = version

    def __str__(self) -> str:
        return f"checkpoint {self.version} not found or no longer retained ({self.key!r})"
