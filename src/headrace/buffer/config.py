"""Producer and consumer configuration, defaulted as RFC 0001 does and validated on creation."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.buffer.batch_format import COMPRESSIONS, DEFAULT_MAX_BLOCK_BYTES
from headrace.retry import RetryPolicy
from headrace.store import ObjectStore, open_store, validate_key

DEFAULT_DATA_PREFIX = "ingest"
DEFAULT_MANIFEST_PATH = "ingest/manifest"


def _check_store(url: str | None, store: ObjectStore | None) -> None:
    if (url is None) == (store is None):
        raise ValueError("url: give exactly one of url= or store=")
    if url is not None and (not isinstance(url, str) or not url):
        raise ValueError(f"url: must be a non-empty string, got {url!r}")
    if store is not None and not isinstance(store, ObjectStore):
        raise ValueError(f"store: must be an ObjectStore, got {type(store).__name__}")


def _check_key(name: str, value: str) -> None:
    try:
        validate_key(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from e


@dataclass
class ProducerConfig:
    url: str | None = None
    store: ObjectStore | None = None
    data_path_prefix: str = DEFAULT_DATA_PREFIX
    manifest_path: str = DEFAULT_MANIFEST_PATH
    flush_interval_s: float = 0.1
    flush_size_bytes: int = 64 * 1024 * 1024
    max_buffered_inputs: int = 1000
    batch_compression: str = "none"  # "none" | "zstd"
    retry: RetryPolicy | None = None  # transient store errors on batch uploads
    cas_retry: RetryPolicy | None = None  # manifest compare-and-set loop

    def __post_init__(self) -> None:
        _check_store(self.url, self.store)
        _check_key("data_path_prefix", self.data_path_prefix)
        _check_key("manifest_path", self.manifest_path)
        if not self.flush_interval_s > 0:
            raise ValueError("flush_interval_s: must be > 0")
        if self.flush_size_bytes < 1:
            raise ValueError("flush_size_bytes: must be >= 1")
        if self.max_buffered_inputs < 1:
            raise ValueError("max_buffered_inputs: must be >= 1")
        if self.batch_compression not in COMPRESSIONS:
            raise ValueError(f"batch_compression: must be one of {sorted(COMPRESSIONS)}, "
                             f"got {self.batch_compression!r}")

    def open_store(self) -> ObjectStore:
        return self.store if self.store is not None else open_store(self.url)


@dataclass
class ConsumerConfig:
    url: str | None = None
    store: ObjectStore | None = None
    manifest_path: str = DEFAULT_MANIFEST_PATH
    data_path_prefix: str = DEFAULT_DATA_PREFIX
    gc_interval_s: float = 300.0  # 0 turns the consumer's background collector off
    gc_grace_period_s: float = 600.0
    acks_per_dequeue: int = 100
    max_batch_bytes: int = DEFAULT_MAX_BLOCK_BYTES  # decompression bound per batch
    retry: RetryPolicy | None = None
    cas_retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        _check_store(self.url, self.store)
        _check_key("manifest_path", self.manifest_path)
        _check_key("data_path_prefix", self.data_path_prefix)
        if self.gc_interval_s < 0:
            raise ValueError("gc_interval_s: must be >= 0 (0 = no background GC)")
        if self.gc_grace_period_s < 0:
            raise ValueError("gc_grace_period_s: must be >= 0")
        if self.acks_per_dequeue < 1:
            raise ValueError("acks_per_dequeue: must be >= 1")
        if self.max_batch_bytes < 1:
            raise ValueError("max_batch_bytes: must be >= 1")

    def open_store(self) -> ObjectStore:
        return self.store if self.store is not None else open_store(self.url)
