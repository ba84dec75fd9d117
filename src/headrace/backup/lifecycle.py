"""The commit lifecycle after upload: cleanup of a committed snapshot, and the garbage sweep.

Protocol (seed 002, "Post-commit cleanup and Garbage Collection"):

1. ``upload`` writes new file blobs, then the index blob. Every one is born with a TTL deadline.
2. The caller durably records the index id (its checkpoint). Only then:
3. ``cleanup(index)``: remove the TTL of the index (which makes every blob it references
   permanent), delete the blobs of files and directories the snapshot marks removed, delete the
   previous index. Each step is idempotent, so cleanup is simply redone after a crash (restore
   and ``BackupManager.init`` redo it for the committed index).
4. ``sweep``: blobs and indexes past their deadline that no permanent or still-young index
   references are garbage of crashed or abandoned commits, and are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from headrace.backup.blobs import BlobStore
from headrace.backup.index import SnapshotIndex, blob_expiry_ms
from headrace.errors import FormatError, NotFound

log = logging.getLogger("headrace.backup")
_MAX_RELISTS = 5


def cleanup_snapshot(blobs: BlobStore, index_id: str,
                     index: SnapshotIndex | None = None) -> SnapshotIndex:
    """Post-commit cleanup of the committed snapshot ``index_id``; safe to repeat."""
    if index is None:
        index = blobs.get_index(index_id)
    blobs.remove_ttl(index_id)
    present = index.dir_index.present_blob_ids()
    removed = sorted(index.dir_index.removed_blob_ids() - present)
    blobs.delete_blobs(removed)
    prev = index.prev_snapshot_index_blob_id
    if prev is not None and prev != index_id:
        blobs.delete_index(prev)
    log.info("cleanup of %s: ttl removed, %d removed blobs deleted, previous index %s deleted",
             index_id, len(removed), prev)
    return index


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
    for index_id in live:
        try:
            referenced |= blobs.get_index(index_id).dir_index.present_blob_ids()
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
