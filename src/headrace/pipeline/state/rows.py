"""Z-set tables of the state: checking what callers hand in, sorted consolidation, key ids and
sizes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.operators.kernel import ZSET_SCHEMA
from headrace.zset import consolidate

#: bytes a row counts for in run sizes (tiering) and write amplification: key, val, weight
#: and the two offsets a page stores for it
ROW_OVERHEAD = 16


def empty_zset() -> pa.Table:
    return ZSET_SCHEMA.empty_table()


def binary_keys(keys, what: str = "lookup keys") -> pa.Array:
    """``keys`` as one binary array; nulls are refused (a key is never null in the state)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    elif not isinstance(keys, pa.Array):
        keys = pa.array(keys, pa.binary())
    if keys.type == pa.large_binary():
        keys = keys.cast(pa.binary())
    elif keys.type != pa.binary():
        raise InvalidInput(f"{what} must be binary, got {keys.type}")
    if keys.null_count:
        raise InvalidInput(f"{what} hold {keys.null_count} nulls; state keys are never null")
    return keys


def check_zset(table: pa.Table, what: str = "updates") -> pa.Table:
    """A caller's (key, val, w) table as ZSET_SCHEMA with one chunk per column."""
    if not isinstance(table, pa.Table):
        raise InvalidInput(f"{what} must be a pyarrow Table, got {type(table).__name__}")
    missing = [c for c in ZSET_SCHEMA.names if c not in table.column_names]
    if missing:
        raise InvalidInput(f"{what} lack columns {missing}; a Z-set has key, val, w")
    cols = []
    for f in ZSET_SCHEMA:
        col = table.column(f.name)
        if col.null_count:
            raise InvalidInput(f"{what}: column {f.name!r} has {col.null_count} nulls")
        if col.type != f.type:
            ok = (f.type == pa.binary() and col.type == pa.large_binary()) or (
                f.type == pa.int64() and pa.types.is_integer(col.type)
                and col.type != pa.uint64())
            if not ok:
                raise InvalidInput(f"{what}: column {f.name!r} has type {col.type}, "
                                   f"expected {f.type}")
            col = col.cast(f.type)
        cols.append(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0))
    return pa.Table.from_arrays(cols, schema=ZSET_SCHEMA)


def sorted_zset(table: pa.Table) -> pa.Table:
    """``table`` consolidated in key order (headrace.zset.consolidate, sorted by (key, val)), as
    ZSET_SCHEMA, one chunk per column. Deterministic whatever the input order, so retried tasks
    write the same bytes."""
    if table.num_rows == 0:
        return empty_zset()
    out = consolidate(table, sort=True)
    return out if out.schema == ZSET_SCHEMA else out.cast(ZSET_SCHEMA)


def fixed_width(arr: pa.Array) -> int:
    """The one byte length of every value of a binary array (> 0), or 0 if lengths differ."""
    n = len(arr)
    if n == 0:
        return 0
    offs = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4)
    k = int(offs[1] - offs[0])
    if k <= 0 or int(offs[-1] - offs[0]) != k * n:
        return 0
    return k if n == 1 or bool((np.diff(offs) == k).all()) else 0


def as_fixed(arr: pa.Array, k: int) -> np.ndarray:
    """A zero-copy numpy ``S{k}`` view of a binary array whose values all have ``k`` bytes.
    For values of one length numpy's byte-string order is byte order (NULs included), so
    ``np.searchsorted`` over it is a binary search in C, not one Python compare per step."""
    offs = np.frombuffer(arr.buffers()[1], np.int32, 2, arr.offset * 4)
    if len(arr) == 0:
        return np.zeros(0, f"S{k}")
    return np.frombuffer(arr.buffers()[2], f"S{k}", len(arr), int(offs[0]))


def key_ids(keys: pa.Array) -> np.ndarray:
    """An int64 id per value, equal for equal values. A merge group's key column is the largest
    thing a task identifies, and Arrow's hash table (``dictionary_encode``) took 188 MB for 1.8M
    9-byte keys. Values of one width that differ in at most 8 of their bytes (an integer group
    key: its flag byte never differs) are sorted as 64-bit integers instead: 74 MB and faster.
    Other values are hashed."""
    k, n = fixed_width(keys), len(keys)
    if k:
        raw = as_fixed(keys, k).view(np.uint8).reshape(n, k)
        varying = [j for j in range(k) if not (raw[:, j] == raw[0, j]).all()]
        if len(varying) <= 8:
            words = np.zeros((n, 8), np.uint8)
            words[:, :len(varying)] = raw[:, varying]
            v = words.view("<u8").ravel()  # equal bytes, equal integers
            del words
            order = np.argsort(v)
            ordered = v[order]
            new = np.empty(n, bool)
            new[0] = True
            np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
            del ordered, v
            ids = np.empty(n, np.int64)
            ids[order] = np.cumsum(new) - 1
            return ids
    return np.asarray(pc.dictionary_encode(keys).indices.to_numpy(zero_copy_only=False),
                      np.int64)


def distinct_sorted_keys(keys: pa.Array) -> pa.Array:
    """Distinct keys in byte order (Arrow's sort, no Python comparison per key)."""
    u = pc.unique(keys)
    return u.take(pc.sort_indices(u))


def raw_bytes(table: pa.Table) -> int:
    """Uncompressed size of rows as a page stores them (for tiering and write amplification)."""
    if table.num_rows == 0:
        return 0
    k, v = table.column("key"), table.column("val")
    return int(table.num_rows * ROW_OVERHEAD + _data_len(k) + _data_len(v))


def _data_len(col) -> int:
    return int(pc.sum(pc.binary_length(col)).as_py() or 0)
