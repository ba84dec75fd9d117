"""The aggregate kernel's per-group count and sum accumulators, exact under retraction.

One update serves every caller: plain count/sum/avg add each delta row with its weight;
count/sum/avg(DISTINCT ...) add one row per distinct value entering (+1) or leaving (-1) a
group's set (see ``multisets.distinct_steps``). So DISTINCT aggregates inherit the plain ones'
exactness, NULL, NaN/inf and overflow rules without a second copy of them.

Fields of aggregate ``j`` (int64 unless said): ``{j}nn`` the non-NULL count; integer and
decimal128 sums add ``{j}s0..`` 24-bit limbs (three for integers, six for decimal128, so no
batch sum can wrap and the overflow check sees the true total); double sums add counts of
+inf, -inf and NaN inputs and ``{j}limbs`` (binary: the exactsum superaccumulator).
"""

from __future__ import annotations

import decimal
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.operators import exactsum
from headrace.pipeline.operators.deltas import group_sum

_M24 = (1 << 24) - 1


def fields(kind: str, j: int, n_limbs: int) -> list[pa.Field]:
    """The accumulator fields of aggregate ``j`` of this kind."""
    out = [pa.field(f"{j}nn", pa.int64())]
    if kind == "sum_int":
        out += [pa.field(f"{j}s{i}", pa.int64()) for i in range(n_limbs)]
    elif kind in ("sum_double", "avg"):
        out += [pa.field(f"{j}{s}", pa.int64()) for s in ("pinf", "ninf", "nan")]
        out.append(pa.field(f"{j}limbs", pa.binary()))
    return out


def update(kind: str, j: int, n_limbs: int, col: pa.Array | None, valid: np.ndarray,
           w: np.ndarray, gid: np.ndarray, g: int, old_int: Callable[[str], np.ndarray],
           old_limbs: Callable[[str], np.ndarray]) -> tuple[dict, dict]:
    """(old, new) field values per group after adding the rows ``col`` (``valid``: not NULL)
    with weights ``w`` to groups ``gid`` in [0, g). ``col`` is unused for a count."""
    wv = np.where(valid, w, 0)
    olds = {f"{j}nn": old_int(f"{j}nn")}
    new = {f"{j}nn": olds[f"{j}nn"] + group_sum(gid, wv, g)}
    if kind == "sum_int":
        parts = int_limbs(col)
        s = []
        for i, part in enumerate(parts):
            olds[f"{j}s{i}"] = old_int(f"{j}s{i}")
            s.append(olds[f"{j}s{i}"] + group_sum(gid, part * wv, g))
        for i in range(len(parts) - 1):  # carry: all limbs but the top in [0, 2^24)
            s[i + 1] += s[i] >> 24
            s[i] &= _M24
        for i, limb in enumerate(s):
            new[f"{j}s{i}"] = limb
    elif kind in ("sum_double", "avg"):
        assert col is not None, "a sum reads a column"
        v = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.float64)
        for name, hit in (("pinf", v == np.inf), ("ninf", v == -np.inf), ("nan", np.isnan(v))):
            olds[f"{j}{name}"] = old_int(f"{j}{name}")
            new[f"{j}{name}"] = olds[f"{j}{name}"] + group_sum(gid, wv * hit, g)
        finite = np.isfinite(v)
        olds[f"{j}limbs"] = limbs = old_limbs(f"{j}limbs")
        # only the groups with rows: a DISTINCT sum's set rarely changes in most groups
        touched, local = np.unique(gid, return_inverse=True)
        added = exactsum.contributions(np.where(finite, v, 0.0), np.where(finite, wv, 0),
                                       local.reshape(-1), len(touched))
        if len(touched) == g:
            new[f"{j}limbs"] = exactsum.normalize(limbs + added)
        else:
            new[f"{j}limbs"] = limbs.copy()
            new[f"{j}limbs"][touched] = exactsum.normalize(limbs[touched] + added)
    return olds, new


