"""Bounded state for event-time operators: expiry deletes closed windows as key ranges, whose
pages leave the state at the next write without being read (state/ranges.py).

The operator tests drive the real kernels' ``apply`` and ``expire`` through BucketLSMs on a
reservoir over many batches of advancing windows and measure the live state (the bytes of
the pages the latest checkpoint references): it must stay that of the open windows, as on
an endless stream, while the results stay exact. The LSM tests pin the range semantics:
pages dropped unread, rows written after a deletion kept, ranges merged and forgotten, their
number bounded, retries byte-identical."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from headrace.errors import InvalidInput
from headrace.pipeline.names import W
from headrace.pipeline.operators.aggregate import ACC, Agg, AggregateKernel
from headrace.pipeline.operators.interval import IntervalJoinKernel, expiry_bounds
from headrace.pipeline.operators.join import JoinKernel
from headrace.pipeline.plan.eventtime import bound_key
from headrace.pipeline.state import BucketLSM, LSMConfig, WriteStats, page_id
from headrace.pipeline.state.commit import STATE_OPTIONS, checkpoint_runs
from headrace.pipeline.state.pages import CODEC_ZSTD_PLANES, encode_run
from headrace.pipeline.state.ranges import MAX_RANGES
from headrace.pipeline.state.rows import sorted_zset
from headrace.pipeline.state.task import Router, TaskState
from headrace.reservoir import PageRunWriter, ReservoirReader, ReservoirStorage
from headrace.reservoir.verify import inspect_stream
from headrace.store import LocalStore

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000_000
OP = 2


_OPEN: list = []


@pytest.fixture(autouse=True)
def _close_streams():
    """Every Stream a test made is closed after it (its caches hold files open)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


class Stream:
    """One operator's state in a reservoir: each batch opens the buckets at the latest
    checkpoint, the caller runs the kernel, the writes are absorbed and checkpointed."""

    def __init__(self, path, config: LSMConfig = LSMConfig()):
        self.store = LocalStore(str(path / "store"), fsync=False)
        self.storage = ReservoirStorage.open(self.store, cache_dir=str(path / "cache"),
                                             options=STATE_OPTIONS)
        self.cache = str(path / "cache")
        self.config = config
        self.reader = None
        self.n = 0
        self.stored: list[int] = []  # stored_bytes() after each commit
        _OPEN.append(self)

    def close(self) -> None:
        self.storage.close()
        if self.reader is not None:
            self.reader.close()

    def open(self, side: int = 0, bucket: int = 0) -> BucketLSM:
        return BucketLSM(self.reader, OP, side, bucket, self.config)

    def commit(self, lsms) -> WriteStats:
        self.n += 1
        w = PageRunWriter(self.store, run_id=f"task-{self.n}")
        stats = WriteStats()
        for lsm in lsms:
            stats.add(lsm.write(w))
        # as the pipeline's driver does: sparse files repacked, the previous version kept
        v, _ = checkpoint_runs(self.storage, [w.finish()], keep_from=self.storage.version)
        self.stored.append(self.stored_bytes())
        # as the workers do: the next version's reader is built on the last (one cache)
        self.reader = (self.reader.at(v) if self.reader is not None else
                       ReservoirReader.open(self.store, version=v, cache_dir=self.cache))
        return stats

    def live_bytes(self) -> int:
        """Bytes of the pages the latest checkpoint references (benchmarks/nexmark.py's
        state figure)."""
        return inspect_stream(self.store)["page_bytes"]

    def stored_bytes(self) -> int:
        """Every byte the state keeps in the store (superseded pages in files not yet dead
        included): what the user pays to store."""
        return sum(m.size for m in self.store.list(""))

    def compact_bytes(self, sides: int = 1) -> int:
        """What the live rows take written as one run per side: the open windows' size."""
        total = 0
        for side in range(sides):
            rows = list(self.open(side).scan())
            if rows:
                t = sorted_zset(pa.concat_tables(rows))
                total += len(encode_run(t, self.config.page_bytes, CODEC_ZSTD_PLANES, 1).blob)
        return total


