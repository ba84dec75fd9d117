"""One task's changes to a state, for one bucket or all of a task's buckets at once.

Inserts and deletions (of keys, and of key ranges: state/ranges.py) wait here until
``write``; lookups record what they read (their probe keys and the persisted live rows of
those keys) so that the write can store a key the task knows whole as its complete new rows
in a replacing run (state/resolve.py) instead of a retraction plus an insertion.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.state import ranges as deleted_ranges
from headrace.pipeline.state.resolve import concat, split_changes
from headrace.pipeline.state.zset import (
    binary_keys,
    check_zset,
    consolidate,
    distinct_sorted_keys,
    empty_zset,
)


class Changes:
    def __init__(self):
        self.pending: list[pa.Table] = []  # inserts, minus rows of keys deleted after them
        self.deleted: pa.Array | None = None  # deleted keys (sorted, distinct)
        self.ranges: list[tuple[bytes, bytes]] = []  # deleted [lo, hi) ranges (union)
        self._probes: list[pa.Array] = []
        self._found: list[pa.Table] = []

    def insert(self, updates: pa.Table) -> None:
        t = check_zset(updates)
        if t.num_rows:
            self.pending.append(t)
            if len(self.pending) > 16:
                self.pending = [concat(self.pending).combine_chunks()]

    def delete(self, keys) -> None:
        keys = binary_keys(keys, "deleted keys")
        if len(keys) == 0:
            return
        u = distinct_sorted_keys(keys)
        kept = [t.filter(pc.invert(pc.is_in(t.column("key"), value_set=u)))
                for t in self.pending]
        self.pending = [t for t in kept if t.num_rows]
        if self.deleted is not None:
            u = distinct_sorted_keys(pa.concat_arrays([self.deleted, u]))
        self.deleted = u

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        """Keys in [lo, hi): pending rows go now, persisted ones at write (a deleted range);
        deleted keys in it need no marker of their own."""
        lo, hi = deleted_ranges.check_range(lo, hi)
        if not lo < hi:
            return
        self.pending = [t for t in (deleted_ranges.mask(t, [(lo, hi)]) for t in self.pending)
                        if t.num_rows]
        if self.deleted is not None:
            hit = deleted_ranges.in_ranges(self.deleted, [(lo, hi)])
            if hit is not None:
                left = self.deleted.filter(pa.array(~hit))
                self.deleted = left if len(left) else None
        self.ranges = deleted_ranges.union([*self.ranges, (lo, hi)])

    def record(self, probe: pa.Array, found: pa.Table) -> None:
        """A lookup of ``probe`` (distinct keys) read ``found``: every persisted live row of
        those keys (deleted keys excluded)."""
        self._probes.append(probe)
        self._found.append(found)

    def pending_of(self, probe: pa.Array) -> list[pa.Table]:
        return [t.filter(pc.is_in(t.column("key"), value_set=probe)) for t in self.pending]

    def drop_deleted(self, t: pa.Table) -> pa.Table:
        t = deleted_ranges.mask(t, self.ranges)
        if self.deleted is None or t.num_rows == 0:
            return t
        return t.filter(pc.invert(pc.is_in(t.column("key"), value_set=self.deleted)))

    def all_pending(self) -> pa.Table:
        return concat([empty_zset(), *self.pending])

    def split(self, replacing: bool) -> tuple[pa.Table, pa.Table]:
        """The changes as (replacing rows, data rows), consolidated (state/resolve.py).
        ``replacing`` False (no older runs to replace): everything is data."""
        pending = self.all_pending()
        if not replacing:
            return empty_zset(), consolidate(pending)
        known = state = None
        if self._probes:
            known = distinct_sorted_keys(pa.concat_arrays(self._probes))
            founds = [self._found[0]]
            for i in range(1, len(self._found)):  # a key looked up twice counts once
                seen = pa.concat_arrays(self._probes[:i])
                f = self._found[i]
                founds.append(f.filter(pc.invert(pc.is_in(f.column("key"), value_set=seen))))
            state = self.drop_deleted(concat(founds))
        return split_changes(pending, known, state if state is not None else empty_zset(),
                             self.deleted)

    def clear(self) -> None:
        self.__init__()
