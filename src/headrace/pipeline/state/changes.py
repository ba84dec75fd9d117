"""One task's changes to a state, for one bucket or all of a task's buckets at once.

Inserts and deletions (of keys, and of key ranges: state/ranges.py) wait here until
``write``; lookups record what they read (their probe keys and the persisted live rows of
those keys) so that the write can store a key the task knows whole as its complete new rows
in a replacing run (state/resolve.py) instead of a retraction plus an insertion.

``replace`` says that outright: a kernel that looked keys up and computed their complete new
rows (an aggregate's accumulators) hands those rows over, and the write stores them as the
replacing run as they are — no retraction rows, no consolidation of old and new. Why: that
consolidation, a (key, val) sort of three rows per changed group, was a quarter of an aggregate
task's CPU. Any other change that meets the replaced keys later turns the replacement back into
its retraction plus insertion first (``_materialise``), so every path stays exact.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.operators.kernel import replaced_by
from headrace.pipeline.state import ranges as deleted_ranges
from headrace.pipeline.state.resolve import concat, markers, sort_rows, split_changes
from headrace.pipeline.state.rows import (
    binary_keys,
    check_zset,
    distinct_sorted_keys,
    empty_zset,
    sorted_zset,
)


class Changes:
    def __init__(self):
        self.pending: list[pa.Table] = []  # inserts, minus rows of keys deleted after them
        self.deleted: pa.Array | None = None  # deleted keys (sorted, distinct)
        self.ranges: list[tuple[bytes, bytes]] = []  # deleted [lo, hi) ranges (union)
        self._probes: list[pa.Array] = []
        self._found: list[pa.Table] = []
        self.replaced: list[tuple[pa.Array, pa.Table]] = []  # (keys, their complete rows)

    @property
    def any(self) -> bool:
        """Whether rows are waiting to be written (inserted or replacing)."""
        return bool(self.pending or self.replaced)

    def replace(self, keys, rows: pa.Table, lookup) -> None:
        """The complete rows of ``keys`` (distinct) are now ``rows`` (a consolidated Z-set of
        those keys only, any order). Stored as they are when every key was looked up and
        nothing pending or deleted meets them; otherwise as the retraction of what
        ``lookup(keys)`` (the spine's ``lookup_many``) returns now, plus ``rows``."""
        keys = binary_keys(keys, "replaced keys")
        rows = check_zset(rows, "replacing rows")
        if rows.num_rows and not pc.all(pc.is_in(rows.column("key"), value_set=keys)).as_py():
            raise ValueError("replacing rows hold a key that is not replaced")
        if len(keys) == 0:
            return
        probed = pa.concat_arrays(self._probes) if self._probes else None
        fast = (probed is not None and self.deleted is None and not self.ranges
                and pc.all(pc.is_in(keys, value_set=probed)).as_py()
                and not any(pc.any(pc.is_in(t.column("key"), value_set=keys)).as_py()
                            for t in self.pending)
                and not any(pc.any(pc.is_in(k, value_set=keys)).as_py()
                            for k, _ in self.replaced))
        if fast:
            self.replaced.append((keys, rows))
        else:
            self.insert(replaced_by(lookup(keys), rows))

    def _found_once(self) -> pa.Table:
        """Every persisted row the lookups read, each key's from its first lookup (a key
        looked up twice counts once)."""
        founds = self._found[:1]
        for i in range(1, len(self._found)):
            seen = pa.concat_arrays(self._probes[:i])
            f = self._found[i]
            founds.append(f.filter(pc.invert(pc.is_in(f.column("key"), value_set=seen))))
        return concat([empty_zset(), *founds])

    def _found_of(self, keys: pa.Array, found: pa.Table | None = None) -> pa.Table:
        """The persisted rows the lookups read for ``keys`` (out of ``found``, the
        ``_found_once`` of a caller that asks for several key sets)."""
        found = self._found_once() if found is None else found
        return found.filter(pc.is_in(found.column("key"), value_set=keys))

    def _as_changes(self) -> list[pa.Table]:
        """The replacements as the retraction of their found rows plus their rows."""
        found = self._found_once()
        return [replaced_by(self._found_of(keys, found), rows) for keys, rows in self.replaced]

    def _materialise(self) -> None:
        """Replacements become pending changes (before a change that may meet them)."""
        changes, self.replaced = self._as_changes(), []
        for t in changes:
            self.insert(t)

    def insert(self, updates: pa.Table) -> None:
        self._materialise()
        t = check_zset(updates)
        if t.num_rows:
            self.pending.append(t)
            if len(self.pending) > 16:
                self.pending = [concat(self.pending).combine_chunks()]

    def delete(self, keys) -> None:
        keys = binary_keys(keys, "deleted keys")
        if len(keys) == 0:
            return
        self._materialise()
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
        self._materialise()
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
        return [t.filter(pc.is_in(t.column("key"), value_set=probe))
                for t in [*self.pending, *self._as_changes()]]

    def drop_deleted(self, t: pa.Table) -> pa.Table:
        t = deleted_ranges.mask(t, self.ranges)
        if self.deleted is None or t.num_rows == 0:
            return t
        return t.filter(pc.invert(pc.is_in(t.column("key"), value_set=self.deleted)))

    def all_pending(self) -> pa.Table:
        return concat([empty_zset(), *self.pending, *self._as_changes()])

    def split(self, replacing: bool) -> tuple[pa.Table, pa.Table]:
        """The changes as (replacing rows, data rows), consolidated (state/resolve.py).
        ``replacing`` False (no older runs to replace): everything is data."""
        if self.replaced:
            return self._split_replaced(replacing)
        pending = self.all_pending()
        if not replacing:
            return empty_zset(), sorted_zset(pending)
        known = state = None
        if self._probes:
            known = distinct_sorted_keys(pa.concat_arrays(self._probes))
            state = self.drop_deleted(self._found_once())
        return split_changes(pending, known, state if state is not None else empty_zset(),
                             self.deleted)

    def _split_replaced(self, replacing: bool) -> tuple[pa.Table, pa.Table]:
        """``split`` with replacements: their rows are the replacing run's as they are (a
        marker for a key left without rows that had some); the rest splits as usual."""
        keys = pa.concat_arrays([k for k, _ in self.replaced])
        rows = concat([r for _, r in self.replaced])
        self.replaced = []
        if not replacing:  # nothing older: the rows are data like the pending ones
            return empty_zset(), sorted_zset(concat([rows, *self.pending]))
        rep, data = self.split(replacing) if self.pending else (empty_zset(), empty_zset())
        gone = keys.filter(pc.invert(pc.is_in(keys, value_set=rows.column("key"))))
        if len(gone):
            had = self._found_of(gone).column("key")
            gone = gone.filter(pc.is_in(gone, value_set=had))
        parts = [t for t in (rows, markers(gone) if len(gone) else None, rep)
                 if t is not None and t.num_rows]
        return (sort_rows(concat(parts)) if parts else empty_zset()), data

    def clear(self) -> None:
        Changes.__init__(self)

