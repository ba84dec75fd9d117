"""The numerics of window frames for the ``over`` kernel: Spark's value order, the bounds of
each row's frame, and count/sum/min/max over per-row frames ``lo..hi`` of the sorted rows, all
vectorised across every touched partition at once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.operators.zset import as_array

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
