"""Configuration of backup and restore, validated on construction (ValueError names the field)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.retry import RetryPolicy

DAY_MS = 86_400_000

# files that never change once written: compared by name + size, not re-uploaded
DEFAULT_IMMUTABLE_PATTERNS = ("*.sst", "*.blob", "*.batch", "*.arrow", "*.parquet")




@dataclass
class BackupConfig:
    """How snapshots are cut, uploaded and expired."""

    chunk_size: int = 16 << 20  # large files become several blobs of this size
    # files smaller than this are packed, several to one blob of up to chunk_size (0: never);
    # saves a PUT (and on the local store an fsync) per small file. None: min(256 KiB, chunk_size)
    pack_below: int | None = None
    upload_workers: int = 4
    download_workers: int = 4
    ttl_ms: int = 30 * DAY_MS  # blobs of an uncommitted snapshot expire after this (seed: 30 d)
    immutable_patterns: tuple[str, ...] = DEFAULT_IMMUTABLE_PATTERNS
    # immutable files at most this big are also read and compared by content hash + crc32
    # (catches rewrites; the names predate the content hash)
    crc_compare_below: int = 1 << 20
    verify_immutable_crc: bool = False  # compare every immutable file by content too
    # how restore decides a local file already equals the snapshot's: "content" reads it and
    # compares size + content hash (BLAKE3 over chunk digests) + crc32 (safe; "crc" is the old
    # name of the same check, kept as an alias); "mtime" compares size + mtime in ms (no read:
    # rsync's default check)
    affinity_check: str = "content"
    job_name: str = ""
    job_instance: str = ""
    task_name: str = ""
    store_name: str = ""
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_size, int) or not 4096 <= self.chunk_size <= 1 << 30:
            raise ValueError(f"chunk_size must be an int in [4096, 2**30], got {self.chunk_size!r}")
        if self.pack_below is None:
            self.pack_below = min(256 << 10, self.chunk_size)
        if not isinstance(self.pack_below, int) or not 0 <= self.pack_below <= self.chunk_size:
            raise ValueError(f"pack_below must be an int in [0, chunk_size], got "
                             f"{self.pack_below!r}")
        for name in ("upload_workers", "download_workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 1 <= v <= 256:
                raise ValueError(f"{name} must be an int in [1, 256], got {v!r}")
        if not isinstance(self.ttl_ms, int) or self.ttl_ms < 1:
            raise ValueError(f"ttl_ms must be a positive int, got {self.ttl_ms!r}")
        if isinstance(self.immutable_patterns, str) or not all(
                isinstance(p, str) and p for p in self.immutable_patterns):
            raise ValueError("immutable_patterns must be a tuple of non-empty glob strings")
        self.immutable_patterns = tuple(self.immutable_patterns)
        if not isinstance(self.crc_compare_below, int) or self.crc_compare_below < 0:
            raise ValueError(f"crc_compare_below must be an int >= 0, got "
                             f"{self.crc_compare_below!r}")
        if self.affinity_check == "crc":
            self.affinity_check = "content"
        if self.affinity_check not in ("content", "mtime"):
            raise ValueError(f"affinity_check must be 'content' or 'mtime', got "
                             f"{self.affinity_check!r}")
        for name in ("job_name", "job_instance", "task_name", "store_name"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a str")
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError("retry must be a RetryPolicy")
