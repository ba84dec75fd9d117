"""The commit lifecycle after upload: cleanup of a committed snapshot, and the garbage sweep.

Protocol (Samza's blob-store backup, "Post-commit cleanup and Garbage Collection"):

1. ``upload`` writes new file blobs, then the index blob. Every one is born with a TTL deadline.
2. The caller durably records the index id (its checkpoint). Only then:
3. ``cleanup(index)``: remove the TTL of the index (which makes every blob it references
   permanent), delete the blobs of files and directories the snapshot marks removed, delete the
   previous index -- never a blob another committed index uses, nor a previous index another
   committed index keeps; an index with ``keepPrevious`` marks its previous one permanent and
   deletes nothing. Each step is idempotent, so cleanup is simply redone after a crash
   (restore and ``BackupManager.init`` redo it for the committed index).
4. ``sweep``: blobs and indexes past their deadline that no permanent or still-young index
   (or an index such an index keeps) references are garbage of crashed or abandoned commits,
   and are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from headrace.backup.blobs import BlobStore
from headrace.backup.index import SnapshotIndex, blob_expiry_ms
from headrace.errors import FormatError, NotFound

log = logging.getLogger("headrace.backup")
_MAX_RELISTS = 5


def cleanup_snapshot(blobs: BlobStore, index_id: str, index: SnapshotIndex | None = None,
                     known: dict[str, SnapshotIndex] | None = None) -> SnapshotIndex:
    """Post-commit cleanup of the committed snapshot ``index_id`` (see ``cleanup_counted``)."""
    return cleanup_counted(blobs, index_id, index, known)[0]


def cleanup_counted(blobs: BlobStore, index_id: str, index: SnapshotIndex | None = None,
                    known: dict[str, SnapshotIndex] | None = None) -> tuple[SnapshotIndex, int]:
    """Post-commit cleanup of the committed snapshot ``index_id``; safe to repeat.

    Nothing a *kept* snapshot needs is deleted: a kept snapshot is any other committed
    (permanent) index, and the previous one when this index or another committed index says
    ``keepPrevious``. ``known`` holds indexes the caller already has (saves their GETs)."""
    if index is None:
        index = blobs.get_index(index_id)
    prev = index.prev_snapshot_index_blob_id
    if index.keep_previous and prev is not None:
        # the previous one is a branch point the caller named: it stays, permanent (marked
        # before this one, so no moment has this one committed and its previous expiring)
        blobs.remove_ttl(prev)
        blobs.remove_ttl(index_id)
        log.info("cleanup of %s: ttl removed, previous index %s kept", index_id, prev)
        return index, 0
    blobs.remove_ttl(index_id)
    present = index.dir_index.present_blob_ids()
    removed = index.dir_index.removed_blob_ids() - present
    if not removed and prev is None:
        return index, 0
    # other committed snapshots (branches, snapshots kept by `--previous`) keep their blobs
    kept = sorted(set(blobs.list_ids("permanent")) - {index_id, prev})
    protected: set[str] = set()
    retire_prev = prev is not None and prev != index_id
    for other_id in kept:
        other = (known or {}).get(other_id)
        if other is None:
            try:
                other = blobs.get_index(other_id)
            except NotFound:
                continue  # a marker without its index: references nothing
        protected |= other.dir_index.present_blob_ids()
        if other.keep_previous and other.prev_snapshot_index_blob_id == prev:
            retire_prev = False
    if prev is not None and not retire_prev and prev != index_id:
        prev_index = (known or {}).get(prev)
        try:
            prev_index = prev_index or blobs.get_index(prev)
            protected |= prev_index.dir_index.present_blob_ids()
        except NotFound:
            pass
    doomed = sorted(removed - protected)
    blobs.delete_blobs(doomed)
    if retire_prev:
        blobs.delete_index(prev)
    log.info("cleanup of %s: ttl removed, %d removed blobs deleted (%d kept for other "
             "snapshots), previous index %s %s", index_id, len(doomed),
             len(removed) - len(doomed), prev, "deleted" if retire_prev else "kept")
    return index, len(doomed)


@dataclass(frozen=True)
class SweepReport:
    indexes_live: int
    indexes_deleted: int
    markers_deleted: int
    blobs_live: int
    blobs_deleted: int
    blobs_young: int  # unreferenced but inside their TTL (maybe an upload in progress)


def sweep(blobs: BlobStore, *, dry_run: bool = False, attempt: int = 0) -> SweepReport:
    """Delete expired blobs and indexes that no live index references.

    A live index is a permanent one (committed) or one still inside its TTL (maybe about to be
    committed). An unreadable live index stops the sweep before anything is deleted: its
    references are unknown, and deleting on a guess could destroy a committed snapshot.
    """
    now = blobs.clock.now_ms()
    index_ids = set(blobs.list_ids("index"))
    markers = set(blobs.list_ids("permanent"))
    live = sorted(i for i in index_ids if i in markers or blob_expiry_ms(i) > now)
    dead_indexes = sorted(i for i in index_ids if i not in markers and blob_expiry_ms(i) <= now)
    referenced: set[str] = set()
    todo = list(live)
    live_set = set(live)
    while todo:
        index_id = todo.pop()
        try:
            index = blobs.get_index(index_id)
            referenced |= index.dir_index.present_blob_ids()
            kept = index.prev_snapshot_index_blob_id if index.keep_previous else None
            if kept is not None and kept in index_ids and kept not in live_set:
                # a live index keeps its previous one: that snapshot is live too, even with
                # its marker lost and its TTL passed
                live_set.add(kept)
                todo.append(kept)
        except NotFound:
            # a cleanup deleted it after we listed: its successor (which may retain its blobs)
            # could be newer than our listing, so list again rather than guess
            if attempt >= _MAX_RELISTS:
                raise
            log.info("sweep: index %s vanished while sweeping, listing again", index_id)
            return sweep(blobs, dry_run=dry_run, attempt=attempt + 1)
        except FormatError as e:
            raise FormatError(e.key, e.offset, f"sweep stopped, nothing deleted: live index "
                                               f"{index_id} is unreadable: {e.what}") from e
    live = sorted(live_set)
    dead_indexes = [i for i in dead_indexes if i not in live_set]
    # list blobs after reading the live indexes: a blob uploaded meanwhile is young anyway
    blob_ids = blobs.list_ids("blobs")
    dead_blobs = [b for b in blob_ids if b not in referenced and blob_expiry_ms(b) <= now]
    young = sum(1 for b in blob_ids if b not in referenced and blob_expiry_ms(b) > now)
    orphan_markers = sorted(markers - index_ids)
    if not dry_run:
        for index_id in dead_indexes:
            blobs.delete_index(index_id)
        for marker in orphan_markers:
            blobs.delete_index(marker)
        blobs.delete_blobs(dead_blobs)
    report = SweepReport(len(live), len(dead_indexes), len(orphan_markers),
                         len(blob_ids) - len(dead_blobs) - young, len(dead_blobs), young)
    log.info("sweep%s: %s", " (dry run)" if dry_run else "", report)
    return report
