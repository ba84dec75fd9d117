"""Reading the batch a queue entry names, and skipping one that cannot be read.

Every reader goes through ``load_block``: the entry's location is checked (a key under the
queue's data prefix), a missing file is ``MissingBatch`` and undecodable bytes ``FormatError``,
each naming the entry. ``fetch_block``/``fetch_batch`` then consult the skip log, only on
failure: a recorded skip turns into an empty batch (``ConsumedBatch.skipped``) so the consumer's
sequence, acks and offsets move on; a batch that reads is always delivered. ``skip_batch`` is
the one way to record a skip, and it refuses a batch that reads fine.
"""

from __future__ import annotations

import logging

from headrace.buffer.batch_format import DEFAULT_MAX_BLOCK_BYTES, DecodedBlock, decode_block
from headrace.buffer.config import DEFAULT_DATA_PREFIX, DEFAULT_MANIFEST_PATH
from headrace.buffer.locations import check_entry_location
from headrace.buffer.queue import read_manifest
from headrace.buffer.skips import append_skip, default_actor, find_skip
from headrace.buffer.types import (
    ConsumedBatch,
    InvalidLocation,
    ManifestEntry,
    MissingBatch,
    SkipRecord,
)
from headrace.codec import Clock, SystemClock
from headrace.errors import FormatError, InvalidInput, NotFound
from headrace.retry import RetryPolicy
from headrace.store import ObjectStore

log = logging.getLogger("headrace.buffer.batches")
UNREADABLE = (InvalidLocation, MissingBatch, FormatError)


def load_block(store: ObjectStore, manifest_path: str, entry: ManifestEntry, *,
               data_path_prefix: str | None = None, retry: RetryPolicy | None = None,
               max_batch_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> DecodedBlock:
    """The decoded batch of ``entry``, or a typed error naming it (no skip log involved)."""
    block = read_block(store, manifest_path, entry.sequence, entry.location,
                       data_path_prefix=data_path_prefix, retry=retry,
                       max_batch_bytes=max_batch_bytes)
    check_block(manifest_path, entry, block)
    return block


def read_block(store: ObjectStore, manifest_path: str, sequence: int, location: str, *,
               data_path_prefix: str | None = None, retry: RetryPolicy | None = None,
               max_batch_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> DecodedBlock:
    """The batch file at ``location`` read and decoded, before its entry's metadata is known:
    the consumer's read-ahead calls this, then ``check_block`` once it holds the entry."""
    check_entry_location(manifest_path, ManifestEntry(sequence, location), data_path_prefix)
    try:
        data = (retry or RetryPolicy()).call(lambda: store.get(location).data,
                                             what=f"read {location}")
    except NotFound as e:
        raise MissingBatch(manifest_path, sequence, location) from e
    return decode_block(data, location, max_batch_bytes)


def check_block(manifest_path: str, entry: ManifestEntry, block: DecodedBlock) -> None:
    """What a decoded batch must agree on with its manifest entry."""
    check_metadata_ranges(manifest_path, entry, len(block.starts))


def check_metadata_ranges(manifest_path: str, entry: ManifestEntry, record_count: int) -> None:
    """The entry's metadata items must tile its batch: the first starts at record 0, each at or
    after the one before, none past the end. The manifest has no checksum (RFC 0001), so this
    is what turns a damaged ``start_index`` into an error instead of ranges over wrong records.
    """
    previous = 0
    for i, item in enumerate(entry.metadata):
        start = item.start_index
        if (i == 0 and start != 0) or start < previous or start > record_count:
            raise FormatError(manifest_path, None,
                              f"sequence {entry.sequence} ({entry.location}): metadata item {i} "
                              f"has start_index {start}, but items must start at 0, not go "
                              f"back (previous {previous}) and stay within the batch's "
                              f"{record_count} records")
        previous = start


def fetch_block(store: ObjectStore, manifest_path: str, entry: ManifestEntry, *,
                data_path_prefix: str | None = None, retry: RetryPolicy | None = None,
                max_batch_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> DecodedBlock | SkipRecord:
    """``load_block``, or the entry's SkipRecord if it cannot be read and a skip is recorded."""
    try:
        return load_block(store, manifest_path, entry, data_path_prefix=data_path_prefix,
                          retry=retry, max_batch_bytes=max_batch_bytes)
    except UNREADABLE:
        record = find_skip(store, manifest_path, entry.sequence, entry.location)
        if record is None:
            raise
        log.warning("queue %s: sequence %d (%s) is unreadable and recorded as skipped by %s: "
                    "%s", manifest_path, entry.sequence, entry.location, record.actor,
                    record.reason)
        return record


def fetch_batch(store: ObjectStore, entry: ManifestEntry, *,
                manifest_path: str = DEFAULT_MANIFEST_PATH, data_path_prefix: str | None = None,
                retry: RetryPolicy | None = None,
                max_batch_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> ConsumedBatch:
    """The batch a manifest entry points at (empty, with ``skipped`` set, for a recorded skip)."""
    got = fetch_block(store, manifest_path, entry, data_path_prefix=data_path_prefix,
                      retry=retry, max_batch_bytes=max_batch_bytes)
    if isinstance(got, SkipRecord):
        return ConsumedBatch(DecodedBlock.empty(entry.location), entry.sequence, entry.location,
                             list(entry.metadata), got)
    return ConsumedBatch(got, entry.sequence, entry.location, list(entry.metadata))


def skip_batch(store: ObjectStore, manifest_path: str, sequence: int, *, reason: str,
               data_path_prefix: str = DEFAULT_DATA_PREFIX, actor: str | None = None,
               clock: Clock | None = None, retry: RetryPolicy | None = None,
               max_batch_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> SkipRecord:
    """Record that queue entry ``sequence`` is skipped because its batch cannot be read.

    Refused (``InvalidInput``) for an empty reason, a sequence not in the queue, or a batch
    that reads fine: skipping must never drop readable data. Idempotent per entry.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("reason: a skip needs a non-empty reason (it is the audit record)")
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
        raise InvalidInput(f"sequence: must be an integer >= 0, got {sequence!r}")
    entries = read_manifest(store, manifest_path).entries
    entry = next((e for e in entries if e.sequence == sequence), None)
    if entry is None:
        held = f"{entries[0].sequence}..{entries[-1].sequence}" if entries else "nothing"
        raise InvalidInput(f"sequence {sequence} is not in the queue {manifest_path!r} "
                           f"(it holds {held})")
    existing = find_skip(store, manifest_path, sequence, entry.location)
    if existing is not None:
        return existing
    try:
        load_block(store, manifest_path, entry, data_path_prefix=data_path_prefix, retry=retry,
                   max_batch_bytes=max_batch_bytes)
    except InvalidLocation as e:
        cause, detail = "invalid_location", e.why
    except MissingBatch as e:
        cause, detail = "missing", str(e)
    except FormatError as e:
        cause, detail = "unreadable", str(e)
    else:
        raise InvalidInput(f"sequence {sequence} at {entry.location!r} reads fine: refusing "
                           "to skip (and so lose) its data")
    record = SkipRecord(sequence, entry.location, cause, reason.strip(),
                        (clock or SystemClock()).now_ms(), actor or default_actor(), detail)
    record = append_skip(store, manifest_path, record)
    log.warning("queue %s: sequence %d (%s, %s) skipped by %s: %s", manifest_path, sequence,
                entry.location, cause, record.actor, record.reason)
    return record
