"""Exact sums of doubles under insertion and retraction (a vectorised superaccumulator).

Every finite double is an integer multiple of 2^-1074, so a sum of doubles is exactly an integer
of at most ~2100 bits. We keep that integer per group as 92 limbs of 24 bits (int64 each, with
head-room for carries), add weighted contributions with integer arithmetic only, and round to the
nearest double (ties to even) only when a result is read. Hence the finite part of a streaming
sum is independent of the order and the batch split of its inputs, retracting a value restores
the previous sum bit for bit (1e308 + 1e308 - 1e308 = 1e308), and the result is the correctly
rounded sum of the net input. Spark's batch ``sum`` adds naively in partition order, so it can
differ from this in the last bit, or overflow to inf on an intermediate sum: that difference is
Spark's own order dependence. Non-finite inputs (NaN, +inf, -inf) are counted by the caller.

Whole-column numpy work: the per-limb loops run 92 times over all groups, never per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from headrace.errors import FormatError, InvalidInput

LIMB_BITS = 24
LIMBS = 92  # 2208 bits: 2098 for any double's position + 110 of carry head-room
_MASK = (1 << LIMB_BITS) - 1
# bound on sum(|w|) per batch, so no int64 limb sum can overflow before normalising
MAX_BATCH_WEIGHT = 1 << 36


def check_weights(w: np.ndarray, what: str) -> None:
    total = int(np.abs(w).sum(dtype=np.float64))
    if total >= MAX_BATCH_WEIGHT:
        raise InvalidInput(f"{what}: the batch's weights sum to {total} in absolute value; "
                           f"the exact accumulators take at most {MAX_BATCH_WEIGHT - 1}")


def contributions(values: np.ndarray, weights: np.ndarray, group: np.ndarray,
                  ngroups: int) -> np.ndarray:
    """(ngroups, LIMBS) int64: sum of weights[i] * values[i] per group, unnormalised.

    ``values`` must be finite float64 (callers zero the weight of non-finite or NULL rows).
    """
    out = np.zeros(ngroups * LIMBS, np.int64)
    keep = (weights != 0) & (values != 0)
    if not keep.any():
        return out.reshape(ngroups, LIMBS)
    v, w, g = values[keep], weights[keep], group[keep]
    frac, exp = np.frexp(np.abs(v))
    m = (frac * 2.0**53).astype(np.int64)  # exact: 53-bit mantissa
    e = exp.astype(np.int64) - 53
    under = e < -1074  # subnormals: drop the trailing zeros that frexp scaled in
    m = np.where(under, m >> np.clip(-1074 - e, 0, 63), m)
    e = np.maximum(e, -1074)
    shift = e + 1074
    limb = shift // LIMB_BITS
    r = shift % LIMB_BITS
    sw = np.where(v < 0, -w, w)
    base = g.astype(np.int64) * LIMBS + limb
    for k, part in enumerate((m & _MASK, (m >> 24) & _MASK, m >> 48)):
        p = part << r  # < 2^48
        np.add.at(out, base + k, (p & _MASK) * sw)
        np.add.at(out, base + k + 1, (p >> LIMB_BITS) * sw)
    return out.reshape(ngroups, LIMBS)


def normalize(limbs: np.ndarray) -> np.ndarray:
    """Carry-propagate: every limb in [0, 2^24) except the top one, which carries the sign."""
    x = limbs.copy()
    for i in range(LIMBS - 1):
        carry = x[:, i] >> LIMB_BITS  # floor division by 2^24
        x[:, i] &= _MASK
        x[:, i + 1] += carry
    return x


def _magnitude(limbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(negative?, normalised magnitude limbs) of normalised signed limbs."""
    neg = limbs[:, -1] < 0
    if neg.any():
        limbs = limbs.copy()
        limbs[neg] = normalize(-limbs[neg])
    return neg, limbs


