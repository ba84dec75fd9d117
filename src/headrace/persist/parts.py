"""Parts: write-once Parquet blobs of updates, and the vectorised consolidation of updates.

An update table has the data columns, ``time`` (uint64) and ``diff`` (int64). Parts are written
with a Create put under a fresh ULID key (``{root}/{shard}/parts/{ULID}.parquet``) *before* the
state CAS links them, so a crash between the two leaves only an unreferenced blob that the sweep
collects. Every part's CRC32 and size are recorded in the state and checked on read.
"""

from __future__ import annotations

import base64
import io
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headrace.codec import crc32
from headrace.errors import AlreadyExists, ChecksumMismatch, FormatError, InvalidInput, StoreError
from headrace.persist.state import PartMeta
from headrace.retry import RetryPolicy
from headrace.store import CREATE, ObjectStore
from headrace.zset import consolidate

log = logging.getLogger("headrace.persist")
STORE_RETRY = RetryPolicy(max_attempts=8, base_delay_s=0.005, max_delay_s=0.5)

TIME, DIFF = "time", "diff"
PARQUET_OPTIONS = {"compression": "zstd", "write_page_checksum": True}


def data_columns(schema: pa.Schema) -> list[str]:
    return [n for n in schema.names if n not in (TIME, DIFF)]


def check_updates(updates: pa.Table) -> pa.Table:
    """Refuse tables without time uint64 / diff int64; cast losslessly where Arrow can."""
    if not isinstance(updates, pa.Table):
        raise InvalidInput(f"updates must be a pyarrow.Table, got {type(updates).__name__}")
    for name, typ in ((TIME, pa.uint64()), (DIFF, pa.int64())):
        if name not in updates.column_names:
            raise InvalidInput(f"updates lack the {name!r} column ({typ})")
        col = updates.column(name)
        if col.null_count:
            raise InvalidInput(f"column {name!r} has nulls")
        if col.type != typ:
            try:
                updates = updates.set_column(updates.schema.get_field_index(name), name,
                                             col.cast(typ, safe=True))
            except pa.ArrowException as e:
                raise InvalidInput(f"column {name!r} must be {typ}: {e}") from None
    if len(set(updates.column_names)) != updates.num_columns:
        raise InvalidInput(f"duplicate column names in {updates.column_names}")
    return updates


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str, key: str | None = None) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except (ValueError, pa.ArrowException) as e:
        raise FormatError(key, None, f"bad schema in shard state: {e}") from None


def data_schema(updates: pa.Table) -> pa.Schema:
    return pa.schema([updates.schema.field(n) for n in data_columns(updates.schema)])


def encode_part(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **PARQUET_OPTIONS)
    return sink.getvalue()


def put_new_blob(store: ObjectStore, key: str, data: bytes) -> None:
    """Create ``key`` (a fresh ULID key, so only we write it), retrying transient errors.

    A retry that finds the key already there means an earlier attempt landed and only its reply
    was lost: the bytes are compared to be sure.
    """
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        try:
            store.put(key, data, CREATE)
        except AlreadyExists:
            if attempts == 1 or store.get(key).data != data:
                raise
    STORE_RETRY.call(attempt, what=f"put {key}")


def delete_quietly(store: ObjectStore, keys: list[str]) -> None:
    """Best-effort delete of blobs nobody references; the sweep retries what this misses."""
    if not keys:
        return
    try:
        store.delete_many(keys)
    except StoreError as e:
        log.info("could not delete %d unreferenced blobs now (the sweep will): %s", len(keys), e)


def read_part(store: ObjectStore, part: PartMeta) -> pa.Table:
    data = STORE_RETRY.call(lambda: store.get(part.key), what=f"get {part.key}").data
    if len(data) != part.size:
        raise FormatError(part.key, len(data), f"part is {len(data)} bytes, state says {part.size}")
    actual = crc32(data)
    if actual != part.crc32:
        raise ChecksumMismatch(part.key, 0, "crc32 of part", expected=part.crc32, actual=actual)
    try:
        # one thread: parts are already read in parallel (read_parts_parallel), and pyarrow's
        # own pool on top only oversubscribes the cores (and was still busy at CLI exit)
        table = pq.read_table(pa.BufferReader(data), page_checksum_verification=True,
                              use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise FormatError(part.key, None, f"part is not readable Parquet: {e}") from None
    if table.num_rows != part.rows:
        raise FormatError(part.key, None, f"part has {table.num_rows} rows, state says {part.rows}")
    if part.time_override is not None:
        times = pa.array(np.full(table.num_rows, part.time_override, dtype=np.uint64))
        if TIME in table.column_names:
            table = table.drop_columns([TIME])
        table = table.append_column(TIME, times)
    return check_updates(table)


def consolidate_updates(updates: pa.Table, *, keep_time: bool) -> pa.Table:
    """Sum diffs per (data columns [, time]) and drop zeros (headrace.zset.consolidate)."""
    cols = data_columns(updates.schema)
    return consolidate(updates, DIFF, by=cols + ([TIME] if keep_time else []))


def advance_times(updates: pa.Table, since: int) -> pa.Table:
    """Times below ``since`` become ``since``: indistinguishable for any read at as_of >= since."""
    times = updates.column(TIME)
    advanced = pc.max_element_wise(times, pa.scalar(since, pa.uint64()))
    return updates.set_column(updates.schema.get_field_index(TIME), TIME, advanced)