def impossible(kind: str, j: int, n_limbs: int, acc: dict, n: np.ndarray) -> np.ndarray:
    """Per group: aggregate ``j``'s fields are what no multiset of rows gives — a count below
    0 or above the group's row count ``n``, infinities or NaNs counted beyond the values, or a
    sum of no values that is not 0. Only retractions of rows never inserted leave such
    fields (a group retracted to count 0 while still summing what it never held)."""
    nn = acc[f"{j}nn"]
    bad = (nn < 0) | (nn > n)
    none = nn == 0
    if kind == "sum_int":
        for i in range(n_limbs):
            bad |= none & (acc[f"{j}s{i}"] != 0)
    elif kind in ("sum_double", "avg"):
        odd = [acc[f"{j}{s}"] for s in ("pinf", "ninf", "nan")]
        for c in odd:
            bad |= c < 0
        bad |= odd[0] + odd[1] + odd[2] > nn
        if none.any():  # the limbs of the (few) groups of no value only
            bad[none] |= np.any(acc[f"{j}limbs"][none] != 0, axis=1)
    return bad


def output(kind: str, j: int, n_limbs: int, acc: dict, t: pa.DataType) -> pa.Array:
    """Aggregate ``j``'s visible value per group (type ``t``); a sum of no values is NULL."""
    nn = acc[f"{j}nn"]
    if kind == "count":
        return pa.array(nn, pa.int64())
    if kind == "sum_int" and n_limbs == 3:
        s0, s1, s2 = (acc[f"{j}s{i}"] for i in range(3))
        with np.errstate(over="ignore"):
            v = (s2 << 48) + (s1 << 24) + s0
        return pa.array(v, pa.int64(), mask=nn <= 0)
    if kind == "sum_int":
        return int128(acc, j, n_limbs, t, nn > 0)
    total = exactsum.to_double(acc[f"{j}limbs"])
    pinf, ninf, nan = acc[f"{j}pinf"] > 0, acc[f"{j}ninf"] > 0, acc[f"{j}nan"] > 0
    total = np.where(pinf, np.inf, np.where(ninf, -np.inf, total))
    total = np.where(nan | (pinf & ninf), np.nan, total)
    if kind == "avg":
        with np.errstate(divide="ignore", invalid="ignore"):
            total = total / np.maximum(nn, 1).astype(np.float64)
    return pa.array(total, pa.float64(), mask=nn <= 0)


def int_fits(acc: dict, j: int, n_limbs: int, t: pa.DataType) -> np.ndarray:
    """Per group: does the integer sum fit ``t`` (int64, or decimal128's precision)?"""
    top = acc[f"{j}s{n_limbs - 1}"]
    if n_limbs == 3:
        return (top >= -(1 << 15)) & (top < (1 << 15))
    fits = (top >= -128) & (top < 128)
    unscaled = int128(acc, j, n_limbs, pa.decimal128(38, 0), fits)
    limit = pa.scalar(decimal.Decimal(10**t.precision - 1), pa.decimal128(38, 0))
    ok = pc.less_equal(pc.abs(pc.if_else(pa.array(fits), unscaled, 0)), limit)
    return fits & np.asarray(ok.to_numpy(zero_copy_only=False), bool)


def int_limbs(col: pa.Array) -> list[np.ndarray]:
    """Integer or decimal128 values as 24-bit limbs (the top one signed); NULLs as 0."""
    if pa.types.is_decimal(col.type):
        n = len(col)
        raw = np.frombuffer(col.buffers()[1], np.uint8, count=(col.offset + n) * 16)
        b = raw[col.offset * 16:].reshape(n, 16).astype(np.int64)
        limbs = [b[:, 3 * i] | (b[:, 3 * i + 1] << 8) | (b[:, 3 * i + 2] << 16)
                 for i in range(5)]
        return limbs + [b[:, 15].astype(np.uint8).view(np.int8).astype(np.int64)]
    v = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64)
    return [v & _M24, (v >> 24) & _M24, v >> 48]


def int128(acc: dict, j: int, nl: int, t: pa.DataType, valid: np.ndarray) -> pa.Array:
    """Six normalised limbs -> a decimal128 array of type ``t`` (NULL where not valid)."""
    limbs = [acc[f"{j}s{i}"] for i in range(nl)]
    n = len(limbs[0])
    out = np.zeros((n, 16), np.uint8)
    for i in range(5):
        for k in range(3):
            out[:, 3 * i + k] = (limbs[i] >> (8 * k)) & 0xFF
    out[:, 15] = limbs[5] & 0xFF
    nulls = int(n - valid.sum())
    bitmap = pa.array(valid, pa.bool_()).buffers()[1] if nulls else None
    return pa.Array.from_buffers(t, n, [bitmap, pa.py_buffer(out.tobytes())], null_count=nulls)