def to_double(limbs: np.ndarray) -> np.ndarray:
    """Round normalised limbs to the nearest double (ties to even); overflow gives +-inf."""
    n = limbs.shape[0]
    neg, mag = _magnitude(limbs)
    nz = mag != 0
    anynz = nz.any(axis=1)
    top = LIMBS - 1 - np.argmax(nz[:, ::-1], axis=1)
    padded = np.concatenate([np.zeros((n, 3), np.int64), mag], axis=1)
    rows = np.arange(n)
    t = top + 3
    lt, l1, l2, l3 = (padded[rows, t - k].astype(np.uint64) for k in range(4))
    nb = np.where(lt > 0, np.floor(np.log2(np.maximum(lt, 1).astype(np.float64))) + 1, 1)
    lz = (LIMB_BITS - nb).astype(np.uint64)
    a = (lt << np.uint64(24)) | l1  # 48 bits, top bit at 47 - lz
    b = (l2 << np.uint64(24)) | l3
    x = (a << (lz + np.uint64(16))) | (b >> (np.uint64(32) - lz))
    dropped = b & ((np.uint64(1) << (np.uint64(32) - lz)) - np.uint64(1))
    below = np.cumsum(mag != 0, axis=1)  # count of nonzero limbs at or below each index
    lower_nz = np.where(top >= 4, below[rows, np.maximum(top - 4, 0)] > 0, False)
    sticky = (dropped != 0) | lower_nz
    mant = x >> np.uint64(11)
    rem = x & np.uint64(0x7FF)
    up = (rem > 0x400) | ((rem == 0x400) & (sticky | ((mant & np.uint64(1)) == 1)))
    mant = mant + up.astype(np.uint64)
    exp2 = 32 - lz.astype(np.int64) + LIMB_BITS * (top.astype(np.int64) - 3) - 1074 + 11
    with np.errstate(over="ignore"):
        out = np.ldexp(mant.astype(np.float64), exp2.astype(np.int32))
    out = np.where(anynz, out, 0.0)
    return np.where(neg, -out, out)


def pack(limbs: np.ndarray) -> pa.Array:
    """Normalised limbs -> binary per group: sign byte, first limb index, 3 bytes per limb."""
    n = limbs.shape[0]
    neg, mag = _magnitude(limbs)
    nz = mag != 0
    anynz = nz.any(axis=1)
    lo = np.where(anynz, np.argmax(nz, axis=1), 0)
    hi = np.where(anynz, LIMBS - 1 - np.argmax(nz[:, ::-1], axis=1), -1)
    count = hi - lo + 1
    sizes = 2 + 3 * count
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)
    out[offsets[:-1]] = neg
    out[offsets[:-1] + 1] = lo
    flat = mag.reshape(-1)
    src = _ranges(np.arange(n) * LIMBS + lo, count)
    vals = flat[src]
    dst = _ranges(offsets[:-1] + 2, 3 * count)
    b = np.stack([(vals >> 16) & 0xFF, (vals >> 8) & 0xFF, vals & 0xFF], axis=1).reshape(-1)
    out[dst] = b
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
        offsets.astype(np.int32).tobytes()), pa.py_buffer(out.tobytes())])


def unpack(packed: pa.Array) -> np.ndarray:
    """Inverse of :func:`pack` (normalised signed limbs); malformed bytes raise FormatError."""
    if isinstance(packed, pa.ChunkedArray):
        packed = packed.combine_chunks()
    n = len(packed)
    out = np.zeros((n, LIMBS), np.int64)
    if n == 0:
        return out
    if packed.null_count:
        raise FormatError(None, None, "an exact-sum state value is NULL")
    bufs = packed.buffers()
    offs = np.frombuffer(bufs[1], np.int32, count=packed.offset + n + 1)[packed.offset:]
    offs = offs.astype(np.int64)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    size = np.diff(offs)
    if np.any(size < 2) or np.any((size - 2) % 3):
        raise FormatError(None, None, "an exact-sum state value has a bad length")
    count = (size - 2) // 3
    neg = data[offs[:-1]]
    lo = data[offs[:-1] + 1].astype(np.int64)
    if np.any(neg > 1) or np.any(lo + count > LIMBS):
        raise FormatError(None, 1, "an exact-sum state value has a bad sign or limb index")
    b = data[_ranges(offs[:-1] + 2, 3 * count)].astype(np.int64).reshape(-1, 3)
    vals = (b[:, 0] << 16) | (b[:, 1] << 8) | b[:, 2]
    out.reshape(-1)[_ranges(np.arange(n) * LIMBS + lo, count)] = vals
    negative = neg == 1
    if negative.any():
        out[negative] = normalize(-out[negative])
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.cumsum(lengths) - lengths
    return np.repeat(starts, lengths) + np.arange(total, dtype=np.int64) - np.repeat(first,
                                                                                     lengths)
