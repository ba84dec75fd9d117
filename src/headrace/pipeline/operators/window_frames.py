"""The numerics of window frames for the ``over`` kernel: Spark's value order, the bounds of
each row's frame, and count/sum/min/max over per-row frames ``lo..hi`` of the sorted rows, all
vectorised across every touched partition at once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.operators.deltas import as_array

_LOW32 = (1 << 32) - 1


def dense(arr: pa.Array) -> np.ndarray:
    """Dense ranks (0-based) of a sortable array (strings and binaries bytewise, as Spark
    compares them), NULL first."""
    r = pc.rank(arr, sort_keys="ascending", tiebreaker="dense", null_placement="at_start")
    return np.asarray(r.to_numpy(), np.int64) - 1


def value_rank(arr: pa.Array) -> np.ndarray:
    """Dense ranks in Spark's value order (NULLs rank lowest; the callers mask them): floats
    with -0.0 = 0.0 and every NaN equal and above all numbers."""
    if not pa.types.is_floating(arr.type):
        return dense(arr)
    v = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.float64)
    nan = np.isnan(v)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
    r = dense(pa.array(v + 0.0, mask=~valid | nan))  # + 0.0: -0.0 -> 0.0
    return np.where(nan & valid, r.max(initial=0) + 1, r)


def run_ends(starts_mask: np.ndarray) -> np.ndarray:
    """Per row, the last position of its run (runs begin where ``starts_mask`` is True)."""
    n = len(starts_mask)
    starts = np.flatnonzero(starts_mask)
    return np.r_[starts[1:], n][np.cumsum(starts_mask) - 1] - 1


def frame_bounds(kind: str, lower: int | None, upper: int | None, pos: np.ndarray,
                 part_start: np.ndarray, part_end: np.ndarray, peer_start: np.ndarray,
                 peer_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per row: the frame's first and last sorted position inside the partition. A
    ROWS bound is an offset from the current row, a RANGE bound 0 means the current row's
    peers; None is unbounded. An empty frame comes back as lo = pos, hi = pos - 1."""
    if kind == "rows":
        lo = part_start if lower is None else np.maximum(part_start, pos + lower)
        hi = part_end if upper is None else np.minimum(part_end, pos + upper)
    else:
        lo = part_start if lower is None else peer_start
        hi = part_end if upper is None else peer_end
    empty = lo > hi
    if empty.any():
        lo, hi = np.where(empty, pos, lo), np.where(empty, pos - 1, hi)
    return lo, hi


