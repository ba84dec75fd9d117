"""Compaction (bound the parts list) and the sweep (collect blobs no state references).

Compaction protocol: (1) pick the run of adjacent parts (by lower) with the smallest total size
that brings the count back to ``max_parts``; (2) read them, advance times below since to since
(clamped into the run's bounds), consolidate per (row, time) and drop zero diffs; (3) upload the
result as a new part; (4) CAS: if every input part is still linked, replace them with the new part,
else give up (a concurrent compaction won). Inputs are not deleted here: a reader that fetched the
old state may be reading them. The sweep deletes parts no retained state references and older
than a grace period, so a crash at any step leaks nothing for long.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import pyarrow as pa

from headrace.persist import parts as P
from headrace.persist.handles import read_parts_parallel
from headrace.persist.state import PartMeta, ShardState

log = logging.getLogger("headrace.persist")


@dataclass(frozen=True)
class CompactionResult:
    parts_in: int = 0
    rows_in: int = 0
    rows_out: int = 0
    applied: bool = False


@dataclass(frozen=True)
class SweepResult:
    shards: int = 0
    parts_deleted: int = 0
    bytes_deleted: int = 0
    versions_truncated: int = 0


def choose_run(parts: tuple[PartMeta, ...], max_parts: int) -> list[PartMeta]:
    if len(parts) <= max_parts:
        return []
    ordered = sorted(parts, key=lambda p: (p.lower, p.upper, p.key))
    width = max(2, len(ordered) - max_parts + 1)
    sizes = [p.size for p in ordered]
    best, best_at = None, 0
    window = sum(sizes[:width])
    for i in range(len(ordered) - width + 1):
        if i:
            window += sizes[i + width - 1] - sizes[i - 1]
        if best is None or window < best:
            best, best_at = window, i
    return ordered[best_at: best_at + width]


def compact(client, shard: str, *, max_parts: int = 8) -> CompactionResult:
    """Merge parts until at most ``max_parts`` remain; snapshot(t) is unchanged for t >= since."""
    if max_parts < 1:
        raise ValueError("max_parts must be >= 1")
    machine = client.machine(shard)
    state = machine.fetch()
    run = choose_run(state.parts, max_parts)
    if not run:
        return CompactionResult()
    lower, upper = min(p.lower for p in run), max(p.upper for p in run)
    tables = read_parts_parallel(client.store, run)
    cols = P.schema_from_text(state.schema).names + [P.TIME, P.DIFF] if state.schema else None
    merged = pa.concat_tables([t.select(cols) if cols else t for t in tables])
    floor = min(state.since, upper - 1)
    if floor > 0:
        merged = P.advance_times(merged, floor)
    out = P.consolidate(merged, keep_time=True)
    out = out.select(P.data_columns(out.schema) + [P.TIME, P.DIFF])
    new_part = P.write_part(client.store, client.root, shard, out, lower, upper)
    keys = {p.key for p in run}

    def step(s: ShardState):
        if not keys <= {p.key for p in s.parts}:
            return None
        kept = tuple(p for p in s.parts if p.key not in keys)
        return replace(s, parts=tuple(sorted(kept + (new_part,), key=lambda p: (p.lower, p.key))))

    after = machine.apply(step)
    applied = new_part in after.parts
    if not applied:
        P.delete_quietly(client.store, [new_part.key])
    log.info("shard %s: compacted %d parts (%d rows) into 1 (%d rows), applied=%s", shard,
             len(run), merged.num_rows, out.num_rows, applied)
    return CompactionResult(len(run), merged.num_rows, out.num_rows, applied)


def sweep(client, *, grace_s: float = 600.0, dry_run: bool = False,
          keep_versions: int = 128) -> SweepResult:
    """Delete unreferenced parts older than ``grace_s`` and truncate old consensus versions."""
    now_s = client.clock.now_ms() / 1000 if hasattr(client.clock, "now_ms") else time.time()
    shards = parts_deleted = bytes_deleted = truncated = 0
    for shard in client.list_shards():
        shards += 1
        state = client.machine(shard).fetch()
        referenced = {p.key for p in state.parts}
        doomed = [m for m in client.store.list(f"{client.root}/{shard}/parts/")
                  if m.key not in referenced and now_s - m.last_modified >= grace_s]
        if doomed and not dry_run:
            client.store.delete_many([m.key for m in doomed])
        parts_deleted += len(doomed)
        bytes_deleted += sum(m.size for m in doomed)
        if not dry_run:
            truncated += client.truncate_log(shard, keep_versions)
    log.info("sweep: %d shards, %d parts (%d bytes) deleted, %d versions truncated", shards,
             parts_deleted, bytes_deleted, truncated)
    return SweepResult(shards, parts_deleted, bytes_deleted, truncated)
