"""Compaction (bound the parts list) and the sweep (collect blobs no state references).

Compaction protocol: (1) pick the run of adjacent parts (by lower) with the smallest total size
that brings the count back to ``max_parts``, never the newest batch's parts (so a replay of the
last batch can always be compared with what was written: see ``PartMeta.floor``); (2) read them
(an input missing and no longer linked means a concurrent compaction won: give up), advance times below since to since (clamped into the run's bounds), consolidate per (row, time)
and drop zero diffs; (3) upload the result as a new part under the client's writer lease;
(4) CAS: if every input part is still linked and the writer still registered, replace them with
the new part, else give up; (5) delete the inputs. A reader that fetched the older state and meets
a deleted input fetches the state again (``read_range``); its since-capability guarantees that
the compacted part still answers it. (Left to the sweep, the inputs would be indistinguishable
from parts a live writer has uploaded and not linked yet, which the sweep must never delete.)

Sweep protocol, per shard: (1) if the state holds expired writer or reader leases, a CAS drops
them; (2) list the parts; (3) fetch the state again and delete each listed part that (a) no state
references, (b) is older than the grace period and (c) was uploaded by a writer absent from that
state. A writer registers before it uploads, so a listed part's writer, if absent after the
listing, was dropped or released, and a dropped writer can never link (the link CAS checks its
registration): a part a live writer may still link is never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput, NotFound
from headrace.persist import parts as P
from headrace.persist.handles import read_parts_parallel
from headrace.persist.machine import drop_expired
from headrace.persist.state import PartMeta, ShardState
from headrace.persist.uploads import parts_prefix, upload_part
from headrace.persist.writer import refresh

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
    newest = max(p.lower for p in ordered)
    older = [p for p in ordered if p.lower != newest]
    if len(older) >= width:  # leave the newest batch as written (only max_parts=1 cannot)
        ordered = older
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
    if type(max_parts) is not int or max_parts < 1:
        raise InvalidInput(f"max_parts {max_parts!r} must be an int >= 1")
    machine = client.machine(shard)
    state = machine.fetch()
    run = choose_run(state.parts, max_parts)
    if not run:
        return CompactionResult()
    lower, upper = min(p.lower for p in run), max(p.upper for p in run)
    try:
        tables = read_parts_parallel(client.store, run)
    except NotFound as e:
        if any(p.key == e.key for p in machine.fetch().parts):
            raise  # still linked: the part is lost, not compacted
        return CompactionResult()  # a concurrent compaction replaced (and deleted) our input
    cols = P.schema_from_text(state.schema).names + [P.TIME, P.DIFF] if state.schema else None
    merged = pa.concat_tables([t.select(cols) if cols else t for t in tables])
    floor = min(state.since, upper - 1)
    moved = floor > 0 and merged.num_rows and \
        pc.min(merged.column(P.TIME)).as_py() < floor
    if moved:
        merged = P.advance_times(merged, floor)
    out = P.consolidate_updates(merged, keep_time=True)
    out = out.select(P.data_columns(out.schema) + [P.TIME, P.DIFF])
    reg = client.writer_registration(shard)
    writer_id = reg.ensure()
    new_part = replace(upload_part(client.store, shard, writer_id, out, root=client.root),
                       lower=lower, upper=upper, schema=None,
                       floor=max([floor if moved else 0] + [p.floor for p in run]))
    keys = {p.key for p in run}
    now = client.clock.now_ms()

    def step(s: ShardState):
        if not keys <= {p.key for p in s.parts} or s.writer(writer_id) is None:
            return None  # a concurrent compaction won, or our lease was lost meanwhile
        kept = tuple(p for p in s.parts if p.key not in keys)
        return replace(s, parts=tuple(sorted(kept + (new_part,), key=lambda p: (p.lower, p.key))),
                       writers=refresh(s, writer_id, now))

    after = machine.apply(step)
    applied = new_part in after.parts
    if applied:
        reg.linked(now)
        P.delete_quietly(client.store, sorted(keys))
    else:
        P.delete_quietly(client.store, [new_part.key])
    log.info("shard %s: compacted %d parts (%d rows) into 1 (%d rows), applied=%s", shard,
             len(run), merged.num_rows, out.num_rows, applied)
    return CompactionResult(len(run), merged.num_rows, out.num_rows, applied)


def sweep(client, *, grace_s: float = 600.0, dry_run: bool = False,
          keep_versions: int = 128) -> SweepResult:
    """Delete unreferenced parts older than ``grace_s`` whose writer is gone, and truncate old
    consensus versions (protocol in the module docstring)."""
    if not isinstance(grace_s, int | float) or grace_s < 0:
        raise InvalidInput(f"grace_s {grace_s!r} must be a number of seconds >= 0")
    now_ms = client.clock.now_ms()
    shards = parts_deleted = bytes_deleted = truncated = 0
    for shard in client.list_shards():
        shards += 1
        machine = client.machine(shard)
        if not dry_run and _has_expired(machine.fetch(), now_ms):  # (a dry run pretends)
            machine.apply(lambda s: s if _has_expired(s, now_ms) else None)
        listed = list(client.store.list(parts_prefix(client.root, shard)))
        after = drop_expired(machine.fetch(), now_ms) if dry_run else machine.fetch()
        referenced = {p.key for p in after.parts}
        live = {w.writer_id for w in after.writers}
        doomed = [m for m in listed if m.key not in referenced
                  and now_ms / 1000 - m.last_modified >= grace_s
                  and _writer_of(m.key) not in live]
        if doomed and not dry_run:
            client.store.delete_many([m.key for m in doomed])
        parts_deleted += len(doomed)
        bytes_deleted += sum(m.size for m in doomed)
        if not dry_run:
            truncated += client.truncate_log(shard, keep_versions)
    log.info("sweep: %d shards, %d parts (%d bytes) deleted, %d versions truncated", shards,
             parts_deleted, bytes_deleted, truncated)
    return SweepResult(shards, parts_deleted, bytes_deleted, truncated)


def _has_expired(state: ShardState, now_ms: int) -> bool:
    return any(w.expired(now_ms) for w in state.writers) or \
        any(r.expired(now_ms) for r in state.leased)


def _writer_of(key: str) -> str | None:
    return PartMeta(key, 0, 0, 0, 0, 0).writer_id
