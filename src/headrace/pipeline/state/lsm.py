"""BucketLSM: the state of one (operator, side, bucket) as a paged LSM in the reservoir.

A bucket is a root page listing sorted, consolidated runs (oldest first); each run is cut into
pages of about ``page_bytes`` with fence keys (first, last key of each page) kept in the root
for small runs and in one run index page for big ones. A task reads the root, then only the
pages whose fence range can hold one of its delta's keys, through the reservoir reader (and its
local cache). Its delta becomes a new run; size-tiered merges (``fanout`` runs of a similar
size become one) keep the number of runs and the rewrites of a key logarithmic in the bucket's
size. Nothing proportional to the bucket's size is held in memory except the fences.
``delete_range`` forgets a key range (event-time expiry) through the root's deleted ranges
(state/ranges.py): the pages inside it are dropped unread at the next write.

A BucketLSM is one task's view as of one state version: build it, look up, insert, write once.
``TaskState`` (state/task.py) drives several BucketLSMs of one task as one state, through
``pages_for`` and ``write_delta``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.operators.kernel import (
    KeyDeletingState,
    RangeDeletingState,
    ReplacingState,
    ScanningState,
)
from headrace.pipeline.state import ranges as deleted_ranges
from headrace.pipeline.state.cache import PAGES
from headrace.pipeline.state.changes import Changes
from headrace.pipeline.state.layout import (
    KIND_DATA,
    KIND_REPLACE,
    DeletedRange,
    Root,
    RunMeta,
    decode_index,
    encode_index,
    page_id,
)
from headrace.pipeline.state.pages import (
    CODEC_NONE,
    CODEC_ZSTD,
    CODEC_ZSTD_PLANES,
    decode_page,
    encode_run,
)
from headrace.pipeline.state.resolve import concat as _concat
from headrace.pipeline.state.resolve import live, merge_rows, sort_rows
from headrace.pipeline.state.rows import (
    as_fixed,
    binary_keys,
    distinct_sorted_keys,
    empty_zset,
    fixed_width,
    raw_bytes,
    sorted_zset,
)
from headrace.pipeline.state.views import RunView

_SCAN_CHUNK_BYTES = 256 * 1024


@dataclass(frozen=True)
class LSMConfig:
    """How buckets are laid out. Changing it never breaks existing state (the layout is
    self-describing); it only shapes the runs written from then on."""

    page_bytes: int = 32 * 1024  # raw bytes per page (a lookup decodes whole pages)
    fanout: int = 4  # merge when this many runs of one size tier are the newest
    tier_base_bytes: int = 16 * 1024  # runs below this size are all tier 0
    inline_fence_pages: int = 4  # runs of at most this many pages keep their fences in the root
    compression: str = "zstd"  # or "none"
    zstd_level: int = 1
    byte_planes: bool = True  # zstd over byte planes (page codec 2): ~3x smaller state pages

    def __post_init__(self):
        for name, lo in (("page_bytes", 256), ("fanout", 3), ("tier_base_bytes", 1),
                         ("inline_fence_pages", 0)):
            v = getattr(self, name)
            if type(v) is not int or v < lo:
                raise InvalidInput(f"LSMConfig.{name} must be an int >= {lo}, got {v!r}")
        if self.compression not in ("zstd", "none"):
            raise InvalidInput(f"LSMConfig.compression must be 'zstd' or 'none', "
                               f"got {self.compression!r}")
        if type(self.zstd_level) is not int or not 1 <= self.zstd_level <= 19:
            raise InvalidInput(f"LSMConfig.zstd_level must be 1..19, got {self.zstd_level!r}")

    def tier(self, size: int) -> int:
        """Size tier of a run: 0 below tier_base_bytes, +1 per factor of fanout above it
        (integer arithmetic, so every machine picks the same merges)."""
        t, bound = 0, self.tier_base_bytes
        while size >= bound:
            t += 1
            bound *= self.fanout
        return t


@dataclass
class WriteStats:
    """What one ``write`` did (all sizes in bytes)."""

    pages_written: int = 0  # run pages, index pages and the root
    bytes_written: int = 0  # stored bytes of those pages
    root_bytes: int = 0
    runs_written: int = 0  # new runs: the delta's and merge outputs
    rows_written: int = 0
    raw_bytes_written: int = 0  # raw size of the rows written (write amplification numerator)
    delta_raw_bytes: int = 0  # raw size of this task's consolidated delta (its denominator)
    merges: int = 0
    runs_merged: int = 0  # runs replaced by merges
    merge_pages_read: int = 0
    pages_deleted: int = 0  # pages of merged runs and dropped pages
    pages_dropped: int = 0  # pages inside a deleted range, deleted without being read
    runs: int = 0  # runs of the bucket after the write

    def add(self, other: WriteStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class _Run:
    """A run during write: persisted (``meta``) or new and still in memory (``table``)."""

    kind: int
    raw: int
    meta: RunMeta | None = None
    table: pa.Table | None = None


class BucketLSM(ReplacingState, ScanningState, KeyDeletingState, RangeDeletingState):
    """The StateSpine of one (operator, side, bucket) as of the reader's state version."""

    def __init__(self, reader, op: int, side: int, bucket: int,
                 config: LSMConfig | None = None, *, shared_cache: bool = False):
        self.op, self.side, self.bucket = op, side, bucket
        self.config = config or LSMConfig()
        self.root_id = page_id(op, side, bucket, 0)
        self.pages_read = 0  # reader reads: root, run index pages, run pages
        self._reader = reader
        # pages are shared through the worker's PageCache only for a real reservoir reader
        self._shared = getattr(reader, "prefix", None) if shared_cache else None
        self._stream = (getattr(getattr(reader, "store", None), "url", ""), self._shared)
        # the reservoir's page table, so a cached page is found by where it is (no read)
        state = getattr(reader, "state", None) if self._shared is not None else None
        self._locate = state().lookup if callable(state) else None
        self._decoded: dict[int, pa.RecordBatch] = {}  # pages this task decoded (∝ its delta)
        self._changes = Changes()
        self._deleted: list[DeletedRange] = []  # the ranges a write's merges apply
        self._written = False
        root = None
        if reader is not None and reader.contains(self.root_id):
            root = Root.from_bytes(self._read(self.root_id), pid=self.root_id)
        self.root = root or Root()

    # -- reads ----------------------------------------------------------------------------------
    def _read(self, pid: int):
        self.pages_read += 1
        return self._reader.read(pid)

    def _cache_key(self, pid: int) -> tuple | None:
        """Where the page is stored (file, offset, size, CRC32): what it *is*, known from the
        page table without reading it; None without a shared cache."""
        if self._locate is None:
            return None
        loc = self._locate(pid)
        return None if loc is None else (self._stream, pid, *loc)

    def _fences(self, run: RunMeta):
        if run.fences is None:
            pid = page_id(self.op, self.side, self.bucket, run.index_seq)
            need = run.index_from + run.pages  # the index may hold more: the run is a slice
            key = self._cache_key(pid)
            hit = PAGES.get(key) if key is not None else None
            if hit is None or len(hit) < need:
                hit = decode_index(self._read(pid), pid=pid, pages=need)
                if key is not None:
                    PAGES.put(key, hit, hit.nbytes)
            run.fences = hit if len(hit) == run.pages else hit.slice(run.index_from, need)
        return run.fences

    @staticmethod
    def _masked(ranges: list, f, i: int, t):
        """Page ``i``'s rows without those in ``ranges`` (the deleted ranges younger than its
        run); only a page whose fences meet one is filtered."""
        if ranges:
            ranges = [(lo, hi) for lo, hi in ranges if f.lasts[i] >= lo and f.firsts[i] < hi]
        return deleted_ranges.mask(t, ranges)

    def _page(self, run: RunMeta, i: int, keep: bool = True,
              cache: bool = True) -> pa.RecordBatch:
        pid = page_id(self.op, self.side, self.bucket, run.first_seq + i)
        t = self._decoded.get(pid)
        if t is None:
            f = self._fences(run)
            first, last = f.firsts[i], f.lasts[i]
            key = self._cache_key(pid)  # the worker's cache of decoded pages
            hit = PAGES.get(key) if key is not None else None
            if hit is not None and hit[1] == first and hit[2] == last:
                t = hit[0]  # the fences its run holds for it are checked on every hit
            else:
                t = decode_page(self._read(pid), pid=pid, first=first, last=last)
                if key is not None and cache:
                    PAGES.put(key, (t, first, last), t.nbytes)
            if keep:
                self._decoded[pid] = t
        return t

    def pages_for(self, probe: pa.Array) -> list[tuple]:
        """What a lookup of ``probe`` (sorted distinct keys) must see, per run, as (rows, run
        position (oldest 0), exact): the pages whose fences can hold a probe key (exact False:
        still to be filtered), or — when the probe touches a quarter of a run's pages or more
        and the worker caches pages — the exact matches from the run's view (state/views.py)."""
        pieces = []
        width = fixed_width(probe)
        fixed = as_fixed(probe, width) if width else None
        obj = None
        for p, run in enumerate(self.root.runs):
            f = self._fences(run)
            if f.searches_fixed(fixed):
                idx = f.pages_holding(None, fixed)
            else:
                if obj is None:
                    obj = probe.to_numpy(zero_copy_only=False)
                idx = f.pages_holding(obj)
            if len(idx) == 0:
                continue
            ranges = deleted_ranges.applying(run, self.root.ranges)
            if self._locate is not None and 4 * len(idx) >= run.pages:
                rows = deleted_ranges.mask(self._view(run).match(probe, width, fixed), ranges)
                pieces.append((rows, p, True))
                continue
            pieces += [(self._masked(ranges, f, i, self._page(run, i)), p, False)
                       for i in idx.tolist()]
        return pieces

    def _view(self, run: RunMeta) -> RunView:
        first = self._cache_key(page_id(self.op, self.side, self.bucket, run.first_seq))
        last = self._cache_key(page_id(self.op, self.side, self.bucket,
                                       run.first_seq + run.pages - 1))
        key = ("view", first, last, run.pages) if first and last else None
        view = PAGES.get(key) if key else None
        if view is None:
            # the view holds the rows: its pages are not cached a second time
            view = RunView([self._page(run, i, keep=False, cache=False)
                            for i in range(run.pages)])
            if key:
                PAGES.put(key, view, view.nbytes)
        return view

    @property
    def kinds(self) -> list[int]:
        return [r.kind for r in self.root.runs]

    def _check_open(self) -> None:
        if self._written:
            raise RuntimeError("BucketLSM.write() was already called; open the new version")

    def lookup_many(self, keys) -> pa.Table:
        """Rows whose key is in ``keys``, consolidated, zero weights dropped (ZSET_SCHEMA).
        Reads the root, and per run only the pages whose fences can hold one of the keys."""
        self._check_open()
        keys = binary_keys(keys)
        if len(keys) == 0:
            return empty_zset()
        probe = distinct_sorted_keys(keys)
        found = self._changes.drop_deleted(live(self.pages_for(probe), self.kinds, probe))
        self._changes.record(probe, found)
        return sorted_zset(_concat([found, *self._changes.pending_of(probe)]))

    def scan(self, lo: bytes | None = None, hi: bytes | None = None) -> Iterator[pa.Table]:
        """The bucket's keys in [lo, hi) (default: all) in key order, as consolidated
        ZSET_SCHEMA tables (key ranges of about 256 KiB of the biggest run; for rescaling,
        expiry and debugging). Only pages whose fences meet the range are read, each once;
        only the pages of the current key range are held."""
        self._check_open()
        runs = self.root.runs
        bounds: list = []
        if runs:
            big = max(runs, key=lambda r: r.pages)
            step = max(1, _SCAN_CHUNK_BYTES // self.config.page_bytes)
            bounds = sorted(set(self._fences(big).firsts[step::step].tolist()))
        bounds = [b for b in bounds if (lo is None or b > lo) and (hi is None or b < hi)]
        lows, highs = [lo, *bounds], [*bounds, hi]
        pending = self._changes.all_pending()
        windows: list[dict[int, pa.RecordBatch]] = [{} for _ in runs]  # pages of the chunk
        for lo, hi in zip(lows, highs, strict=True):
            tables, pos = [], []
            for p, run in enumerate(runs):
                f = self._fences(run)
                ranges = deleted_ranges.applying(run, self.root.ranges)
                a = 0 if lo is None else int(np.searchsorted(f.lasts, lo, side="left"))
                b = len(f) if hi is None else int(np.searchsorted(f.firsts, hi, side="left"))
                win = windows[p]
                for i in [i for i in win if i < a]:  # below this chunk: never needed again
                    del win[i]
                for i in range(a, b):
                    if i not in win:
                        win[i] = self._masked(ranges, f, i, self._page(run, i, keep=False))
                    tables.append(_in_range(win[i], lo, hi))
                    pos.append(p)
            pieces = [(t, p, False) for t, p in zip(tables, pos, strict=True)]
            found = self._changes.drop_deleted(live(pieces, self.kinds, None))
            out = sorted_zset(_concat([found, _in_range(pending, lo, hi)]))
            if out.num_rows:
                yield out

    # -- changes ---------------------------------------------------------------------------------
    def insert_updates(self, updates: pa.Table) -> None:
        """Add a Z-set delta (visible to later lookups; written by ``write``)."""
        self._check_open()
        self._changes.insert(updates)

    def replace_rows(self, keys, rows: pa.Table) -> None:
        """The complete rows of ``keys`` are now ``rows`` (operators.kernel.replace_rows)."""
        self._check_open()
        self._changes.replace(keys, rows, self.lookup_many)

    def delete_keys(self, keys) -> None:
        """Drop every row of ``keys`` (all values, whatever their weights): rows inserted
        before this call and all persisted rows. Written as markers of a replacing run."""
        self._check_open()
        self._changes.delete(keys)

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        """Drop every row whose key lies in [lo, hi): rows inserted before this call and all
        persisted rows (rows inserted after it stay). Recorded in the root as a deleted range;
        the write drops the pages inside it without reading them (state/ranges.py)."""
        self._check_open()
        self._changes.delete_range(lo, hi)

    @property
    def changed(self) -> bool:
        c = self._changes
        return c.any or (
            (c.deleted is not None or bool(c.ranges)) and bool(self.root.runs))

    # -- write -----------------------------------------------------------------------------------
    def write(self, writer) -> WriteStats:
        """Write this task's changes through ``writer`` (a PageRunWriter or Session): the delta
        as a new run, merges the tiering asks for, deletions of replaced pages, the new root.
        Page ids come from the root's counter: the same inputs give the same ids and bytes."""
        self._check_open()
        if not self.changed:
            self._written = True
            self._release()
            return WriteStats(runs=len(self.root.runs))
        rep, data = self._changes.split(replacing=bool(self.root.runs))
        return self.write_delta(writer, rep, data, self._changes.ranges)

    def write_delta(self, writer, rep: pa.Table, data: pa.Table,
                    ranges: Sequence[tuple[bytes, bytes]] = ()) -> WriteStats:
        """Write consolidated changes: ``rep`` as a replacing run, ``data`` as a data run (keys
        disjoint, each sorted), ``ranges`` ([lo, hi) key ranges deleted from every older row)
        as deleted ranges, then the pages inside deleted ranges dropped, the merges tiering
        asks for, deletions of replaced pages and the new root. Ends this view, like
        ``write``."""
        self._check_open()
        self._written = True
        stats = WriteStats()
        old = self.root
        deleted = old.ranges
        kept_runs = old.runs
        if old.runs and (ranges or old.ranges):
            deleted = deleted_ranges.normalise(old.ranges, list(ranges), old.next_seq,
                                               old.runs, self._fences)
            kept_runs, dropped = deleted_ranges.trim_runs(
                old.runs, deleted, self._fences, self.config.inline_fence_pages)
            for seq in dropped:
                writer.delete(page_id(self.op, self.side, self.bucket, seq))
            stats.pages_dropped = stats.pages_deleted = len(dropped)
        self._deleted = deleted
        runs = [_Run(r.kind, r.raw_bytes, meta=r) for r in kept_runs]
        if not runs and rep.num_rows:  # nothing older to replace: all rows are data
            live_rows = rep.filter(pc.not_equal(rep.column("w"), 0))
            data = sort_rows(_concat([data, live_rows])) if data.num_rows else live_rows
            rep = rep.slice(0, 0)
        for kind, t in ((KIND_DATA, data), (KIND_REPLACE, rep)):
            if t.num_rows:
                size = raw_bytes(t)
                stats.delta_raw_bytes += size
                runs.append(_Run(kind, size, table=t))
        if len(deleted) > deleted_ranges.MAX_RANGES and len(runs) > 1:
            runs = self._merge_group(runs, oldest=True, stats=stats)  # applies them all
        runs = self._merge(runs, stats)
        persisted = [r.meta for r in runs if r.meta is not None]
        if deleted:
            deleted = deleted_ranges.forget(deleted, persisted, self._fences)
        if (len(persisted) == len(runs) and _same(persisted, kept_runs)
                and _same(kept_runs, old.runs) and deleted == old.ranges):
            stats.runs = len(runs)  # the task's changes cancelled out: nothing to write
            self._release()
            return stats
        kept = {id(m) for m in persisted}
        for run in kept_runs:
            if id(run) not in kept:
                for seq in run.page_seqs:
                    writer.delete(page_id(self.op, self.side, self.bucket, seq))
                    stats.pages_deleted += 1
        indexes = {m.index_seq for m in persisted if not m.inline}
        for seq in sorted({m.index_seq for m in old.runs if not m.inline} - indexes):
            writer.delete(page_id(self.op, self.side, self.bucket, seq))
            stats.pages_deleted += 1
        seq = old.next_seq
        metas = []
        for r in runs:
            if r.meta is None:
                r.meta = self._write_run(writer, r, seq, stats)
                seq = r.meta.first_seq + r.meta.pages + (0 if r.meta.inline else 1)
            metas.append(r.meta)
        self.root = Root(seq, metas, deleted)
        root = self.root.to_bytes()
        writer.write(self.root_id, root)
        stats.pages_written += 1
        stats.bytes_written += len(root)
        stats.root_bytes = len(root)
        stats.runs = len(metas)
        self._release()
        return stats

    def _release(self) -> None:
        self._changes.clear()
        self._decoded = {}

    def _write_run(self, writer, r: _Run, seq: int, stats: WriteStats) -> RunMeta:
        c = self.config
        codec = (CODEC_NONE if c.compression == "none"
                 else CODEC_ZSTD_PLANES if c.byte_planes else CODEC_ZSTD)
        enc = encode_run(r.table, c.page_bytes, codec, c.zstd_level)
        inline = enc.pages <= c.inline_fence_pages
        ids = [page_id(self.op, self.side, self.bucket, seq + i) for i in range(enc.pages)]
        writer.write_many(ids, enc.blob, enc.sizes)
        stats.pages_written += enc.pages
        stats.bytes_written += len(enc.blob)
        if not inline:
            index = encode_index(enc.fences)
            writer.write(page_id(self.op, self.side, self.bucket, seq + enc.pages), index)
            stats.pages_written += 1
            stats.bytes_written += len(index)
        stats.runs_written += 1
        stats.rows_written += enc.rows
        stats.raw_bytes_written += enc.raw_bytes
        return RunMeta(seq, enc.pages, r.kind, inline, enc.rows, enc.raw_bytes, len(enc.blob),
                       enc.fences)

    def _merge(self, runs: list[_Run], stats: WriteStats) -> list[_Run]:
        """Size-tiered: while the newest runs whose tier is at most T number ``fanout`` or
        more, merge them into one (plus a tombstone run if older runs remain for their
        deletions to apply to). T is the newest run's tier — or, when the newest run is a
        replacing one, else the larger of the two newest: a write that deletes keys adds its
        data run and then a small replacing run, and measured by that small run alone, runs of
        the data's tier would never merge (a join retracting rows every batch piled up a run
        per batch). Each merge leaves fewer runs, so it ends."""
        c = self.config
        while len(runs) >= c.fanout:
            tiers = [c.tier(r.raw) for r in runs]
            tops = [tiers[-1]]
            if runs[-1].kind == KIND_REPLACE and tiers[-2] > tiers[-1]:
                tops.append(tiers[-2])
            j = len(runs)
            for top in tops:
                j = len(runs) - 1
                while j > 0 and tiers[j - 1] <= top:
                    j -= 1
                if len(runs) - j >= c.fanout:
                    break
            if len(runs) - j < c.fanout:
                break
            runs = runs[:j] + self._merge_group(runs[j:], oldest=j == 0, stats=stats)
        return runs

    def _merge_group(self, group: list[_Run], oldest: bool, stats: WriteStats) -> list[_Run]:
        tables, pos = [], []
        for p, r in enumerate(group):
            if r.table is not None:
                tables.append(r.table)
                pos.append(p)
                continue
            meta = r.meta
            if meta is None:
                raise ValueError("a run with neither rows in memory nor pages")
            before = self.pages_read
            ranges = deleted_ranges.applying(meta, self._deleted)
            for i in range(meta.pages):
                tables.append(deleted_ranges.mask(self._page(meta, i, keep=False), ranges))
                pos.append(p)
            stats.merge_pages_read += self.pages_read - before
        rpos = np.repeat(np.array(pos, np.int64), [t.num_rows for t in tables])
        replacing = np.array([r.kind for r in group], np.int64)[rpos] == KIND_REPLACE
        data, rep = merge_rows(_concat(tables), rpos, replacing, oldest)
        out = [_Run(kind, raw_bytes(t), table=t)
               for kind, t in ((KIND_DATA, data), (KIND_REPLACE, rep)) if t.num_rows]
        stats.merges += 1
        stats.runs_merged += len(group)
        return out


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _in_range(t: pa.Table, lo, hi) -> pa.Table:
    if lo is None and hi is None:
        return t
    k = t.column("key")
    m = None
    if lo is not None:
        m = pc.greater_equal(k, pa.scalar(lo, pa.binary()))
    if hi is not None:
        h = pc.less(k, pa.scalar(hi, pa.binary()))
        m = h if m is None else pc.and_(m, h)
    return t.filter(m)
