"""Definiteness: is what a writer brings for times a shard already holds the same as what it
holds? Compared as collections (sum of diffs per row and time) with one Arrow group_by.

Compaction advances times below since (see PartMeta.floor), after which a range may no longer be
comparable; that is refused with SinceViolation rather than guessed. Compaction never merges the
newest batch, so the replay of the last batch — the common case — stays comparable.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from headrace.persist import parts as P
from headrace.persist.errors import DefinitenessViolation, SinceViolation
from headrace.persist.state import PartMeta, ShardState


def held(client, state: ShardState, lo: int, hi: int) -> pa.Table:
    """What the shard holds for [lo, hi), refusing where compaction blurred the times."""
    table, used = client.read_range(state, lo, hi)
    for p in used.parts:
        if overlaps(p, lo, hi) and p.floor and not (
                p.floor < lo or (p.lower >= lo and p.floor < hi)):
            raise SinceViolation(state.shard, lo, used.since,
                                 f"part {p.key} was compacted with times advanced to "
                                 f"{p.floor}: [{lo}, {hi}) can no longer be compared")
    return table


def same_bytes(held_parts: list[PartMeta], parts: list[PartMeta], lo: int, hi: int) -> bool:
    """The new parts are byte-identical to the linked ones of [lo, hi): a replay, no GET."""
    return all(lo <= p.lower and p.upper <= hi for p in held_parts) and \
        sorted(map(_fingerprint, held_parts)) == sorted(map(_fingerprint, parts))


def _fingerprint(p: PartMeta) -> tuple:
    return p.rows, p.size, p.crc32, p.lower, p.upper, -1 if p.time_override is None \
        else p.time_override


def overlaps(p: PartMeta, lo: int, hi: int) -> bool:
    if p.time_override is not None:
        return lo <= p.time_override < hi
    return p.lower < hi and p.upper > lo


def compare(shard: str, ours: pa.Table, theirs: pa.Table, lo: int, hi: int | None) -> None:
    """Equal as collections (sum of diffs per row and time): one Arrow group_by."""
    if not ours.num_rows and not theirs.num_rows:
        return
    cols = theirs.column_names
    try:
        ours = ours.select(cols)
        neg = theirs.set_column(cols.index(P.DIFF), P.DIFF, pc.negate(theirs.column(P.DIFF)))
        both = pa.concat_tables([ours.cast(theirs.schema), neg])
    except (KeyError, pa.ArrowException) as e:
        raise DefinitenessViolation(shard, lo, hi, -1, f"columns differ: {e}") from None
    differing = P.consolidate_updates(both, keep_time=True).num_rows
    if differing:
        raise DefinitenessViolation(shard, lo, hi, differing)
