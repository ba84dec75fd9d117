"""The skip log: the audit trail of batches an operator chose to skip (``headrace queue skip``).

A queue entry whose batch cannot be read (missing, undecodable, or naming a location the queue
may not read) stops its consumer for good: nothing is dropped silently. An operator decides to
skip it; the decision is appended to one JSON object next to the manifest,
``{manifest_path}.skips``, by compare-and-set, with who, when, why and what was wrong. Readers
consult it only when a batch fails to read, so a batch that reads fine is always delivered,
recorded or not. Format: docs/formats/queue-manifest.md ("Skip log").
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import socket

from headrace.buffer.types import SkipRecord
from headrace.errors import (
    AlreadyExists,
    FormatError,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    RetryExhausted,
    StoreError,
)
from headrace.retry import RetryPolicy
from headrace.store import CREATE, IfMatch, ObjectStore

VERSION = 1
MAX_SKIP_LOG_BYTES = 4 << 20  # ~15,000 records: far more skips than any queue should need
CAUSES = ("missing", "unreadable", "invalid_location")
_FIELDS = {"sequence": int, "location": str, "cause": str, "reason": str, "skipped_at_ms": int,
           "actor": str, "detail": str}


def skip_log_path(manifest_path: str) -> str:
    return f"{manifest_path}.skips"


def default_actor() -> str:
    """Who skipped: user@host and pid (an audit trail, never credentials)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


def _record(item: object, key: str, i: int) -> SkipRecord:
    if not isinstance(item, dict) or set(item) != set(_FIELDS):
        raise FormatError(key, None, f"skips[{i}]: expected an object with fields "
                          f"{sorted(_FIELDS)}")
    for name, kind in _FIELDS.items():
        value = item[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise FormatError(key, None, f"skips[{i}].{name}: expected {kind.__name__}, got "
                              f"{type(value).__name__}")
    if item["sequence"] < 0 or item["cause"] not in CAUSES:
        raise FormatError(key, None, f"skips[{i}]: sequence {item['sequence']} / cause "
                          f"{item['cause']!r} out of range")
    return SkipRecord(**item)


def decode_skip_log(data: bytes, key: str) -> list[SkipRecord]:
    """Parse and validate the skip log; size is bounded before parsing, nesting cannot recurse."""
    if len(data) > MAX_SKIP_LOG_BYTES:
        raise FormatError(key, None, f"skip log is {len(data)} bytes, above the "
                          f"{MAX_SKIP_LOG_BYTES}-byte bound")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise FormatError(key, None, f"skip log is not JSON: {type(e).__name__}") from e
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise FormatError(key, None, f"skip log is not a version-{VERSION} object")
    skips = doc.get("skips")
    if not isinstance(skips, list):
        raise FormatError(key, None, "skip log field 'skips' is not a list")
    return [_record(item, key, i) for i, item in enumerate(skips)]


def encode_skip_log(manifest_path: str, records: list[SkipRecord]) -> bytes:
    doc = {"version": VERSION, "manifest_path": manifest_path,
           "skips": [dataclasses.asdict(r) for r in records]}
    return (json.dumps(doc, indent=1, ensure_ascii=True) + "\n").encode()


def _get(store: ObjectStore, key: str) -> tuple[bytes | None, str | None]:
    """The log's bytes and etag (None, None when there is none); bounded before the GET."""
    try:
        size = store.head(key).size
        if size > MAX_SKIP_LOG_BYTES:
            raise FormatError(key, None, f"skip log is {size} bytes, above the "
                              f"{MAX_SKIP_LOG_BYTES}-byte bound")
        res = store.get(key)
    except NotFound:
        return None, None
    return res.data, res.etag


def read_skips(store: ObjectStore, manifest_path: str) -> dict[int, SkipRecord]:
    """Every recorded skip of the queue, by sequence."""
    key = skip_log_path(manifest_path)
    data, _ = _get(store, key)
    return {} if data is None else {r.sequence: r for r in decode_skip_log(data, key)}


def find_skip(store: ObjectStore, manifest_path: str, sequence: int,
              location: str) -> SkipRecord | None:
    """The recorded skip of exactly this entry (sequence and location both match), if any."""
    record = read_skips(store, manifest_path).get(sequence)
    return record if record is not None and record.location == location else None


def append_skip(store: ObjectStore, manifest_path: str, record: SkipRecord,
                policy: RetryPolicy | None = None) -> SkipRecord:
    """Add ``record`` by compare-and-set; if this entry is already recorded, return that one."""
    key = skip_log_path(manifest_path)
    policy = policy or RetryPolicy(max_attempts=50)
    last: BaseException | None = None
    attempts = 0
    for attempts in policy.delays():  # noqa: B007 - reported when giving up
        try:
            data, etag = _get(store, key)
        except StoreError as e:
            if not e.retryable:
                raise
            last = e
            continue
        records = [] if data is None else decode_skip_log(data, key)
        for r in records:  # idempotent, also after a put whose reply was lost
            if (r.sequence, r.location) == (record.sequence, record.location):
                return r
            if r.sequence == record.sequence:
                raise InvalidInput(f"sequence {record.sequence} was already skipped at another "
                                   f"location ({r.location!r}); the skip log {key!r} is not "
                                   "this queue's")
        new = encode_skip_log(manifest_path, records + [record])
        if len(new) > MAX_SKIP_LOG_BYTES:
            raise InvalidInput(f"skip log {key!r} is full ({MAX_SKIP_LOG_BYTES} bytes)")
        try:
            store.put(key, new, CREATE if etag is None else IfMatch(etag))
        except (AlreadyExists, PreconditionFailed) as e:
            last = e
            continue
        except StoreError as e:
            if not e.retryable:
                raise
            last = e
            continue
        return record
    raise RetryExhausted(f"recording a skip in {key!r} gave up after {attempts} attempts: "
                         f"{last}", attempts) from last
