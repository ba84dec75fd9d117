"""Compaction (repack sparse files) and the orphan sweep.

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

from headrace.codec import crc64
from headrace.errors import ChecksumMismatch
from headrace.reservoir.keys import bundle_id, parse_checkpoint_name, parse_data_name

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
        state = s._state
        pending = np.fromiter(s._committed.keys(), np.int64, len(s._committed))
        moved = 0
        for fid in cands:
            row = state.files[fid]
            data = s.source.read_whole(fid)
            actual = crc64(memoryview(data)[:row.size]) if len(data) >= row.size else -1
            if actual != row.crc64:
                raise ChecksumMismatch(s.source.key(fid), 0, "crc64 of data file (compaction)",
                                       expected=row.crc64, actual=max(actual, 0))
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
        s._stats["compacted_files"] = s._stats.get("compacted_files", 0) + len(cands)
        s._stats["compacted_pages"] = s._stats.get("compacted_pages", 0) + moved
        log.info("compacting %d files (%d live pages)", len(cands), moved)
        return s._checkpoint_locked()


def sweep_orphans(s: ReservoirStorage, grace_s: float, now: float) -> list[str]:
    """Delete unreferenced objects older than ``grace_s``; returns their keys."""
    with s._ckpt_lock:
        with s._lock:
            state = s._state
            referenced = state.referenced_file_ids() | set(s._new_files)
            referenced |= {loc[0].file_id for loc in s._committed.values() if loc is not None}
            retained = set(state.registry.versions.tolist())
            latest = state.version
        doomed: list[str] = []
        for m in s.store.list(f"{s.prefix}/data/"):
            fid = parse_data_name(m.key)
            if fid is None or fid in referenced or now - m.last_modified < grace_s:
                continue
            doomed.append(m.key)
        for m in s.store.list(f"{s.prefix}/ckpt/"):
            parsed = parse_checkpoint_name(m.key)
            if parsed is None or now - m.last_modified < grace_s:
                continue
            v, _snap, is_bundle = parsed
            if v in retained or (is_bundle and bundle_id(v) in referenced):
                continue
            if v > latest or v not in retained:
                doomed.append(m.key)
        if doomed:
            s.store.delete_many(doomed)
            log.info("swept %d orphaned objects under %s", len(doomed), s.prefix)
        return doomed
