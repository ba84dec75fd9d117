"""Run views: a whole run's rows in one table, kept per worker, for lookups that touch most of
the run's pages.

A micro-batch's delta of random keys touches nearly every page of a bucket's big run (a 32 KiB
page holds hundreds of keys), so a lookup by pages pays a Python step and a membership test
per page for rows it does not want. A run never changes once written, so the worker keeps the
run as one table (in the same byte-bounded cache as pages) and, when every key has one length
(fixed-width group keys: the common case), answers a lookup with two binary searches over a
numpy view of the keys — O(probe × log run), no per-page work.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.state.resolve import concat
from headrace.pipeline.state.rows import as_fixed, empty_zset, fixed_width


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of arange(lo[i], hi[i]) for all i, without a Python loop."""
    counts = hi - lo
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) + np.repeat(lo - first, counts)


class RunView:
    def __init__(self, pages: list):
        self.table = concat(pages).combine_chunks()
        key = self.table.column("key").chunk(0)
        self.width = fixed_width(key)
        self.keys = as_fixed(key, self.width) if self.width else None
        # keys of one width that share all but their last 8 bytes (an aggregate's group
        # keys: a section tag, a null flag, a long) are searched as integers: numpy's binary
        # search over uint64 is several times faster than over S{k} byte strings
        self.prefix, self.ints = None, None
        if self.keys is not None and len(self.keys):
            rows = self.keys.view(np.uint8).reshape(-1, self.width)
            differ = np.flatnonzero(rows[0] != rows[-1])  # sorted: shared by all iff by these
            common = int(differ[0]) if len(differ) else self.width
            if self.width - common <= 8:
                self.prefix, self.ints = rows[0, :common].copy(), suffix_ints(rows, common)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + (0 if self.ints is None else self.ints.nbytes)

    def match(self, probe: pa.Array, width: int, fixed: np.ndarray | None) -> pa.Table:
        """Rows whose key is one of ``probe`` (sorted distinct keys; ``fixed`` its S{width}
        view when all have ``width`` bytes)."""
        if self.keys is None:
            return self.table.filter(pc.is_in(self.table.column("key"), value_set=probe))
        if width != self.width or fixed is None:  # only keys of the run's length can match
            probe = probe.filter(pc.equal(pc.binary_length(probe), self.width))
            if len(probe) == 0:
                return empty_zset()
            fixed = as_fixed(probe, self.width)
        keys, needles = self.keys, fixed
        if self.ints is not None and self.prefix is not None:
            rows = fixed.view(np.uint8).reshape(-1, self.width)
            cut = len(self.prefix)
            mine = (rows[:, :cut] == self.prefix).all(axis=1)  # others cannot match
            keys, needles = self.ints, suffix_ints(rows[mine], cut)
        lo = np.searchsorted(keys, needles, side="left")
        hi = np.searchsorted(keys, needles, side="right")
        return self.table.take(pa.array(expand_ranges(lo, hi)))


def suffix_ints(rows: np.ndarray, cut: int) -> np.ndarray:
    """Each row's bytes from ``cut`` on (at most 8) as a big-endian unsigned integer: for
    rows of one width, integer order is byte order."""
    out = np.zeros((len(rows), 8), np.uint8)
    out[:, 8 - (rows.shape[1] - cut):] = rows[:, cut:]
    return out.view(">u8").ravel().astype(np.uint64)
