"""ReservoirOptions: Flowtide Reservoir's tunables with its defaults, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.errors import InvalidInput

MIB = 1 << 20
GIB = 1 << 30
MAX_FILE_SIZE_LIMIT = (1 << 32) - 1  # page offsets in a data file are u32


@dataclass(frozen=True)
class ReservoirOptions:
    """Tunables of a reservoir; the defaults are Flowtide Reservoir's.

    ``registry`` chooses where the checkpoint registry lives: ``"bundled"`` (inside every
    checkpoint; recovery needs one LIST), ``"file"`` (a separate registry object written after each
    checkpoint; recovery needs no LIST), ``"auto"`` (bundled when the store can list).
    """

    max_file_size: int = 64 * MIB
    snapshot_interval: int = 20
    # > 0: also snapshot once the files only older checkpoints still need (dead since the last
    # snapshot, kept for those checkpoints) reach this fraction of the live pages' bytes, and
    # outweigh what the snapshot itself writes: bounds the stored bytes of a writer whose
    # checkpoints replace most of the last ones' pages, at a bounded cost in snapshots
    snapshot_dead_ratio: float = 0.0
    compaction_ratio_threshold: float = 0.33
    max_cache_size_bytes: int = 10 * GIB
    cache_evict_from: float = 0.80
    download_workers: int = 2
    upload_workers: int = 2
    in_flight_capacity: int = 4
    pad_to_block: bool = False
    block_size: int = 4096
    keep_last_stream_versions: int = -1
    stream_version: str | None = None
    bundle: bool = True
    registry: str = "auto"
    direct_io: bool = False
    orphan_grace_s: float = 3600.0
    cache_wait_timeout_s: float = 60.0
    max_checkpoint_bytes: int = 256 * MIB  # ~6M pages; bounds what a hostile header can cost

    def __post_init__(self) -> None:
        def need(cond: bool, field: str, what: str) -> None:
            if not cond:
                raise InvalidInput(f"ReservoirOptions.{field} {what}, got {getattr(self, field)!r}")

        need(4096 <= self.max_file_size <= MAX_FILE_SIZE_LIMIT, "max_file_size",
             f"must be in [4096, {MAX_FILE_SIZE_LIMIT}]")
        need(self.snapshot_interval >= 1, "snapshot_interval", "must be >= 1")
        need(0.0 <= self.snapshot_dead_ratio, "snapshot_dead_ratio", "must be >= 0")
        need(0.0 <= self.compaction_ratio_threshold <= 1.0, "compaction_ratio_threshold",
             "must be in [0, 1]")
        need(self.max_cache_size_bytes > 0, "max_cache_size_bytes", "must be > 0")
        need(0.0 < self.cache_evict_from <= 1.0, "cache_evict_from", "must be in (0, 1]")
        need(self.download_workers >= 1, "download_workers", "must be >= 1")
        need(self.upload_workers >= 1, "upload_workers", "must be >= 1")
        need(self.in_flight_capacity >= 1, "in_flight_capacity", "must be >= 1")
        need(self.block_size in (512, 1024, 2048, 4096, 8192), "block_size",
             "must be a power of two in [512, 8192]")
        need(self.keep_last_stream_versions >= -1, "keep_last_stream_versions", "must be >= -1")
        need(self.stream_version is None or _is_name(self.stream_version), "stream_version",
             "must be None or a name of [A-Za-z0-9._-] (not starting with '.')")
        need(self.registry in ("auto", "bundled", "file"), "registry",
             "must be 'auto', 'bundled' or 'file'")
        need(self.orphan_grace_s >= 0, "orphan_grace_s", "must be >= 0")
        need(self.cache_wait_timeout_s > 0, "cache_wait_timeout_s", "must be > 0")
        need(self.max_checkpoint_bytes >= 4096, "max_checkpoint_bytes", "must be >= 4096")


def _is_name(s: object) -> bool:
    return (isinstance(s, str) and 0 < len(s) <= 128 and not s.startswith(".")
            and all(c.isalnum() or c in "._-" for c in s))


def check_stream_name(stream: object) -> str:
    """A stream name becomes a key segment: refuse anything that is not a plain name."""
    if not _is_name(stream):
        raise InvalidInput(f"stream must be a name of [A-Za-z0-9._-] (not starting with '.'), "
                           f"got {stream!r}")
    return stream  # type: ignore[return-value]
