"""Run semantics as table operations: which rows of several runs are live, and how a delta or a
merge group is written as data and replacing runs.

A **data run** (kind 0) adds its rows to the older runs'. A **replacing run** (kind 1) holds,
for every key in it, that key's complete rows as of the run: every row of the key in an older
run is dead. A key whose complete set is empty appears once as a *marker* (val empty, w 0).
Deletions (``delete_keys``) are replacing runs of markers only; an aggregate's update
(retract the old accumulator, insert the new) is one replacing row instead of two data rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.operators.kernel import ZSET_SCHEMA
from headrace.pipeline.state.layout import KIND_REPLACE
from headrace.pipeline.state.rows import distinct_sorted_keys, empty_zset, key_ids, sorted_zset


def concat(parts: list) -> pa.Table:
    """Tables and record batches (ZSET_SCHEMA) as one table, without copying."""
    batches = []
    for x in parts:
        if isinstance(x, pa.RecordBatch):
            batches.append(x)
        else:
            batches.extend(x.to_batches())
    return pa.Table.from_batches(batches, schema=ZSET_SCHEMA)


def markers(keys: pa.Array) -> pa.Table:
    """Marker rows (key, b"", 0): the key has no rows as of the replacing run holding them."""
    n = len(keys)
    return pa.Table.from_arrays([keys.cast(pa.binary()), pa.array([b""] * n, pa.binary()),
                                 pa.array(np.zeros(n, np.int64))], schema=ZSET_SCHEMA)


def sort_rows(t: pa.Table) -> pa.Table:
    """(key, val) order, one chunk per column: how a run stores its rows."""
    t = t.take(pc.sort_indices(t, [("key", "ascending"), ("val", "ascending")]))
    return t.combine_chunks()


def resolve(t: pa.Table, rpos: np.ndarray, replacing: np.ndarray):
    """The live rows of ``t`` (rows of runs at positions ``rpos``, oldest 0): a row is dead
    when a newer replacing run (``replacing`` marks its rows) holds its key; markers are
    dropped. Returns (rows, their positions)."""
    keep = np.asarray(pc.not_equal(t.column("w"), 0).to_numpy(zero_copy_only=False), bool)
    if replacing.any():
        # an id per key, then per key the newest replacing run
        ids = key_ids(t.column("key").combine_chunks())
        newest = np.full(int(ids.max()) + 1, -1, np.int64)
        np.maximum.at(newest, ids[replacing], rpos[replacing])
        keep &= rpos >= newest[ids]
    if keep.all():
        return t, rpos
    return t.filter(pa.array(keep)), rpos[keep]


def live(pieces: list[tuple], kinds, probe: pa.Array | None) -> pa.Table:
    """Live rows whose key is in ``probe`` (None: all) among ``pieces``: (rows, run position
    (oldest 0), exact — the rows are already exactly the probe's) with ``kinds[position]``
    each run's kind."""
    if not pieces:
        return empty_zset()
    loose = [(t, p) for t, p, exact in pieces if not exact]
    parts, rpos = [], []
    if loose:
        t = concat([x for x, _ in loose])
        r = np.repeat(np.asarray([p for _, p in loose], np.int64),
                      [x.num_rows for x, _ in loose])
        if probe is not None:
            m = pc.is_in(t.column("key"), value_set=probe)
            t, r = t.filter(m), r[np.asarray(m.to_numpy(zero_copy_only=False), bool)]
        parts.append(t)
        rpos.append(r)
    for t, p, exact in pieces:
        if exact:
            parts.append(t)
            rpos.append(np.full(t.num_rows, p, np.int64))
    t, r = concat(parts), np.concatenate(rpos)
    t, _ = resolve(t, r, np.asarray(kinds, np.int64)[r] == KIND_REPLACE)
    return t


def split_changes(pending: pa.Table, known: pa.Array | None, state_rows: pa.Table,
                  forced: pa.Array | None) -> tuple[pa.Table, pa.Table]:
    """A task's changes (``pending``: its inserts, not consolidated) as (replacing rows, data
    rows), each consolidated and sorted.

    ``known``: keys whose complete persisted rows the task read (``state_rows``: those rows,
    deleted keys excluded); ``forced``: keys the task deleted (their older rows must die, so
    they are always written replacing). A known key is written replacing when it has fewer
    persisted rows than the task has changes to it — an aggregate's group: one row, changed by
    a retraction and an insertion, becomes one row — as its rows after the changes (a marker if
    none is left). Any other key (a join key with thousands of rows and one new) keeps its
    changes as data rows, so a replacing run never rewrites more than the changes it replaces.
    The choice counts rows (not bytes, not order), so a retried task makes the same one."""
    if known is None and forced is None:
        return empty_zset(), sorted_zset(pending)
    n_state = state_rows.num_rows
    keys = pa.concat_arrays([state_rows.column("key").combine_chunks().cast(pa.binary()),
                             pending.column("key").combine_chunks().cast(pa.binary())])
    enc = pc.dictionary_encode(keys)
    ids = np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64)
    uniq = enc.dictionary
    n_old = np.bincount(ids[:n_state], minlength=len(uniq))
    n_new = np.bincount(ids[n_state:], minlength=len(uniq))
    chosen = np.zeros(len(uniq), bool)
    if known is not None:
        chosen = np.asarray(pc.is_in(uniq, value_set=known).to_numpy(zero_copy_only=False),
                            bool) & (n_old < n_new)
    is_forced = np.zeros(len(uniq), bool)
    if forced is not None:
        is_forced = np.asarray(pc.is_in(uniq, value_set=forced).to_numpy(
            zero_copy_only=False), bool)
        chosen |= is_forced
    rows_chosen = chosen[ids]
    rep = sorted_zset(concat([state_rows.filter(pa.array(rows_chosen[:n_state])),
                              pending.filter(pa.array(rows_chosen[n_state:]))]))
    data = sorted_zset(pending.filter(pa.array(~rows_chosen[n_state:])))
    # a marker for each replaced key left without rows that may have older ones
    need = uniq.filter(pa.array(chosen & ((n_old > 0) | is_forced)))
    if forced is not None:
        need = pa.concat_arrays([need, forced.cast(pa.binary())])
    if len(need):
        gone = need.filter(pc.invert(pc.is_in(need, value_set=rep.column("key"))))
        if len(gone):
            rep = sort_rows(concat([rep, markers(distinct_sorted_keys(gone))]))
    return rep, data


def merge_rows(t: pa.Table, rpos: np.ndarray, replacing: np.ndarray,
               oldest: bool) -> tuple[pa.Table, pa.Table]:
    """A merge group's rows as (data rows, replacing rows) of the run(s) replacing it. The
    oldest group has nothing below it to replace: all live rows become data. Otherwise the
    keys some replacing run of the group held stay replacing (with a marker if no row of
    theirs is left), so rows of those keys in older runs stay dead."""
    live, _ = resolve(t, rpos, replacing)
    data = sorted_zset(live)
    if oldest or not replacing.any():
        return data, empty_zset()
    killers = distinct_sorted_keys(t.column("key").filter(pa.array(replacing)).combine_chunks())
    in_k = pc.is_in(data.column("key"), value_set=killers)
    rep = data.filter(in_k)
    present = pc.is_in(killers, value_set=rep.column("key").combine_chunks())
    empty = killers.filter(pc.invert(present))
    if len(empty):
        rep = sort_rows(concat([rep, markers(empty)]))
    return data.filter(pc.invert(in_k)), rep