def frame_sum(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Exact int64 sums of v[lo..hi] (prefix sums; each value small enough not to wrap)."""
    c = np.zeros(len(v) + 1, np.int64)
    np.cumsum(v, out=c[1:])
    return c[hi + 1] - c[lo]


def fold(v: np.ndarray, lo: np.ndarray, hi: np.ndarray, new_part: np.ndarray,
         from_start: bool) -> np.ndarray:
    """Spark's double sum of each frame: ``((0.0 + v[lo]) + v[lo+1]) + ... + v[hi]`` in frame
    order (NULLs given as 0.0, which cannot change a sum that starts at 0.0), so rounding
    matches Spark's bit for bit (Spark folds a frame that starts at the partition's start
    incrementally and recomputes any other frame from its first row). Frames from the start
    (``from_start``): a running sum per partition read at ``hi`` (np.add.accumulate is a
    sequential fold), partitions padded into rows of a matrix by length class so padding
    costs at most 2x. Other frames: one vector step per frame position, over the rows whose
    frame is still that long (work = the sum of the frame lengths)."""
    n = len(v)
    if not from_start:
        acc = np.zeros(n, np.float64)
        length = hi - lo + 1
        active = np.flatnonzero(length > 0)
        k = 0
        while active.size:
            acc[active] += v[lo[active] + k]
            k += 1
            active = active[length[active] > k]
        return acc + 0.0
    starts = np.flatnonzero(new_part)
    lengths = np.diff(np.r_[starts, n])
    out = np.empty(n, np.float64)
    width = np.maximum(1, 1 << np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64))
    for cls in np.unique(width):
        sel = np.flatnonzero(width == cls)
        m = np.zeros((len(sel), int(cls)), np.float64)
        rows = np.repeat(np.arange(len(sel)), lengths[sel])
        within = np.arange(len(rows)) - np.repeat(np.cumsum(lengths[sel]) - lengths[sel],
                                                  lengths[sel])
        src = starts[sel][rows] + within
        m[rows, within] = v[src]
        out[src] = np.add.accumulate(m, axis=1)[rows, within]
    out = out + 0.0  # -0.0 -> 0.0: Spark's fold starts at 0.0
    return out[np.where(hi >= lo, hi, lo)]  # an empty frame's value is masked by the caller


def frame_extreme(col: pa.Array, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  func: str, empty: np.ndarray) -> pa.Array:
    """min/max of col[lo..hi], the first such row in frame order on ties (Spark's
    ``greatest(max, v)`` keeps the value it has): a sparse table of (value rank, -position).
    ``empty``: frames without a non-NULL value (NULL out)."""
    n = len(hi)
    pos = np.arange(n, dtype=np.int64)
    lo, hi = np.where(empty, pos, lo), np.where(empty, pos, hi)
    r = value_rank(col)
    if func == "min":
        r = r.max(initial=0) - r
    key = np.where(valid, (r << 32) | (_LOW32 - pos), -1)
    span = int((hi - lo).max(initial=0)) + 1
    levels = [key]
    step = 1
    while 2 * step <= span:
        prev = levels[-1]
        nxt = prev.copy()
        nxt[:n - step] = np.maximum(prev[:n - step], prev[step:])
        levels.append(nxt)
        step *= 2
    length = hi - lo + 1
    k = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    best = np.empty(n, np.int64)
    for level in np.unique(k):
        sel = k == level
        table = levels[int(level)]
        best[sel] = np.maximum(table[lo[sel]], table[hi[sel] - (1 << int(level)) + 1])
    winner = np.where(empty, 0, _LOW32 - (best & _LOW32))
    out = col.take(pa.array(winner))
    return as_array(pc.if_else(pa.array(empty), pa.scalar(None, col.type), out))


def _sortable(v: np.ndarray) -> np.ndarray:
    """int64 keys in Spark's order of the values ``v`` (ints as they are; floats with -0.0 =
    0.0 and every NaN one value above +inf)."""
    if v.dtype.kind != "f":
        return v.astype(np.int64)
    v = np.where(np.isnan(v), np.nan, v.astype(np.float64) + 0.0)  # one NaN, -0.0 -> 0.0
    bits = v.view(np.int64)
    return bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


def range_targets(col: pa.Array, offset, descending: bool, where: str) -> np.ndarray:
    """Per row, the order value a RANGE bound ``offset`` reaches from the row's value: value +
    offset, value - offset under DESC (Spark flips it), in the column's own type as Spark adds
    (a float32 column in float32). Integers that leave the type's range raise OverflowError
    naming ``where`` (Spark's ANSI addExact raises on such a bound too)."""
    t = col.type
    storage = (pa.int32() if pa.types.is_date32(t) else
               pa.int64() if pa.types.is_timestamp(t) or pa.types.is_date64(t) else t)
    v = np.asarray(col.cast(storage).fill_null(0).to_numpy(zero_copy_only=False))
    off = -offset if descending else offset
    if v.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            return v + v.dtype.type(off)
    info = np.iinfo(v.dtype)
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
    bad = valid & ((v > info.max - off) if off > 0 else (v < info.min - off))
    if bad.any():
        raise OverflowError(f"{where}: the order value {v[bad][0]} + {off} leaves the range of "
                            f"{t}")
    return v.astype(np.int64) + off


def range_bounds(col: pa.Array, descending: bool, nulls_first: bool, part: np.ndarray,
                 targets: tuple[np.ndarray | None, np.ndarray | None],
                 ends: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of RANGE frames with value offsets over the ONE order column ``col`` (sorted
    rows, ``part`` their partition ids): the rows whose value lies between the row's two
    ``targets`` (range_targets; None: unbounded, ``ends`` = the partition's first and last
    position there). By binary search over (partition, value rank) — every row's position at
    once. A NULL order value's bounded sides stop at its peers, the other NULLs (Spark: NULL
    + offset is NULL, which only NULLs equal)."""
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
    storage = pa.int32() if pa.types.is_date32(col.type) else (
        pa.int64() if pa.types.is_timestamp(col.type) or pa.types.is_date64(col.type)
        else col.type)
    x = _sortable(np.asarray(col.cast(storage).fill_null(0).to_numpy(zero_copy_only=False)))
    got = [_sortable(t) for t in targets if t is not None]
    keys, rank = np.unique(np.concatenate([x[valid], *(g[valid] for g in got)]),
                           return_inverse=True)
    if descending:
        rank = len(keys) - 1 - rank
    rank = rank + 1  # 0 and len(keys) + 1: NULLs before/after every value
    nv = int(valid.sum())
    null_rank = 0 if nulls_first else len(keys) + 1
    m = np.int64(len(keys) + 2)
    r = np.full(len(x), null_rank, np.int64)
    r[valid] = rank[:nv]
    composite = part.astype(np.int64) * m + r
    peer_lo = np.searchsorted(composite, composite, "left")
    peer_hi = np.searchsorted(composite, composite, "right") - 1
    out = []
    for j, (target, side) in enumerate(zip(targets, ("left", "right"), strict=True)):
        if target is None:
            out.append(ends[j])
            continue
        k = sum(t is not None for t in targets[:j])
        tr = np.full(len(x), null_rank, np.int64)
        tr[valid] = rank[nv * (k + 1):nv * (k + 2)]
        b = np.searchsorted(composite, part.astype(np.int64) * m + tr,
                            "left" if side == "left" else "right")
        out.append(np.where(valid, b if side == "left" else b - 1,
                            peer_lo if side == "left" else peer_hi))
    return out[0], out[1]


def nth_position(valid: np.ndarray, lo: np.ndarray, hi: np.ndarray, n: int,
                 from_end: bool, ignore_nulls: bool) -> tuple[np.ndarray, np.ndarray]:
    """(position, found) of the ``n``-th row of each frame lo..hi (from its end with
    ``from_end``), counting only non-NULL rows with ``ignore_nulls``: first / last /
    nth_value. found is False where the frame holds fewer such rows."""
    if not ignore_nulls:
        p = hi - (n - 1) if from_end else lo + (n - 1)
        return p, (p >= lo) & (p <= hi) & (hi >= lo)
    c = np.zeros(len(valid) + 1, np.int64)
    np.cumsum(valid, out=c[1:])
    have = np.where(hi >= lo, c[np.maximum(hi, lo - 1) + 1] - c[lo], 0)
    found = have >= n
    # the k-th non-NULL row from the start is the first position j with c[j + 1] = c[lo] + k
    k = have - n + 1 if from_end else n
    p = np.searchsorted(c, c[lo] + k, "left") - 1
    return np.where(found, p, lo), found


def ntile(index: np.ndarray, size: np.ndarray, buckets: int) -> np.ndarray:
    """Spark's ntile: the ``size`` rows of a partition in ``buckets`` buckets as equal as can
    be, the first ``size % buckets`` one row larger; ``index`` = the row's 0-based place."""
    q, r = size // buckets, size % buckets
    big = r * (q + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        later = r + (index - big) // np.maximum(q, 1)
    return np.where(index < big, index // (q + 1), later) + 1
