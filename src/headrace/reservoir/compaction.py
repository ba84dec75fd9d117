"""Compaction (repack sparse files), the per-checkpoint repack of the sparsest, and the orphan
sweep.

Compaction picks files whose live bytes are below ``compaction_ratio_threshold`` of
``max_file_size``, verifies each file's CRC64, and copies its live pages into the shared merged
writer (so they are packed into full files, or bundled with the next checkpoint). The checkpoint
that follows remaps the pages; the old files become fully non-active and are marked deleted at
that version; they are physically deleted once no retained checkpoint references them. Reads
for compaction use the cache when the file is there but never fill it.

The sweep deletes objects under the stream's prefix that nothing references and that are older
than the grace period: files of tasks that failed before their run was absorbed, data files of
writers that crashed before their checkpoint, checkpoint objects a crash left behind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from headrace.errors import NotFound
from headrace.reservoir.errors import ConcurrentWriter
from headrace.reservoir.keys import bundle_id, parse_checkpoint_name, parse_data_name, registry_key

if TYPE_CHECKING:
    from headrace.reservoir.storage import ReservoirStorage

log = logging.getLogger("headrace.reservoir")


def compaction_candidates(s: ReservoirStorage) -> list[int]:
    state = s._state
    limit = s.opts.compaction_ratio_threshold * s.opts.max_file_size
    rows = [r for r in state.files.values() if r.live_bytes < limit]
    if len(rows) == 1 and rows[0].non_active == 0:
        return []  # one small file with nothing dead: rewriting it gains nothing
    return sorted(r.file_id for r in rows)


def compact(s: ReservoirStorage) -> int | None:
    with s._ckpt_lock, s._lock:
        cands = compaction_candidates(s)
        if not cands:
            return None
        moved = _copy_live(s, cands)
        log.info("compacting %d files (%d live pages)", len(cands), moved)
        return s._checkpoint_locked()


def repack_sparse(s: ReservoirStorage, max_live_ratio: float, max_read_bytes: int) -> int:
    """Copy the live pages of files at most ``max_live_ratio`` live (by their own size, not
    ``max_file_size``: a writer whose checkpoints are small bundles keeps them small) into the
    merged writer, the most dead first, reading at most ``max_read_bytes`` of files (always at
    least one); the caller's next checkpoint makes it durable and lets the files go. Returns the
    files chosen. A file with nothing dead is never chosen: copying it gains nothing."""
    with s._ckpt_lock, s._lock:
        rows = sorted((r for r in s._state.files.values()
                       if r.non_active and r.live_bytes <= max_live_ratio * r.size),
                      key=lambda r: (r.live_bytes / max(r.size, 1), r.file_id))
        chosen, budget = [], max_read_bytes
        for r in rows:
            if chosen and r.size > budget:
                continue
            chosen.append(r.file_id)
            budget -= r.size
        if chosen:
            moved = _copy_live(s, chosen)
            s._stats["repacked_files"] = s._stats.get("repacked_files", 0) + len(chosen)
            log.debug("repacking %d sparse files (%d live pages)", len(chosen), moved)
        return len(chosen)


def _copy_live(s: ReservoirStorage, fids: list[int]) -> int:
    """Copy the live pages of ``fids`` (not rewritten or deleted since the last checkpoint) into
    the merged writer; returns how many. Holds the storage's locks."""
    state = s._state
    pending = np.fromiter(s._committed.keys(), np.int64, len(s._committed))
    moved = 0
    for fid in fids:
        row = state.files[fid]
        data = s.source.read_whole(fid, row.size, row.crc64)  # CRC64-checked, healed
        mask = state.fids == np.uint64(fid)
        if len(pending):
            mask &= ~np.isin(state.ids, pending)
        ids, offs = state.ids[mask], state.offs[mask]
        order = np.argsort(offs, kind="stable")  # source order: runs copy in one slice
        ids, offs = ids[order], offs[order]
        sizes, crcs = state.sizes[mask][order], state.crcs[mask][order]
        for pid, loc in s._add_leftovers(ids, offs, sizes, crcs, data):
            s._committed[pid] = loc
        moved += len(ids)
    s._stats["compacted_files"] = s._stats.get("compacted_files", 0) + len(fids)
    s._stats["compacted_pages"] = s._stats.get("compacted_pages", 0) + moved
    return moved


def sweep_orphans(s: ReservoirStorage, grace_s: float, now: float) -> list[str]:
    """Delete unreferenced objects older than ``grace_s``; returns their keys.

    A writer another writer has overtaken knows nothing of the newer checkpoints' objects, so the
    sweep first checks this writer is still the latest (the checkpoint LIST it needs anyway, or
    the registry's etag) and raises ConcurrentWriter instead of deleting them.
    """
    with s._ckpt_lock:
        with s._lock:
            state = s._state
            referenced = state.referenced_file_ids() | set(s._new_files)
            referenced |= {loc[0].file_id for loc in s._committed.values() if loc is not None}
            retained = set(state.registry.versions.tolist())
            known = dict(s._ckpt_keys)
            latest = state.version
            etag = s._registry_etag
        ckpts = s.retry.call(lambda: list(s.store.list(f"{s.prefix}/ckpt/")),
                             what="list checkpoints")
        if not s.bundled_registry:
            try:
                current = s.retry.call(lambda: s.store.head(registry_key(s.prefix)).etag,
                                       what="head registry")
            except NotFound:
                current = None
            if current != etag:
                raise ConcurrentWriter(f"the registry of {s.prefix!r} was changed by another "
                                       "writer; not sweeping (reset() or reopen)")
        doomed: list[str] = []
        for m in ckpts:
            parsed = parse_checkpoint_name(m.key)
            if parsed is None:
                continue
            v, _snap, is_bundle = parsed
            if s.bundled_registry and v > latest:
                raise ConcurrentWriter(f"checkpoint {m.key!r} is newer than this writer's "
                                       f"{latest}: another writer is ahead; not sweeping")
            if now - m.last_modified < grace_s:
                continue
            if v in retained and known.get(v, m.key) == m.key:
                continue
            if is_bundle and bundle_id(v) in referenced and known.get(v, m.key) == m.key:
                continue
            doomed.append(m.key)
        for m in s.store.list(f"{s.prefix}/data/"):
            fid = parse_data_name(m.key)
            if fid is None or fid in referenced or now - m.last_modified < grace_s:
                continue
            doomed.append(m.key)
        if doomed:
            s.store.delete_many(doomed)
            log.info("swept %d orphaned objects under %s", len(doomed), s.prefix)
        return doomed
