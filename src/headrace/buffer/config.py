"""Producer and consumer configuration, defaulted as RFC 0001 does and validated on creation.

Every refusal is ``InvalidInput`` naming the field, checked for type as well as range (a string
where a number belongs is refused here, not as a TypeError deep in a thread).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headrace.buffer.batch_format import COMPRESSIONS, DEFAULT_MAX_BLOCK_BYTES
from headrace.errors import InvalidInput, InvalidKey
from headrace.retry import RetryPolicy
from headrace.store import ObjectStore, open_store, validate_key

DEFAULT_DATA_PREFIX = "ingest"
DEFAULT_MANIFEST_PATH = "ingest/manifest"


def check_number(name: str, value: object, minimum: float, *, above: bool = False,
                 integer: bool = False) -> None:
    """``value`` must be a finite number (an int if ``integer``) >= ``minimum`` (> if ``above``)."""
    kinds = (int,) if integer else (int, float)
    if (isinstance(value, bool) or not isinstance(value, kinds)
            or (isinstance(value, float) and not math.isfinite(value))):
        kind = "an integer" if integer else "a finite number"
        raise InvalidInput(f"{name}: must be {kind}, got {value!r}")
    if value < minimum or (above and value == minimum):
        raise InvalidInput(f"{name}: must be {'>' if above else '>='} {minimum}, got {value!r}")


def _check_store(url: object, store: object) -> None:
    if (url is None) == (store is None):
        raise InvalidInput("url: give exactly one of url= or store=")
    if url is not None and (not isinstance(url, str) or not url):
        raise InvalidInput(f"url: must be a non-empty string, got {url!r}")
    if store is not None and not isinstance(store, ObjectStore):
        raise InvalidInput(f"store: must be an ObjectStore, got {type(store).__name__}")


def _check_key(name: str, value: object) -> None:
    try:
        validate_key(value)
    except InvalidKey as e:
        raise InvalidInput(f"{name}: {e}") from e
    except UnicodeError as e:
        raise InvalidInput(f"{name}: {value!r} is not encodable as UTF-8") from e


def _check_policy(name: str, value: object) -> None:
    if value is not None and not isinstance(value, RetryPolicy):
        raise InvalidInput(f"{name}: must be a RetryPolicy or None, got {type(value).__name__}")


@dataclass
class ProducerConfig:
    url: str | None = None
    store: ObjectStore | None = None
    data_path_prefix: str = DEFAULT_DATA_PREFIX
    manifest_path: str = DEFAULT_MANIFEST_PATH
    flush_interval_s: float = 0.1
    # a batch is cut once its entries (+ 4-byte length prefixes) *exceed* this, not at exactly
    # this size: a loose limit, as RFC 0001 has it (the produce call that crosses it stays whole)
    flush_size_bytes: int = 64 * 1024 * 1024
    max_buffered_inputs: int = 1000
    # "zstd" (level 3): the frame's content checksum catches a damaged batch. "none" is RFC 0001's
    # uncompressed batch, still read, but it has no integrity check (docs/guarantees.md)
    batch_compression: str = "zstd"
    retry: RetryPolicy | None = None  # transient store errors on batch uploads
    cas_retry: RetryPolicy | None = None  # manifest compare-and-set loop
    # the collector's grace period: a batch file is appended only within half of it after it
    # was named, else uploaded again under a fresh name (the collector may have taken it)
    gc_grace_period_s: float = 600.0

    def __post_init__(self) -> None:
        _check_store(self.url, self.store)
        _check_key("data_path_prefix", self.data_path_prefix)
        _check_key("manifest_path", self.manifest_path)
        check_number("flush_interval_s", self.flush_interval_s, 0, above=True)
        check_number("flush_size_bytes", self.flush_size_bytes, 1, integer=True)
        check_number("max_buffered_inputs", self.max_buffered_inputs, 1, integer=True)
        check_number("gc_grace_period_s", self.gc_grace_period_s, 0, above=True)
        if not isinstance(self.batch_compression, str) or \
                self.batch_compression not in COMPRESSIONS:
            raise InvalidInput(f"batch_compression: must be one of {sorted(COMPRESSIONS)}, "
                               f"got {self.batch_compression!r}")
        _check_policy("retry", self.retry)
        _check_policy("cas_retry", self.cas_retry)

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
    # read and decode the next batch in a background thread while the caller works on this one
    # (at most one more decoded batch in memory)
    read_ahead: bool = False
    retry: RetryPolicy | None = None
    cas_retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        _check_store(self.url, self.store)
        _check_key("manifest_path", self.manifest_path)
        _check_key("data_path_prefix", self.data_path_prefix)
        if not isinstance(self.read_ahead, bool):
            raise InvalidInput(f"read_ahead: must be True or False, got {self.read_ahead!r}")
        check_number("gc_interval_s", self.gc_interval_s, 0)  # 0 = no background GC
        check_number("gc_grace_period_s", self.gc_grace_period_s, 0)
        check_number("acks_per_dequeue", self.acks_per_dequeue, 1, integer=True)
        check_number("max_batch_bytes", self.max_batch_bytes, 1, integer=True)
        _check_policy("retry", self.retry)
        _check_policy("cas_retry", self.cas_retry)

    def open_store(self) -> ObjectStore:
        return self.store if self.store is not None else open_store(self.url)
