"""BucketLSM: the state of one (operator, side, bucket) as a paged LSM in the reservoir.

A bucket is a root page listing sorted, consolidated runs (oldest first); each run is cut into
pages of about ``page_bytes`` with fence keys (first, last key of each page) kept in the root
for small runs and in one run index page for big ones. A task reads the root, then only the
pages whose fence range can hold one of its delta's keys, through the reservoir reader (and its
local cache). Its delta becomes a new run; size-tiered merges (``fanout`` runs of a similar
size become one) keep the number of runs and the rewrites of a key logarithmic in the bucket's
size. Nothing proportional to the bucket's size is held in memory except the fences.

A BucketLSM is one task's view as of one state version: build it, look up, insert, write once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.operators.base import ZSET_SCHEMA
from headrace.pipeline.state.cache import PAGES
from headrace.pipeline.state.layout import (
    KIND_DATA,
    KIND_TOMBSTONE,
    Root,
    RunMeta,
    decode_index,
    encode_index,
    page_id,
)
from headrace.pipeline.state.pages import CODEC_NONE, CODEC_ZSTD, decode_page, encode_run
from headrace.pipeline.state.zset import (
    binary_keys,
    check_zset,
    consolidate,
    distinct_sorted_keys,
    empty_zset,
    raw_bytes,
)

_SCAN_CHUNK_BYTES = 256 * 1024


def _fences_match(page: pa.RecordBatch, first, last) -> bool:
    keys = page.column(0)
    return page.num_rows > 0 and keys[0].as_py() == first and keys[-1].as_py() == last


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
    pages_deleted: int = 0
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


class BucketLSM:
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
        self._decoded: dict[int, pa.RecordBatch] = {}  # pages this task decoded (∝ its delta)
        self._pending: list[pa.Table] = []  # this task's inserts, minus later-deleted keys
        self._deleted: pa.Array | None = None  # keys this task deleted (sorted, distinct)
        self._written = False
        root = None
        if reader is not None and reader.contains(self.root_id):
            root = Root.from_bytes(self._read(self.root_id), pid=self.root_id)
        self.root = root or Root()

    # -- reads ----------------------------------------------------------------------------------
    def _read(self, pid: int):
        self.pages_read += 1
        return self._reader.read(pid)

    def _fences(self, run: RunMeta):
        if run.fences is None:
            pid = page_id(self.op, self.side, self.bucket, run.index_seq)
            run.fences = decode_index(self._read(pid), pid=pid, pages=run.pages)
        return run.fences

    def _page(self, run: RunMeta, i: int, keep: bool = True) -> pa.RecordBatch:
        pid = page_id(self.op, self.side, self.bucket, run.first_seq + i)
        t = self._decoded.get(pid)
        if t is None:
            f = self._fences(run)
            raw = self._read(pid)
            key = None
            if self._shared is not None:  # the worker's cache of decoded pages
                key = (self._stream, pid, bytes(raw[-4:]), len(raw))
                t = PAGES.get(key)
                if t is not None and not _fences_match(t, f.firsts[i], f.lasts[i]):
                    t = None
            if t is None:
                t = decode_page(raw, pid=pid, first=f.firsts[i], last=f.lasts[i])
                if key is not None:
                    PAGES.put(key, t)
            if keep:
                self._decoded[pid] = t
        return t

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
        probe_obj = probe.to_numpy(zero_copy_only=False)
        tables, pos = [], []
        for p, run in enumerate(self.root.runs):
            for i in self._fences(run).pages_holding(probe_obj).tolist():
                tables.append(self._page(run, i))
                pos.append(p)
        found = self._live(tables, pos, probe)
        pending = [t.filter(pc.is_in(t.column("key"), value_set=probe)) for t in self._pending]
        return consolidate(_concat([found, *pending]))

    def _live(self, tables: list[pa.Table], pos: list[int], probe: pa.Array | None,
              kinds: list[int] | None = None) -> pa.Table:
        """Data rows of run pages (``pos``: each table's run position, oldest 0) that are in
        ``probe`` (None: all) and deleted neither by a newer tombstone run nor by this task."""
        if not tables:
            return empty_zset()
        kinds = kinds or [r.kind for r in self.root.runs]
        t = _concat(tables)
        rpos = np.repeat(np.array(pos, np.int64), [x.num_rows for x in tables])
        if probe is not None:
            m = pc.is_in(t.column("key"), value_set=probe).to_numpy(zero_copy_only=False)
            t, rpos = t.filter(m), rpos[m]
        tomb = np.array(kinds, np.int64)[rpos] == KIND_TOMBSTONE
        if tomb.any():
            t, rpos = _drop_deleted(t, rpos, tomb)
        if self._deleted is not None and t.num_rows:
            gone = pc.is_in(t.column("key"), value_set=self._deleted)
            t = t.filter(pc.invert(gone))
        return t

    def scan(self) -> Iterator[pa.Table]:
        """The whole bucket in key order, as consolidated ZSET_SCHEMA tables (key ranges of
        about 256 KiB of the biggest run; for rescaling, expiry and debugging). Each page is
        read once; only the pages of the current key range are held."""
        self._check_open()
        runs = self.root.runs
        bounds: list = []
        if runs:
            big = max(runs, key=lambda r: r.pages)
            step = max(1, _SCAN_CHUNK_BYTES // self.config.page_bytes)
            bounds = sorted(set(self._fences(big).firsts[step::step].tolist()))
        lows, highs = [None, *bounds], [*bounds, None]
        pending = _concat([empty_zset(), *self._pending])
        windows: list[dict[int, pa.RecordBatch]] = [{} for _ in runs]  # pages of the chunk
        for lo, hi in zip(lows, highs, strict=True):
            tables, pos = [], []
            for p, run in enumerate(runs):
                f = self._fences(run)
                a = 0 if lo is None else int(np.searchsorted(f.lasts, lo, side="left"))
                b = len(f) if hi is None else int(np.searchsorted(f.firsts, hi, side="left"))
                win = windows[p]
                for i in [i for i in win if i < a]:  # below this chunk: never needed again
                    del win[i]
                for i in range(a, b):
                    if i not in win:
                        win[i] = self._page(run, i, keep=False)
                    tables.append(_in_range(win[i], lo, hi))
                    pos.append(p)
            out = consolidate(_concat([self._live(tables, pos, None),
                                                _in_range(pending, lo, hi)]))
            if out.num_rows:
                yield out

    # -- changes ---------------------------------------------------------------------------------
    def insert_updates(self, updates: pa.Table) -> None:
        """Add a Z-set delta (visible to later lookups; written by ``write``)."""
        self._check_open()
        t = check_zset(updates)
        if t.num_rows:
            self._pending.append(t)
            if len(self._pending) > 16:
                self._pending = [_concat(self._pending).combine_chunks()]

    def delete_keys(self, keys) -> None:
        """Drop every row of ``keys`` (all values, whatever their weights): rows inserted
        before this call and all persisted rows. Written as a tombstone run (keys only)."""
        self._check_open()
        keys = binary_keys(keys, "deleted keys")
        if len(keys) == 0:
            return
        u = distinct_sorted_keys(keys)
        kept = [t.filter(pc.invert(pc.is_in(t.column("key"), value_set=u)))
                for t in self._pending]
        self._pending = [t for t in kept if t.num_rows]
        if self._deleted is not None:
            u = distinct_sorted_keys(pa.concat_arrays([self._deleted, u]))
        self._deleted = u

    @property
    def changed(self) -> bool:
        return bool(self._pending) or (self._deleted is not None and bool(self.root.runs))

    # -- write -----------------------------------------------------------------------------------
    def write(self, writer) -> WriteStats:
        """Write this task's changes through ``writer`` (a PageRunWriter or Session): the delta
        as a new run, merges the tiering asks for, deletions of replaced pages, the new root.
        Page ids come from the root's counter: the same inputs give the same ids and bytes."""
        self._check_open()
        self._written = True
        stats = WriteStats()
        if not self.changed:
            stats.runs = len(self.root.runs)
            return stats
        runs = [_Run(r.kind, r.raw_bytes, meta=r) for r in self.root.runs]
        if self._deleted is not None and runs:
            t = _tombstone_table(self._deleted)
            runs.append(_Run(KIND_TOMBSTONE, raw_bytes(t), table=t))
        delta = consolidate(_concat([empty_zset(), *self._pending]))
        stats.delta_raw_bytes = raw_bytes(delta)
        if delta.num_rows:
            runs.append(_Run(KIND_DATA, stats.delta_raw_bytes, table=delta))
        runs = self._merge(runs, stats)
        if len(runs) == len(self.root.runs) and all(r.meta is not None for r in runs):
            stats.runs = len(runs)  # the task's changes cancelled out: nothing to write
            self._pending, self._deleted, self._decoded = [], None, {}
            return stats
        kept = {id(r.meta) for r in runs if r.meta is not None}
        for old in self.root.runs:
            if id(old) not in kept:
                for seq in range(old.first_seq, old.end_seq):
                    writer.delete(page_id(self.op, self.side, self.bucket, seq))
                    stats.pages_deleted += 1
        seq = self.root.next_seq
        metas = []
        for r in runs:
            if r.meta is None:
                r.meta = self._write_run(writer, r, seq, stats)
                seq = r.meta.end_seq
            metas.append(r.meta)
        self.root = Root(seq, metas)
        root = self.root.to_bytes()
        writer.write(self.root_id, root)
        stats.pages_written += 1
        stats.bytes_written += len(root)
        stats.root_bytes = len(root)
        stats.runs = len(metas)
        self._pending, self._deleted, self._decoded = [], None, {}
        return stats

    def _write_run(self, writer, r: _Run, seq: int, stats: WriteStats) -> RunMeta:
        c = self.config
        codec = CODEC_ZSTD if c.compression == "zstd" else CODEC_NONE
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
        """Size-tiered: while the newest runs whose tier is at most the newest run's tier
        number ``fanout`` or more, merge them into one (plus a tombstone run if older runs
        remain for their deletions to apply to). Each merge leaves fewer runs, so it ends."""
        c = self.config
        while len(runs) >= c.fanout:
            tiers = [c.tier(r.raw) for r in runs]
            j = len(runs) - 1
            while j > 0 and tiers[j - 1] <= tiers[-1]:
                j -= 1
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
            before = self.pages_read
            for i in range(r.meta.pages):
                tables.append(self._page(r.meta, i, keep=False))
                pos.append(p)
            stats.merge_pages_read += self.pages_read - before
        kinds = [r.kind for r in group]
        rpos = np.repeat(np.array(pos, np.int64), [t.num_rows for t in tables])
        t = _concat(tables)
        tomb = np.array(kinds, np.int64)[rpos] == KIND_TOMBSTONE
        out = []
        if tomb.any():
            if not oldest:  # the group's deletions still apply to the runs before it
                keys = distinct_sorted_keys(t.filter(tomb).column("key").combine_chunks())
                tt = _tombstone_table(keys)
                out.append(_Run(KIND_TOMBSTONE, raw_bytes(tt), table=tt))
            t, rpos = _drop_deleted(t, rpos, tomb)
        data = consolidate(t)
        if data.num_rows:
            out.append(_Run(KIND_DATA, raw_bytes(data), table=data))
        stats.merges += 1
        stats.runs_merged += len(group)
        return out


def _concat(parts: list) -> pa.Table:
    """Tables and record batches (ZSET_SCHEMA) as one table, without copying."""
    batches = []
    for x in parts:
        if isinstance(x, pa.RecordBatch):
            batches.append(x)
        else:
            batches.extend(x.to_batches())
    return pa.Table.from_batches(batches, schema=ZSET_SCHEMA)


def _tombstone_table(keys: pa.Array) -> pa.Table:
    n = len(keys)
    return pa.Table.from_arrays([keys, pa.array([b""] * n, pa.binary()),
                                 pa.array(np.zeros(n, np.int64))],
                                names=["key", "val", "w"]).cast(empty_zset().schema)


def _drop_deleted(t: pa.Table, rpos: np.ndarray, tomb: np.ndarray):
    """The data rows of ``t`` not deleted by a tombstone row of a newer run (higher ``rpos``)."""
    keys = t.column("key").combine_chunks()
    newest = (pa.table({"key": keys.filter(pa.array(tomb)), "p": rpos[tomb]})
              .group_by("key").aggregate([("p", "max")]))
    data = ~tomb
    d, dpos = t.filter(pa.array(data)), rpos[data]
    idx = pc.index_in(d.column("key"), value_set=newest.column("key").combine_chunks())
    idx = pc.fill_null(idx, -1).to_numpy(zero_copy_only=False)
    maxpos = newest.column("p_max").to_numpy()
    hit = idx >= 0
    killed = np.zeros(len(idx), bool)
    killed[hit] = dpos[hit] < maxpos[idx[hit]]
    return d.filter(pa.array(~killed)), dpos[~killed]


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
