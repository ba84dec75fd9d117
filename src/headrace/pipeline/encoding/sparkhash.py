"""Spark SQL's ``xxhash64`` over Arrow columns, in numpy: the state bucket of a row without Spark.

Why: a row's state bucket is ``pmod(xxhash64(key columns), buckets)`` (driver/job.bucket_expr),
computed by Spark in every batch's plan. The batch a crash interrupted can run as one stage of
Python tasks that read the queue themselves (the direct job: driver/direct_job.py); they must put each row in the bucket
Spark would have, or a key would meet the wrong state. Spark's XxHash64 hashes each non-NULL
value with the running hash as its seed (42 first; a NULL leaves the seed as it is):

- boolean, int, date: ``hashInt`` of the 32-bit value (boolean as 1/0);
- bigint, timestamp (microseconds): ``hashLong``;
- float / double: -0.0 as 0.0, then the IEEE bits (every NaN as Java's canonical NaN);
- string / binary: ``hashUnsafeBytes`` of the bytes (XXH64 of them, little-endian words).

Vectorised: one numpy pass per column; strings and binaries are hashed per group of equal
byte length (one fixed-width matrix each), so the loops run over word positions and
distinct lengths, never over rows. The oracle is Spark itself (tests/spark/test_sparkhash.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEED = 42
P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
P3 = np.uint64(0x165667B19E3779F9)
P4 = np.uint64(0x85EBCA77C2B2AE63)
P5 = np.uint64(0x27D4EB2F165667C5)
_INTS = (pa.bool_(), pa.int32(), pa.date32())
_LONGS = (pa.int64(), pa.timestamp("us"))
_BYTES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def supported(t: pa.DataType) -> bool:
    """Whether :func:`xxhash64` hashes columns of type ``t`` exactly as Spark does (a
    timestamp only in microseconds, Spark's unit, whatever its zone; no decimal)."""
    if pa.types.is_timestamp(t):
        return t.unit == "us"
    return t in _INTS or t in _LONGS or t in _BYTES or t in (pa.float32(), pa.float64())


def xxhash64(columns: list[pa.Array | pa.ChunkedArray], n: int) -> np.ndarray:
    """Spark's ``xxhash64(columns...)`` of each of the ``n`` rows, as int64."""
    h = np.full(n, SEED, np.uint64)
    with np.errstate(over="ignore"):
        for col in columns:
            col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            if not supported(col.type):
                raise TypeError(f"xxhash64 of {col.type} is not implemented")
            valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
            if col.type in _BYTES:
                hashed = _hash_bytes(col, h)
            else:
                hashed = _hash_fixed(col, h)
            h = np.where(valid, hashed, h)
    return h.view(np.int64)


def buckets(columns: list[pa.Array | pa.ChunkedArray], n: int, count: int) -> np.ndarray:
    """``pmod(xxhash64(columns), count)`` as int32 — driver/job.bucket_expr; no column: bucket 0."""
    if not columns:
        return np.zeros(n, np.int32)
    return np.mod(xxhash64(columns, n), count).astype(np.int32)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * P2
    h = h ^ (h >> np.uint64(29))
    h = h * P3
    return h ^ (h >> np.uint64(32))


def _hash_int(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """``hashInt``: ``v`` the 32-bit values as uint64 (zero-extended)."""
    h = seed + P5 + np.uint64(4)
    h = h ^ (v * P1)
    return _fmix(_rotl(h, 23) * P2 + P3)


def _hash_long(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    h = seed + P5 + np.uint64(8)
    h = h ^ (_rotl(v * P2, 31) * P1)
    return _fmix(_rotl(h, 27) * P1 + P4)


def _hash_fixed(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    t = col.type
    if t == pa.bool_():
        col = pc.cast(col, pa.int32())
    values = pc.fill_null(col, pa.scalar(0, col.type)).to_numpy(zero_copy_only=False)
    if t == pa.float32():
        values = np.where(values == 0, np.float32(0), values).astype(np.float32)
        values = np.where(np.isnan(values), np.float32(np.nan), values)  # canonical NaN
        return _hash_int(values.view(np.uint32).astype(np.uint64), seed)
    if t == pa.float64():
        values = np.where(values == 0, 0.0, values).astype(np.float64)
        bits = values.view(np.uint64)
        bits = np.where(np.isnan(values), np.uint64(0x7FF8000000000000), bits)
        return _hash_long(bits, seed)
    if t in _INTS:
        return _hash_int(values.astype(np.int32).view(np.uint32).astype(np.uint64), seed)
    return _hash_long(values.astype(np.int64).view(np.uint64), seed)


def _hash_bytes(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    """``hashUnsafeBytes`` of each value, one group of equal length at a time."""
    col = pc.cast(col, pa.large_binary())
    n = len(col)
    offsets = np.frombuffer(col.buffers()[1], np.int64)[col.offset:col.offset + n + 1]
    data = col.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    out = seed.copy()
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        matrix = data[offsets[rows][:, None] + np.arange(length)] if length else \
            np.zeros((len(rows), 0), np.uint8)
        out[rows] = _xxh64(matrix, seed[rows])
    return out


def _xxh64(m: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64 of each row of the uint8 matrix ``m`` (all rows the same length)."""
    length = m.shape[1]
    nwords = length // 8
    words = np.ascontiguousarray(m[:, :nwords * 8]).view("<u8").astype(np.uint64)
    at = 0
    if length >= 32:
        v = [seed + P1 + P2, seed + P2, seed.copy(), seed - P1]
        for stripe in range(length // 32):
            for j in range(4):
                v[j] = _rotl(v[j] + words[:, stripe * 4 + j] * P2, 31) * P1
        h = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
        for j in range(4):
            h = (h ^ (_rotl(v[j] * P2, 31) * P1)) * P1 + P4
        at = (length // 32) * 4
    else:
        h = seed + P5
    h = h + np.uint64(length)
    for w in range(at, nwords):
        h = h ^ (_rotl(words[:, w] * P2, 31) * P1)
        h = _rotl(h, 27) * P1 + P4
    pos = nwords * 8
    if pos + 4 <= length:
        k = np.ascontiguousarray(m[:, pos:pos + 4]).view("<u4").astype(np.uint64)[:, 0]
        h = h ^ (k * P1)
        h = _rotl(h, 23) * P2 + P3
        pos += 4
    while pos < length:
        h = h ^ (m[:, pos].astype(np.uint64) * P5)
        h = _rotl(h, 11) * P1
        pos += 1
    return _fmix(h)
