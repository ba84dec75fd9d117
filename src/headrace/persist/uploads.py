"""The task side of a split write, and the link-time check of what tasks uploaded.

Parts live at ``{root}/{shard}/parts/{writer_id}/{ULID}.parquet``: the writer id in the key is
what lets the sweep tell a live writer's not-yet-linked part (kept) from a dead writer's (deleted),
and what lets a link check that it only links parts uploaded under its own registration.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.codec import crc32, new_ulid
from headrace.errors import FormatError, InvalidInput, NotFound
from headrace.persist import parts as P
from headrace.persist.consensus import DEFAULT_ROOT, validate_shard_name
from headrace.persist.errors import InvalidBounds
from headrace.persist.state import MAX_TIME, WRITER_ID, PartMeta
from headrace.store import ObjectStore, open_store

HEAD_VERIFY_MAX = 8  # up to this many parts are checked with HEADs, more with one LIST


def new_writer_id(tag: str = "") -> str:
    if not tag.isalnum() and tag:
        raise InvalidInput(f"writer id tag {tag!r} must be letters and digits")
    return f"w-{tag}{new_ulid()}"


def validate_writer_id(writer_id: object) -> str:
    if not isinstance(writer_id, str) or not WRITER_ID.match(writer_id):
        raise InvalidInput(f"bad writer id {writer_id!r}: expected 'w-' and letters/digits")
    return writer_id


def parts_prefix(root: str, shard: str, writer_id: str | None = None) -> str:
    base = f"{root.strip('/')}/{validate_shard_name(shard)}/parts/"
    return base if writer_id is None else f"{base}{validate_writer_id(writer_id)}/"


def upload_part(store: ObjectStore | str, shard: str, writer_id: str, updates: pa.Table, *,
                root: str = DEFAULT_ROOT, time: int | None = None) -> PartMeta:
    """Task side of a split write: upload ``updates`` as a part under ``writer_id`` (one PUT).

    ``updates`` has the data columns and ``diff`` and, unless ``time`` is given, ``time``.
    With ``time`` every row is at that time (no time column is stored). Without either, the
    part is *untimed* (a Spark sink task does not know its batch's time): the driver sets it with
    ``PartMeta.at_time(t)`` before linking. ``writer_id`` must be registered (``register()`` on
    the driver) for the part to be safe from the sweep. Returns a picklable PartMeta.
    """
    validate_writer_id(writer_id)
    if not isinstance(updates, pa.Table):
        raise InvalidInput(f"updates must be a pyarrow.Table, got {type(updates).__name__}")
    untimed = P.TIME not in updates.column_names
    if untimed:
        checked = P.check_updates(updates.append_column(
            P.TIME, pa.array(np.zeros(updates.num_rows, np.uint64))))
        table = checked.select(P.data_columns(checked.schema) + [P.DIFF])
    else:
        if time is not None:
            raise InvalidInput("upload_part: pass either a time column or time=, not both")
        checked = table = P.check_updates(updates)
        table = table.select(P.data_columns(table.schema) + [P.TIME, P.DIFF])
    if time is not None and (type(time) is not int or not 0 <= time < MAX_TIME):
        raise InvalidBounds(f"time {time!r} is not a u64 time")
    schema = P.schema_to_text(P.data_schema(checked).remove_metadata())
    store = open_store(store)
    data = P.encode_part(table)
    key = f"{parts_prefix(root, shard, writer_id)}{new_ulid()}.parquet"
    P.put_new_blob(store, key, data)
    if not untimed:
        lo = hi = 0  # an empty part covers nothing until its range is set
        if table.num_rows:
            lo, last = (int(x.as_py()) for x in pc.min_max(table.column(P.TIME)).values())
            hi = last + 1
        return PartMeta(key, lo, hi, table.num_rows, len(data), crc32(data), schema=schema)
    meta = PartMeta(key, 0, 0, table.num_rows, len(data), crc32(data), schema=schema)
    return meta.at_time(time) if time is not None else meta


def verify_parts(store: ObjectStore, parts: list[PartMeta], prefix: str) -> None:
    """Every part exists with its recorded size: HEADs (parallel) or one LIST of ``prefix``."""
    if len(parts) <= HEAD_VERIFY_MAX:
        def size_of(p: PartMeta) -> int | None:
            try:
                return P.STORE_RETRY.call(lambda: store.head(p.key), what=f"head {p.key}").size
            except NotFound:
                return None
        if len(parts) == 1:
            sizes = [size_of(parts[0])]
        else:
            with ThreadPoolExecutor(len(parts), thread_name_prefix="hr-persist-verify") as ex:
                sizes = list(ex.map(size_of, parts))
    else:
        listed = {m.key: m.size for m in store.list(prefix)}
        sizes = [listed.get(p.key) for p in parts]
    for p, size in zip(parts, sizes, strict=True):
        if size is None:
            raise NotFound(p.key)
        if size != p.size:
            raise FormatError(p.key, size, f"part is {size} bytes, its PartMeta says {p.size}")
