"""The driver's side of a micro-batch's state: the tasks' page runs absorbed, the sparsest state
files repacked, one checkpoint; the options the driver's reservoir writer opens with.

Why adaptive snapshots: the reservoir keeps every checkpoint back to the last snapshot readable,
and so every file a later checkpoint killed (a bundle holds its checkpoint's section: it stays
while that checkpoint does). With a snapshot every 20 checkpoints a pipeline stored ~20 batches
of state writes whatever its live state: Nexmark q7 485 MB for 16 MB live. The pipeline reads
only the latest version and the one before (``keep_from``), so its writer snapshots as soon as
the dead files kept reach a quarter of the live bytes and outweigh the snapshot's own bytes (a
snapshot writes the whole page table: weighed against the live state, not only against its own
size, so a large state is not snapshotted every batch).

Why the repack: a state file (a batch's bundle, or a task's file) dies only when none of its
pages is live, and later batches replace most pages of a file without replacing all of them
(an expired window's straddling page, a run a merge has not reached yet). A file at most
``REPACK_LIVE_RATIO`` live has its live pages copied into the batch's checkpoint (the same page
ids and bytes: nothing a reader sees changes) and dies whole. Figures: docs/pipeline-state.md,
"Stored bytes".
"""

from __future__ import annotations

from headrace.reservoir import ReservoirOptions

# dead files kept for older checkpoints: at most about a quarter of the live state (or one
# snapshot's bytes, when more) before a snapshot lets them go
STATE_OPTIONS = ReservoirOptions(snapshot_dead_ratio=0.25)
REPACK_LIVE_RATIO = 0.5
REPACK_READ_BYTES = 32 << 20  # files read per batch at most (always at least one)


def checkpoint_runs(storage, runs, *, keep_from: int | None) -> tuple[int, int]:
    """Absorb ``runs``, repack sparse files, checkpoint; returns (version, files repacked).
    ``keep_from``: the version a restart may redo the batch from (kept readable)."""
    storage.absorb(runs)
    repacked = storage.repack_sparse(REPACK_LIVE_RATIO, REPACK_READ_BYTES)
    return storage.checkpoint(keep_from=keep_from), repacked
