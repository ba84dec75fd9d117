"""Cursor: walk a spine's consolidated view key by key, in key order, a chunk at a time.

A cursor reads a snapshot of the spine's batches taken when it is created (batches are
immutable), so merges, inserts and truncations while it iterates do not change what it yields;
the batches it holds stay readable after a merge replaces them (a mapped file outlives its
unlink). The cursor never materialises the whole spine: it asks the spine for the consolidated rows of a
key range ``[lo, hi)`` whose upper end is a sparse-index key of the largest batch chosen so that
a chunk holds about ``chunk_rows`` rows, and steps through that chunk with precomputed key-group
boundaries (vectorised), so ``next_key`` is O(1).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Cursor:
    """seek(key) / key() / values() / next_key() / valid() over lo <= key < hi."""

    def __init__(self, spine, lo=None, hi=None, chunk_rows: int = 65536):
        # a live Spine is frozen here; a SpineSnapshot (or one batch) already is
        self._spine = spine.snapshot() if hasattr(spine, "snapshot") else spine
        self._lo, self._hi = lo, hi
        self._chunk_rows = max(1, chunk_rows)
        self._bounds = self._chunk_bounds()
        self.seek(lo)

    def _chunk_bounds(self) -> list:
        batches = self._spine.batches
        if not batches:
            return []
        big = max(batches, key=len)
        rows, first = big._sparse_index()
        step = max(1, int(np.searchsorted(rows, self._chunk_rows)))
        keys = first[step::step]
        return [k.item() if isinstance(k, np.generic) else k for k in keys]

    def _load(self, lo) -> None:
        """Load the chunk starting at ``lo`` (first chunk whose range has rows)."""
        while True:
            upper = next((b for b in self._bounds if lo is None or b > lo), None)
            if self._hi is not None and (upper is None or upper > self._hi):
                upper = self._hi
            t = self._spine.range(lo, upper)
            self._chunk_hi = upper
            if t.num_rows or upper is None or (self._hi is not None and upper >= self._hi):
                break
            lo = upper
        self._table = t
        n = t.num_rows
        if n:
            keys = t.column("key")
            if pa.types.is_int64(keys.type):
                k = keys.to_numpy()
                new = np.concatenate([[True], k[1:] != k[:-1]])
            else:
                ne = pc.not_equal(keys.slice(1), keys.slice(0, n - 1))
                new = np.concatenate([[True], ne.to_numpy(zero_copy_only=False)])
            self._starts = np.append(np.flatnonzero(new), n)
        else:
            self._starts = np.zeros(1, dtype=np.int64)
        self._group = 0

    def seek(self, key) -> None:
        """Move to the first key >= ``key`` (None: the start of the range)."""
        if self._lo is not None and (key is None or key < self._lo):
            key = self._lo
        self._load(key)

    def valid(self) -> bool:
        return self._group < len(self._starts) - 1

    def key(self):
        return self._table.column("key")[int(self._starts[self._group])].as_py()

    def values(self) -> pa.Table:
        """The (val, w) rows of the current key, vals ascending."""
        a, b = int(self._starts[self._group]), int(self._starts[self._group + 1])
        return self._table.select(["val", "w"]).slice(a, b - a)

    def weight(self) -> int:
        """The summed weight of the current key over all its values."""
        return int(pc.sum(self.values().column("w")).as_py() or 0)

    def next_key(self) -> None:
        self._group += 1
        if not self.valid() and self._chunk_hi is not None and (
                self._hi is None or self._chunk_hi < self._hi):
            self._load(self._chunk_hi)

    def __iter__(self):
        while self.valid():
            yield self.key(), self.values()
            self.next_key()


class _OneBatch:
    """Adapts a single Batch to what Cursor reads (``batches`` and ``range``)."""

    def __init__(self, batch):
        self.batches = [batch] if len(batch) else []
        self._batch = batch

    def range(self, lo=None, hi=None) -> pa.Table:
        return self._batch.range(lo, hi)


def batch_cursor(batch, lo=None, hi=None, chunk_rows: int = 65536) -> Cursor:
    return Cursor(_OneBatch(batch), lo, hi, chunk_rows)