def kb(x: int) -> bytes:
    return int(x).to_bytes(8, "big")


def zset(keys, vals=None, ws=None) -> pa.Table:
    n = len(keys)
    return pa.table({"key": pa.array([kb(k) for k in keys], pa.binary()),
                     "val": pa.array([kb(v) for v in (vals if vals is not None else [1] * n)],
                                     pa.binary()),
                     "w": pa.array(ws if ws is not None else [1] * n, pa.int64())})


def rows_of(lsm: BucketLSM) -> dict:
    out = {}
    for t in lsm.scan():
        for k, v, w in zip(*(t[c].to_pylist() for c in ("key", "val", "w")), strict=True):
            out[(k, v)] = w
    return out


def assert_bounded(live: list[int], compact: list[int], stored: list[int]) -> None:
    """Live state over the second half of the run: flat (end <= 1.5 x middle, no batch above
    1.5 x the smallest) and within 2 x the open windows' compact size (an LSM also holds the
    superseded versions of open groups that newer runs updated, until a merge or expiry); the
    stored bytes within 3 x the live (before adaptive snapshots: 8-14 x, the last ~20 batches'
    bundles kept for their checkpoints)."""
    half = live[len(live) // 2:]
    assert max(stored[len(live) // 2:]) <= 3 * max(half), (stored, live)
    assert live[-1] <= 1.5 * live[len(live) // 2], live
    assert max(half) <= 1.5 * min(half), live
    for got, need in zip(live[len(live) // 2:], compact[len(live) // 2:], strict=True):
        assert got <= 2 * need + 4096, (live, compact)


# -- an aggregate over hopping windows, in append mode --------------------------------------

SIZE, HOP, SPAN = 10 * SEC, 2 * SEC, 2 * SEC  # windows of 10 s every 2 s; 2 s per batch
DELAY = 3 * SEC  # watermark: the batch's end minus 3 s


def _hopping(t: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = (t // HOP) * HOP
    return (np.concatenate([starts - i * HOP for i in range(SIZE // HOP)]),
            np.tile(k, SIZE // HOP))


def test_expiring_aggregate_state_stays_that_of_the_open_windows(tmp_path):
    """60 batches of bids (count(*) and max per (window, key): accumulators and min/max
    multisets) with a watermark 3 s behind: every closed window is emitted once with its
    exact count and max, the state holds exactly the open groups, and the live state stays
    flat. (With tombstones it grew by ~27 KB every batch, to 1.6 MB at batch 60 against
    72 KB of open groups: the closed windows' pages and markers stayed referenced.)"""
    schema = pa.schema([("window_start", TS), ("k", pa.int64()), ("price", pa.int64())])
    kernel = AggregateKernel(schema, ["window_start", "k"],
                             [Agg("count", None, "n"), Agg("max", "price", "top")])
    stream = Stream(tmp_path)
    rng = np.random.default_rng(11)
    truth: dict[tuple, list] = defaultdict(list)
    emitted: Counter = Counter()
    live, compact = [], []
    for b in range(60):
        t = b * SPAN + rng.integers(0, SPAN, 1500)
        k = rng.integers(0, 300, 1500)
        price = rng.integers(0, 10_000, 1500)
        ws, kk = _hopping(t, k)
        pp = np.tile(price, SIZE // HOP)
        for w_, k_, p_ in zip(ws.tolist(), kk.tolist(), pp.tolist(), strict=True):
            truth[(w_, k_)].append(p_)
        delta = pa.table({"window_start": pa.array(ws, pa.int64()).cast(TS), "k": kk,
                          "price": pp, W: np.ones(len(ws), np.int64)})
        lsm = stream.open()
        kernel.apply([delta], [lsm])
        watermark = (b + 1) * SPAN - DELAY
        final = kernel.expire([lsm], bound_key(schema, "window_start", watermark - SIZE), True)
        for row in final.to_pylist():
            emitted[(row["window_start"].timestamp() * SEC, row["k"], row["n"],
                     row["top"])] += row[W]
        stream.commit([lsm])
        live.append(stream.live_bytes())
        compact.append(stream.compact_bytes())
        if b % 10 == 9:  # the state is the open groups, nothing closed is left
            open_ = {g for g in truth if g[0] + SIZE > watermark}
            acc = list(stream.open().scan(ACC, ACC + b"\xff"))
            keys = pa.concat_arrays([t["key"].combine_chunks() for t in acc])
            got = kernel.group_codec.decode(pc.binary_slice(keys, 1, 1 << 30))
            got = {(int(w_.timestamp() * SEC), k_) for w_, k_ in
                   zip(got["window_start"].to_pylist(), got["k"].to_pylist(), strict=True)}
            assert got == open_
    closed = {g: v for g, v in truth.items() if g[0] + SIZE <= watermark}
    assert emitted == Counter({(float(w_), k_, len(v), max(v)): 1
                               for (w_, k_), v in closed.items()})
    assert_bounded(live, compact, stream.stored)


# -- a join on the window -----------------------------------------------------------------------

class DictSpine:
    """The state as the operators saw it before ranges: a dict, scanned and deleted by key."""

    def __init__(self):
        self.rows: dict[bytes, Counter] = defaultdict(Counter)

    def lookup_many(self, keys) -> pa.Table:
        out = [(k, v, w) for k in dict.fromkeys(keys.to_pylist())
               for v, w in self.rows.get(k, Counter()).items() if w]
        return pa.table({"key": pa.array([r[0] for r in out], pa.binary()),
                         "val": pa.array([r[1] for r in out], pa.binary()),
                         "w": pa.array([r[2] for r in out], pa.int64())})

    def insert_updates(self, t: pa.Table) -> None:
        for k, v, w in zip(*(t[c].to_pylist() for c in ("key", "val", "w")), strict=True):
            self.rows[k][v] += w

    def scan(self, lo=None, hi=None):
        keys = sorted(k for k in self.rows if (lo is None or k >= lo) and (hi is None or k < hi))
        t = self.lookup_many(pa.array(keys, pa.binary()))
        if t.num_rows:
            yield t

    def delete_keys(self, keys) -> None:
        for k in keys.to_pylist():
            self.rows.pop(k, None)


def _canon(t: pa.Table) -> pa.Table:
    """The output delta as a Z-set: equal rows summed, zero sums dropped, sorted."""
    cols = [c for c in t.column_names if c != W]
    z = t.group_by(cols, use_threads=False).aggregate([(W, "sum")])
    z = z.filter(pc.not_equal(z[f"{W}_sum"], 0))
    return z.sort_by([(c, "ascending") for c in cols]).select([*cols, f"{W}_sum"])


def _run_join(tmp_path, kernel, schemas, time_col, below) -> None:
    """60 batches of 800 rows a side, times in the batch's 2 s, keys 0..199, through BucketLSMs
    and through DictSpines (deleting key by key); ``below(b)``: batch b's expiry bound. The
    outputs must be equal, each side's state that of the reference, the live state bounded."""
    stream = Stream(tmp_path)
    ref = [DictSpine(), DictSpine()]
    rng = np.random.default_rng(5)
    live, compact = [], []
    for b in range(60):
        deltas = []
        for schema in schemas:
            t = b * SPAN + rng.integers(0, SPAN, 800)
            deltas.append(pa.table({
                "k": rng.integers(0, 200, 800), time_col(schema): pa.array(t).cast(TS),
                schema.names[2]: rng.integers(0, 1 << 30, 800), W: np.ones(800, np.int64)}))
        lsms = [stream.open(0), stream.open(1)]
        got = _canon(kernel.apply(deltas, lsms))
        assert got.equals(_canon(kernel.apply(deltas, ref))) and got.num_rows
        kernel.expire(lsms, below(b), False)
        kernel.expire(ref, below(b), False)
        stream.commit(lsms)
        live.append(stream.live_bytes())
        compact.append(stream.compact_bytes(sides=2))
        for side in (0, 1) if b % 6 == 5 else ():
            want = {(k, v): w for k, vals in ref[side].rows.items() for v, w in vals.items()
                    if w}  # an entry replaced (an outer join's count changed) sums to 0
            assert rows_of(stream.open(side)) == want
    assert_bounded(live, compact, stream.stored)


def test_expiring_join_state_stays_that_of_the_open_windows(tmp_path):
    """A left join on (window, key), tumbling 2 s windows, one window per batch, the watermark
    3 s behind the batch's end."""
    left = pa.schema([("k", pa.int64()), ("window_start", TS), ("v", pa.int64())])
    right = pa.schema([("k", pa.int64()), ("window_start", TS), ("u", pa.int64())])
    kernel = JoinKernel(left, right, "left", on=["window_start", "k"])
    _run_join(tmp_path, kernel, (left, right), lambda _s: "window_start",
              lambda b: bound_key(left, "window_start", (b + 1) * SPAN - DELAY - SPAN))


@pytest.mark.parametrize("how", ["inner", "full"])
def test_expiring_interval_join_state_stays_that_of_the_open_slots(tmp_path, how):
    """An interval join (rt within lt ± 1 s) on key, the watermark 3 s behind on both; a
    full outer join keeps each row's match count in its entry, which leaves with it."""
    left = pa.schema([("k", pa.int64()), ("lt", TS), ("v", pa.int64())])
    right = pa.schema([("k", pa.int64()), ("rt", TS), ("u", pa.int64())])
    interval = {"left": "lt", "right": "rt", "lower_us": -SEC, "upper_us": SEC}
    kernel = IntervalJoinKernel(left, right, how, on=["k"], interval=interval)
    _run_join(tmp_path, kernel, (left, right), lambda s: s.names[1],
              lambda b: expiry_bounds(interval, [0, 0], (b + 1) * SPAN - DELAY))


# -- the LSM's deleted ranges ---------------------------------------------------------------

CFG = LSMConfig(page_bytes=512, fanout=3, tier_base_bytes=256, inline_fence_pages=2)


def _pages_inside(lsm: BucketLSM, lo: bytes, hi: bytes) -> list[int]:
    out = []
    for run in lsm.root.runs:
        f = lsm._fences(run)
        out += [page_id(OP, 0, 0, run.first_seq + i) for i in range(run.pages)
                if lo <= f.firsts[i] and f.lasts[i] < hi]
    return out


def test_pages_inside_a_deleted_range_go_unread(tmp_path):
    """A 2000-key run, then [500, 1500) deleted: the write reads the root and the run's index
    page only, deletes exactly the pages inside the range from the reservoir, and the bucket
    answers as if the keys were gone."""
    stream = Stream(tmp_path, LSMConfig(page_bytes=512, fanout=50, inline_fence_pages=2))
    lsm = stream.open()
    lsm.insert_updates(zset(range(2000), [k % 7 for k in range(2000)]))
    stream.commit([lsm])
    lsm = stream.open()
    inside = _pages_inside(lsm, kb(500), kb(1500))
    assert len(inside) > 30 and lsm.pages_read == 2  # root + index page
    lsm.delete_range(kb(500), kb(1500))
    stats = stream.commit([lsm])
    assert lsm.pages_read == 2 and stats.merge_pages_read == 0 and stats.merges == 0
    assert stats.pages_dropped == len(inside) == stats.pages_deleted
    assert not any(stream.reader.contains(pid) for pid in inside)
    lsm = stream.open()
    want = {(kb(k), kb(k % 7)): 1 for k in range(2000) if not 500 <= k < 1500}
    assert rows_of(lsm) == want
    probe = pa.array([kb(k) for k in (499, 500, 1000, 1499, 1500)], pa.binary())
    assert {k for k, _ in rows_of_table(stream.open().lookup_many(probe))} == {kb(499),
                                                                              kb(1500)}
    assert len(lsm.root.ranges) == 1  # the two straddling pages still hold masked keys


def rows_of_table(t: pa.Table) -> dict:
    return {(k, v): w for k, v, w in zip(*(t[c].to_pylist() for c in ("key", "val", "w")),
                                          strict=True)}


def test_rows_written_after_a_range_deletion_stay(tmp_path):
    """Inserts after the deletion (in the same task and in later ones) survive it, through
    merges; once the merges rewrote every older page the range met, it is forgotten."""
    stream = Stream(tmp_path, CFG)
    model: dict = {}
    for i in range(3):
        lsm = stream.open()
        t = zset(range(i, 600, 3), [i] * 200)
        lsm.insert_updates(t)
        model.update(rows_of_table(t))
        stream.commit([lsm])
    lsm = stream.open()
    lsm.insert_updates(zset([100, 101], [9, 9]))  # before the deletion: deleted
    lsm.delete_range(kb(100), kb(300))
    lsm.insert_updates(zset([150], [7]))  # after it: kept
    model = {kv: w for kv, w in model.items() if not kb(100) <= kv[0] < kb(300)}
    model[(kb(150), kb(7))] = 1
    assert rows_of(lsm) == model
    stream.commit([lsm])
    for i in range(12):  # later rows in the range, and merges
        lsm = stream.open()
        t = zset([120 + i, 700 + i], [i, i])
        lsm.insert_updates(t)
        model.update(rows_of_table(t))
        stream.commit([lsm])
        assert rows_of(stream.open()) == model
        probe = pa.array([kb(k) for k in range(0, 720)], pa.binary())
        assert rows_of_table(stream.open().lookup_many(probe)) == model
    assert stream.open().root.ranges  # straddling pages of older runs still hold masked rows
    lsm = stream.open()
    lsm.delete_range(kb(10_000), kb(10_001))  # a range no run holds: not even recorded
    assert lsm.changed
    assert stream.commit([lsm]).pages_written == 0
    # a big run merges every run into a new oldest one: no older page meets the range
    lsm = stream.open()
    lsm.insert_updates(zset(range(5000, 9000), [1] * 4000))
    assert stream.commit([lsm]).runs == 1
    assert stream.open().root.ranges == []
    assert rows_of(stream.open()) == model | {(kb(k), kb(1)): 1 for k in range(5000, 9000)}


def test_deleting_below_an_advancing_bound_keeps_one_range(tmp_path):
    """Expiry's pattern: every batch adds keys above the bound and deletes below it. The
    root keeps one range however many batches ran, and the state holds the open keys only."""
    stream = Stream(tmp_path, CFG)
    pages = []
    for b in range(40):
        lsm = stream.open()
        lsm.insert_updates(zset(range(100 * b, 100 * b + 100)))
        lsm.delete_range(b"", kb(max(0, 100 * b - 200)))
        stream.commit([lsm])
        root = stream.open().root
        assert len(root.ranges) <= 1
        assert {k for k, _ in rows_of(stream.open())} == {
            kb(k) for k in range(max(0, 100 * b - 200), 100 * b + 100)}
        pages.append(sum(r.pages for r in root.runs))
    assert max(pages[20:]) <= 1.5 * max(pages[10:20]), pages


def test_the_number_of_ranges_stays_bounded(tmp_path):
    """Ranges that cannot merge (each deleted, then written into again, while an older run
    still holds keys in it) are bounded: past MAX_RANGES the write merges every run, which
    applies them all."""
    stream = Stream(tmp_path, LSMConfig(page_bytes=512, fanout=50, inline_fence_pages=2))
    lsm = stream.open()
    lsm.insert_updates(zset(range(0, 20 * (MAX_RANGES + 8))))
    stream.commit([lsm])
    model = {(kb(k), kb(1)): 1 for k in range(0, 20 * (MAX_RANGES + 8))}
    most = 0
    for i in range(MAX_RANGES + 8):
        lsm = stream.open()
        lsm.delete_range(kb(20 * i), kb(20 * i + 10))
        lsm.insert_updates(zset([20 * i + 5], [2]))
        model = {kv: w for kv, w in model.items()
                 if not kb(20 * i) <= kv[0] < kb(20 * i + 10)}
        model[(kb(20 * i + 5), kb(2))] = 1
        stream.commit([lsm])
        most = max(most, len(stream.open().root.ranges))
    assert MAX_RANGES // 2 < most <= MAX_RANGES
    assert rows_of(stream.open()) == model


def test_a_retried_write_with_ranges_writes_the_same_bytes(tmp_path):
    stream = Stream(tmp_path, CFG)
    rng = np.random.default_rng(3)
    for _ in range(3):
        lsm = stream.open()
        lsm.insert_updates(zset(rng.integers(0, 2000, 400).tolist()))
        stream.commit([lsm])
    runs = []
    for attempt in range(2):
        lsm = stream.open()
        lsm.lookup_many(pa.array([kb(k) for k in range(0, 2000, 37)], pa.binary()))
        lsm.delete_range(kb(200), kb(900))
        lsm.delete_range(b"", kb(50))
        lsm.insert_updates(zset([300, 2500], [5, 5]))
        w = PageRunWriter(stream.store, run_id=f"attempt-{attempt}")
        stats = lsm.write(w)
        runs.append(w.finish())
    assert stats.pages_dropped > 0
    assert [(r.leftover_ids.tolist(), r.leftover_data, r.file_page_ids.tolist(),
             r.deleted_ids.tolist()) for r in runs][0] == [
        (r.leftover_ids.tolist(), r.leftover_data, r.file_page_ids.tolist(),
         r.deleted_ids.tolist()) for r in runs][1]


def test_a_task_state_deletes_the_range_in_each_of_its_buckets(tmp_path):
    stream = Stream(tmp_path, LSMConfig(page_bytes=512, inline_fence_pages=2))
    lsms = {b: stream.open(bucket=b) for b in (0, 1)}
    for b, lsm in lsms.items():
        lsm.insert_updates(zset(range(b, 1000, 2)))
    stream.commit(list(lsms.values()))
    keys = pa.array([kb(k) for k in range(1000)], pa.binary())
    router = Router([(keys, np.arange(1000) % 2)])
    lsms = {b: stream.open(bucket=b) for b in (0, 1)}
    state = TaskState(lsms, router)
    state.delete_range(kb(100), kb(900))
    assert state.lookup_many(pa.array([kb(99), kb(100), kb(500)], pa.binary())).num_rows == 1
    w = PageRunWriter(stream.store, run_id="task")
    stats = state.write(w)
    stream.storage.absorb([w.finish()])
    stream.reader = ReservoirReader.open(stream.store, version=stream.storage.checkpoint())
    assert stats.pages_dropped > 10
    for b in (0, 1):
        assert {k for k, _ in rows_of(stream.open(bucket=b))} == {
            kb(k) for k in range(b, 1000, 2) if not 100 <= k < 900}


@pytest.mark.parametrize("lo,hi", [(b"b", b"a"), (b"a", b"a")])
def test_an_empty_or_inverted_range_deletes_nothing(tmp_path, lo, hi):
    stream = Stream(tmp_path, CFG)
    lsm = stream.open()
    lsm.insert_updates(pa.table({"key": [b"a", b"b"], "val": [b"", b""], "w": [1, 1]}))
    stream.commit([lsm])
    lsm = stream.open()
    lsm.delete_range(lo, hi)
    assert not lsm.changed
    assert len(rows_of(lsm)) == 2
    with pytest.raises(InvalidInput, match="bytes"):
        lsm.delete_range("a", b"b")
