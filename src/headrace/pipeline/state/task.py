"""TaskState: the buckets one task holds, for one (operator, side), as one StateSpine.

A task holds several buckets (``buckets`` > ``partitions``). Running the kernel once per bucket
paid its fixed cost (~10 ms of Arrow calls for an aggregate) and the state's once per bucket:
at 32 buckets that was most of a micro-batch. A TaskState lets the kernel run once over the
task's whole delta: each state key goes to its bucket's BucketLSM by a ``Router`` built from the
delta (the kernel names the state keys each delta row touches; the row's ``BUCKET`` column says
where they live), and the Arrow work on the rows read and written — membership, replacement,
consolidation — runs once over all buckets. Per bucket remain only what is per bucket: its
root, its fences and pages, its runs and merges.

Keys never span buckets, so the union is exact: every bucket sees the same reads and writes as
if the kernel had run on it alone.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import FormatError
from headrace.pipeline.operators.kernel import KeyDeletingState, RangeDeletingState, ReplacingState
from headrace.pipeline.state.changes import Changes
from headrace.pipeline.state.lsm import BucketLSM, WriteStats
from headrace.pipeline.state.resolve import concat, live
from headrace.pipeline.state.rows import binary_keys, distinct_sorted_keys, empty_zset, sorted_zset


class Router:
    """State key -> bucket, for the keys a task's delta rows touch."""

    def __init__(self, routes: list[tuple[pa.Array, np.ndarray]]):
        """``routes``: (keys, bucket of each key) pairs; a null key is skipped (a row that
        touches no state, e.g. a join row with a NULL key)."""
        keys = [k for k, _ in routes]
        buckets = np.concatenate([np.asarray(b, np.int64) for _, b in routes]) if routes \
            else np.zeros(0, np.int64)
        all_keys = (pa.concat_arrays([binary_keys_or_nulls(k) for k in keys]) if keys
                    else pa.array([], pa.binary()))
        valid = np.asarray(all_keys.is_valid().to_numpy(zero_copy_only=False), bool)
        all_keys, buckets = all_keys.filter(pa.array(valid)), buckets[valid]
        enc = pc.dictionary_encode(all_keys)
        ids = np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64)
        self.keys = enc.dictionary
        self.buckets = np.full(len(self.keys), -1, np.int64)
        self.buckets[ids] = buckets
        clash = np.flatnonzero(self.buckets[ids] != buckets)
        if len(clash):
            i = int(clash[0])
            raise FormatError(None, None, f"state key {all_keys[i].as_py()!r} belongs to two "
                                          f"buckets ({int(buckets[i])} and "
                                          f"{int(self.buckets[ids[i]])}): the bucket hash and "
                                          "the key encoding disagree")

    def route(self, keys: pa.Array) -> np.ndarray:
        if len(keys) == 0:
            return np.zeros(0, np.int64)
        idx = pc.index_in(keys, value_set=self.keys)
        if idx.null_count:
            bad = keys.filter(pc.is_null(idx))[0].as_py()
            raise FormatError(None, None, f"state key {bad!r} is not one the task's delta "
                                          "touches: the kernel's route_keys missed it")
        return self.buckets[np.asarray(idx.to_numpy(zero_copy_only=False), np.int64)]


def binary_keys_or_nulls(keys) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    return keys if keys.type == pa.binary() else keys.cast(pa.binary())


class TaskState(ReplacingState, KeyDeletingState, RangeDeletingState):
    """StateSpine over ``lsms`` (bucket -> BucketLSM of one operator side)."""

    def __init__(self, lsms: dict[int, BucketLSM], router: Router | None):
        """``router`` None: one bucket, every key is its."""
        if router is None and len(lsms) != 1:
            raise ValueError("a TaskState over several buckets needs a router")
        self.lsms = lsms
        self.router = router
        self._changes = Changes()

    def _buckets(self, keys: pa.Array) -> np.ndarray:
        if self.router is None:
            return np.full(len(keys), next(iter(self.lsms)), np.int64)
        return self.router.route(keys)

    def lookup_many(self, keys) -> pa.Table:
        keys = binary_keys(keys)
        if len(keys) == 0:
            return empty_zset()
        probe = distinct_sorted_keys(keys)
        where = self._buckets(probe)
        pieces: list[tuple] = []
        kinds: list[int] = []
        for b, sub in _by_bucket_keys(probe, where):
            lsm = self.lsms[b]
            base = len(kinds)  # positions of different buckets never meet: keys differ
            pieces += [(t, base + p, exact) for t, p, exact in lsm.pages_for(sub)]
            kinds += lsm.kinds
        found = self._changes.drop_deleted(live(pieces, kinds, probe))
        self._changes.record(probe, found)
        return sorted_zset(concat([found, *self._changes.pending_of(probe)]))

    def insert_updates(self, updates: pa.Table) -> None:
        self._changes.insert(updates)

    def replace_rows(self, keys, rows: pa.Table) -> None:
        """The complete rows of ``keys`` are now ``rows`` (operators.kernel.replace_rows)."""
        self._changes.replace(keys, rows, self.lookup_many)

    def delete_keys(self, keys) -> None:
        self._changes.delete(keys)

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        """[lo, hi) deleted in every bucket of the task (BucketLSM.delete_range)."""
        self._changes.delete_range(lo, hi)

    def write(self, writer) -> WriteStats:
        """Each changed bucket's runs and root through ``writer``; one split and one
        consolidation of the task's changes for all of them."""
        total = WriteStats()
        older = any(lsm.root.runs for lsm in self.lsms.values())  # else nothing to replace
        rep, data = self._changes.split(replacing=older)
        parts = [_by_bucket(t, self._buckets(t.column("key").combine_chunks()))
                 for t in (rep, data)]
        ranges = self._changes.ranges
        for b, lsm in self.lsms.items():
            r, d = parts[0].get(b), parts[1].get(b)
            if r is None and d is None and not (ranges and lsm.root.runs):
                continue
            total.add(lsm.write_delta(writer, r if r is not None else empty_zset(),
                                      d if d is not None else empty_zset(), ranges))
        self._changes.clear()
        return total


def _by_bucket_keys(keys: pa.Array, where: np.ndarray):
    """(bucket, its keys in their order) for sorted ``keys``."""
    if len(np.unique(where)) == 1:
        yield int(where[0]), keys
        return
    order = np.argsort(where, kind="stable")
    keys = keys.take(pa.array(order))
    where = where[order]
    starts = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
    ends = np.r_[starts[1:], len(where)]
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(where[a]), keys.slice(a, b - a)


def _by_bucket(t: pa.Table, where: np.ndarray) -> dict[int, pa.Table]:
    """Rows of ``t`` per bucket, each keeping ``t``'s order."""
    if t.num_rows == 0:
        return {}
    order = np.argsort(where, kind="stable")
    t = t.take(pa.array(order)).combine_chunks()
    where = where[order]
    starts = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
    ends = np.r_[starts[1:], len(where)]
    return {int(where[a]): t.slice(a, b - a) for a, b in zip(starts, ends, strict=True)}
