"""Deleted key ranges: how a bucket forgets a whole key range (event-time expiry: the windows
a watermark closed) without reading it or writing a tombstone per key.

A root lists ``DeletedRange(lo, hi, seq)``: every row with lo <= key < hi of a run older than
the range (first_seq < seq) is dead. So a range never hides rows written after it. At every
write of a bucket that has ranges:

- a page of an older run whose [first, last] lies inside a range is dropped from its run
  without being read (the run becomes the slices of pages left; an empty run disappears) and
  deleted from the reservoir: the closed windows' bytes go at once;
- lookups, scans and merges mask the rows of the pages that straddle a range's end, until a
  merge rewrites them (merge outputs hold no masked row);
- a range no older run's fences meet any more is forgotten, and a range that no run written
  since it meets is re-stamped with the newest seq, so ranges of one seq that meet become one:
  an operator deleting "below the watermark" every batch keeps one range, not one per batch.

All of it is decided from fences and integers, so a retried task writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.state.layout import DeletedRange, Fences, RunMeta

#: a write that would leave more ranges than this merges every run instead (which applies and
#: forgets them all); expiry keeps one range per state section
MAX_RANGES = 64


def check_range(lo, hi) -> tuple[bytes, bytes]:
    if not isinstance(lo, bytes | bytearray) or not isinstance(hi, bytes | bytearray):
        raise InvalidInput(f"a deleted key range takes bytes, got {type(lo).__name__} and "
                           f"{type(hi).__name__}")
    return bytes(lo), bytes(hi)


def union(ranges: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Sorted, with ranges that overlap or touch merged into one; empty ranges dropped."""
    out: list[list[bytes]] = []
    for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def in_ranges(keys: pa.Array, ranges: list[tuple[bytes, bytes]]) -> np.ndarray | None:
    """Which keys lie in one of ``ranges`` (bool array), or None when none does."""
    hit = None
    for lo, hi in ranges:
        m = pc.and_(pc.greater_equal(keys, pa.scalar(lo, pa.binary())),
                    pc.less(keys, pa.scalar(hi, pa.binary())))
        hit = m if hit is None else pc.or_(hit, m)
    if hit is None:
        return None
    out = np.asarray(hit.to_numpy(zero_copy_only=False), bool)
    return out if out.any() else None


def mask(t, ranges: list[tuple[bytes, bytes]]):
    """``t`` (a table or record batch of ZSET rows) without the rows whose key is in
    ``ranges``."""
    if not ranges or t.num_rows == 0:
        return t
    keys = t.column("key")
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    hit = in_ranges(keys, ranges)
    return t if hit is None else t.filter(pa.array(~hit))


def applying(run: RunMeta, ranges: list[DeletedRange]) -> list[tuple[bytes, bytes]]:
    """The ranges that delete rows of ``run`` (the ones younger than it)."""
    return [(d.lo, d.hi) for d in ranges if run.first_seq < d.seq]


def meets(f: Fences, lo: bytes, hi: bytes) -> bool:
    a, b = f.meeting(lo, hi)
    return a < b


def normalise(old: list[DeletedRange], new: list[tuple[bytes, bytes]], seq: int,
              runs: list[RunMeta], fences: Callable[[RunMeta], Fences]) -> list[DeletedRange]:
    """The ranges after a write that adds ``new`` (deleting from every run older than ``seq``,
    the first seq the write allocates). An older range that no run written since it meets
    deletes exactly the same rows if stamped ``seq``: so it is, and ranges of one seq that
    meet are merged. Sorted by (seq, lo), as the root stores them."""
    out = []
    for d in old:
        if d.seq < seq and not any(r.first_seq >= d.seq and meets(fences(r), d.lo, d.hi)
                                   for r in runs):
            d = DeletedRange(d.lo, d.hi, seq)
        out.append(d)
    out += [DeletedRange(lo, hi, seq) for lo, hi in new]
    by_seq: dict[int, list] = {}
    for d in out:
        by_seq.setdefault(d.seq, []).append((d.lo, d.hi))
    return [DeletedRange(lo, hi, s) for s in sorted(by_seq) for lo, hi in union(by_seq[s])]


def forget(ranges: list[DeletedRange], runs: list[RunMeta],
           fences: Callable[[RunMeta], Fences]) -> list[DeletedRange]:
    """The ranges some older run (among ``runs``, the persisted ones) may still hold keys of."""
    return [d for d in ranges
            if any(r.first_seq < d.seq and meets(fences(r), d.lo, d.hi) for r in runs)]


def trim(run: RunMeta, ranges: list[DeletedRange], f: Fences,
         inline_pages: int) -> tuple[list[RunMeta], list[int]]:
    """``run`` without its pages that lie inside a range deleting from it: (the slices of
    pages left, in order, as runs; the seqs of the dropped pages). A slice keeps the run's
    kind and its index page (fences index_from ..), or gets its fences inline when it has at
    most ``inline_pages`` pages. Its rows and byte counts are the run's scaled by its share of
    the pages (integer arithmetic: the same on every machine; they only size tiers)."""
    drop = np.zeros(run.pages, bool)
    for lo, hi in applying(run, ranges):
        a, b = f.inside(lo, hi)
        if a < b:
            drop[a:b] = True
    if not drop.any():
        return [run], []
    kept = np.flatnonzero(~drop)
    starts = kept[np.r_[True, np.diff(kept) > 1]] if len(kept) else kept
    ends = kept[np.r_[np.diff(kept) > 1, True]] + 1 if len(kept) else kept
    pieces = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        n = b - a
        inline = run.inline or n <= inline_pages
        pieces.append(RunMeta(
            run.first_seq + a, n, run.kind, inline,
            max(n, run.rows * n // run.pages), run.raw_bytes * n // run.pages,
            run.stored_bytes * n // run.pages, f.slice(a, b),
            index_seq=0 if inline else run.index_seq,
            index_from=0 if inline else run.index_from + a))
    return pieces, [run.first_seq + int(i) for i in np.flatnonzero(drop)]


def trim_runs(runs: list[RunMeta], ranges: list[DeletedRange],
              fences: Callable[[RunMeta], Fences],
              inline_pages: int) -> tuple[list[RunMeta], list[int]]:
    """``trim`` over a root's runs: (the runs left, the seqs of the dropped pages). A run no
    range deletes from is kept as the same object (its fences are not even looked at)."""
    out, dropped = [], []
    for run in runs:
        if not applying(run, ranges):
            out.append(run)
            continue
        pieces, gone = trim(run, ranges, fences(run), inline_pages)
        out += pieces
        dropped += gone
    return out, dropped
