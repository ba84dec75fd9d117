"""Vectorised 64-bit key hashing and a Bloom filter over it.

A batch file carries a Bloom filter of its distinct keys so a point lookup can skip batches (and,
for a file on disk, blocks) that cannot hold the key. Everything here is numpy over whole arrays:
int64 keys are mixed with splitmix64; binary/string keys get a polynomial hash computed with a
prefix sum over the data buffer (no Python loop per key). The hash is part of the file format
(docs/formats/spine-batch.md): changing it needs a format version bump.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

_P = np.uint64(0x100000001B3)
_LEN_MIX = np.uint64(0x9E3779B97F4A7C15)
BITS_PER_KEY = 10


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hash_keys(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A uint64 hash per key; keys are int64 or (large) binary/string, without nulls."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if pa.types.is_int64(keys.type):
        return splitmix64(keys.to_numpy(zero_copy_only=False).view(np.uint64))
    if not (pa.types.is_large_binary(keys.type) or pa.types.is_large_string(keys.type)):
        keys = keys.cast(pa.large_string() if pa.types.is_string(keys.type)
                         else pa.large_binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    bufs = keys.buffers()
    offs = np.frombuffer(bufs[1], dtype="<i8", count=n + 1, offset=8 * keys.offset)
    lo = int(offs[0])
    rel = offs - lo
    total = int(rel[-1])
    lengths = np.diff(rel)
    if total == 0:
        return splitmix64(lengths.astype(np.uint64) * _LEN_MIX)
    data = np.frombuffer(bufs[2], dtype=np.uint8, count=total, offset=lo)
    maxlen = int(lengths.max())
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(maxlen, _P, dtype=np.uint64))
        pos = np.arange(total, dtype=np.int64) - np.repeat(rel[:-1], lengths)
        terms = (data.astype(np.uint64) + np.uint64(1)) * powers[pos]
        prefix = np.concatenate([np.zeros(1, np.uint64), np.cumsum(terms, dtype=np.uint64)])
        h = prefix[rel[1:]] - prefix[rel[:-1]]
        h = h ^ (lengths.astype(np.uint64) * _LEN_MIX)
    return splitmix64(h)


def bloom_build(hashes: np.ndarray, bits_per_key: int = BITS_PER_KEY) -> tuple[np.ndarray, int]:
    """Filter bits (uint8, little-endian bit order) and hash count k.

    The bit count m is a power of two >= bits_per_key * n (at least 64), so a probe position is
    ``(h1 + i * h2) & (m - 1)``: a mask, not a division.
    """
    n = len(hashes)
    if n == 0:
        return np.zeros(0, dtype=np.uint8), 0
    m = 1 << max(6, int(n * bits_per_key - 1).bit_length())
    k = max(1, round(bits_per_key * math.log(2)))
    bits = np.zeros(m, dtype=bool)
    mask = np.uint64(m - 1)
    h1, h2 = hashes & np.uint64(0xFFFFFFFF), (hashes >> np.uint64(32)) | np.uint64(1)
    with np.errstate(over="ignore"):
        for i in range(k):  # loop over hash functions, vectorised over keys
            bits[(h1 + np.uint64(i) * h2) & mask] = True
    return np.packbits(bits, bitorder="little"), k


def bloom_may_contain(bits: np.ndarray, k: int, hashes: np.ndarray) -> np.ndarray:
    """Boolean mask: False means the key is certainly absent."""
    if k == 0 or len(bits) == 0:
        return np.ones(len(hashes), dtype=bool)
    mask = np.uint64(len(bits) * 8 - 1)
    h1, h2 = hashes & np.uint64(0xFFFFFFFF), (hashes >> np.uint64(32)) | np.uint64(1)
    out = np.ones(len(hashes), dtype=bool)
    with np.errstate(over="ignore"):
        for i in range(k):
            idx = (h1 + np.uint64(i) * h2) & mask
            out &= ((bits[idx >> np.uint64(3)] >> (idx & np.uint64(7)).astype(np.uint8)) & 1
                    ).astype(bool)
    return out
