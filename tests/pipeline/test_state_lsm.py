"""BucketLSM against a real ReservoirStorage on a LocalStore: a model test vs a dict across
write + checkpoint + reopen cycles, page reads proportional to the delta, bounded write
amplification, deterministic retries, deletions and scans."""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from headrace.errors import InvalidInput
from headrace.pipeline.state import BucketLSM, LSMConfig, WriteStats, page_id
from headrace.pipeline.state.layout import Root, decode_index
from headrace.reservoir import PageRunWriter, ReservoirReader, ReservoirStorage
from headrace.store import LocalStore

OP, SIDE = 3, 1


class Env:
    """A reservoir stream and the reader of its latest checkpoint, like the runner's tasks."""

    def __init__(self, path: str):
        self.path = path
        self.store = LocalStore(path + "/store", fsync=False)
        self.storage = ReservoirStorage.open(self.store, cache_dir=path + "/cache")
        self.reader = None
        self.runs = 0

    def open(self, bucket: int, config: LSMConfig, side: int = SIDE) -> BucketLSM:
        return BucketLSM(self.reader, OP, side, bucket, config)

    def commit(self, lsms: list[BucketLSM]) -> WriteStats:
        """Each bucket written by its own 'task' (a PageRunWriter), then one checkpoint."""
        total, runs = WriteStats(), []
        for lsm in lsms:
            self.runs += 1
            w = PageRunWriter(self.store, run_id=f"task-{self.runs}")
            total.add(lsm.write(w))
            runs.append(w.finish())
        self.storage.absorb(runs)
        v = self.storage.checkpoint()
        # as the workers do: the next version's reader is built on the last (one cache)
        self.reader = (self.reader.at(v) if self.reader is not None else
                       ReservoirReader.open(self.store, version=v, cache_dir=self.path + "/cache"))
        return total

    def close(self) -> None:
        self.storage.close()
        if self.reader is not None:
            self.reader.close()

    def reopen_storage(self) -> None:
        self.storage.close()
        self.storage = ReservoirStorage.open(self.store, cache_dir=self.path + "/cache")


@pytest.fixture
def env(tmp_path):
    e = Env(str(tmp_path))
    yield e
    e.close()


def kb(x: int) -> bytes:
    return int(x).to_bytes(8, "big")


def zset(keys, vals, ws) -> pa.Table:
    return pa.table({"key": pa.array([k if isinstance(k, bytes) else kb(k) for k in keys],
                                     pa.binary()),
                     "val": pa.array([v if isinstance(v, bytes) else kb(v) for v in vals],
                                     pa.binary()),
                     "w": pa.array(ws, pa.int64())})


def as_dict(t: pa.Table) -> dict:
    return {(k, v): w for k, v, w in zip(t.column("key").to_pylist(), t.column("val").to_pylist(),
                                         t.column("w").to_pylist(), strict=True)}


def model_rows(model: dict, keys) -> dict:
    keys = set(keys)
    return {kv: w for kv, w in model.items() if kv[0] in keys}


def add(model: dict, t: pa.Table) -> None:
    for kv, w in zip(zip(t.column("key").to_pylist(), t.column("val").to_pylist(), strict=True),
                     t.column("w").to_pylist(), strict=True):
        s = model.get(kv, 0) + w
        if s:
            model[kv] = s
        else:
            model.pop(kv, None)


# -- model test -----------------------------------------------------------------------------

KEYS = st.sampled_from([b"", b"\x00", b"\x00\x00", b"a", b"a\x00", b"ab", b"b", b"\xff",
                        b"\xff\x00", b"k" * 40, b"m", b"z"])
VALS = st.sampled_from([b"", b"\x00", b"1", b"2", b"v" * 30])
ROWS = st.lists(st.tuples(KEYS, VALS, st.integers(-2, 2)), max_size=25)
BUCKETS = st.integers(0, 2)
TINY = LSMConfig(page_bytes=256, fanout=3, tier_base_bytes=200, inline_fence_pages=1,
                 compression="zstd")
TINY_RAW = LSMConfig(page_bytes=300, fanout=4, tier_base_bytes=64, inline_fence_pages=2,
                     compression="none")


class LSMModel(RuleBasedStateMachine):
    """Random inserts, retractions, deletions (of keys and of key ranges), lookups, writes,
    failed tasks and reopens of a few buckets, against a dict of (key, val) -> weight per
    bucket."""

    config = TINY

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="hr-lsm-model-")
        self.env = Env(self.dir)
        self.durable: dict[int, dict] = {b: {} for b in range(3)}
        self.model: dict[int, dict] = {b: {} for b in range(3)}
        self.open: dict[int, BucketLSM] = {}

    def teardown(self):
        self.env.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def lsm(self, bucket: int) -> BucketLSM:
        if bucket not in self.open:
            self.open[bucket] = self.env.open(bucket, self.config)
        return self.open[bucket]

    @rule(bucket=BUCKETS, rows=ROWS)
    def insert(self, bucket, rows):
        t = zset([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        self.lsm(bucket).insert_updates(t)
        add(self.model[bucket], t)

    @rule(bucket=BUCKETS, keys=st.lists(KEYS, max_size=4))
    def delete(self, bucket, keys):
        self.lsm(bucket).delete_keys(pa.array(keys, pa.binary()))
        for kv in [kv for kv in self.model[bucket] if kv[0] in set(keys)]:
            del self.model[bucket][kv]

    @rule(bucket=BUCKETS, lo=KEYS, hi=KEYS)
    def delete_range(self, bucket, lo, hi):
        self.lsm(bucket).delete_range(lo, hi)
        for kv in [kv for kv in self.model[bucket] if lo <= kv[0] < hi]:
            del self.model[bucket][kv]

    @rule(bucket=BUCKETS, keys=st.lists(KEYS, max_size=8))
    def lookup(self, bucket, keys):
        got = self.lsm(bucket).lookup_many(pa.array(keys, pa.binary()))
        assert got.schema.equals(pa.schema([("key", pa.binary()), ("val", pa.binary()),
                                            ("w", pa.int64())]))
        assert as_dict(got) == model_rows(self.model[bucket], keys)
        assert len(as_dict(got)) == got.num_rows  # consolidated
        assert 0 not in got.column("w").to_pylist()

    @rule(bucket=BUCKETS, keys=st.lists(KEYS, max_size=6), val=VALS)
    def update(self, bucket, keys, val):
        """An aggregate's step: look the keys up, retract every row found, insert one new row
        per key (written as replacing rows: the task knows these keys whole)."""
        lsm = self.lsm(bucket)
        got = lsm.lookup_many(pa.array(keys, pa.binary()))
        old = as_dict(got)
        ks = sorted(set(keys))
        t = zset([k for k, _ in old] + ks, [v for _, v in old] + [val] * len(ks),
                 [-w for w in old.values()] + [1] * len(ks))
        lsm.insert_updates(t)
        add(self.model[bucket], t)

    @rule(bucket=BUCKETS, looked=st.lists(KEYS, max_size=6), keys=st.lists(KEYS, max_size=6),
          rows=st.lists(st.tuples(VALS, st.integers(-2, 2)), max_size=8))
    def replace(self, bucket, looked, keys, rows):
        """A kernel's complete new rows for keys (replace_rows): those it looked up first are
        stored as they are; any other falls back to a retraction plus an insertion."""
        lsm = self.lsm(bucket)
        lsm.lookup_many(pa.array(looked, pa.binary()))
        ks = sorted(set(keys))
        new = {}
        for i, (v, w) in enumerate(rows):
            if ks and w:
                new[(ks[i % len(ks)], v)] = w
        t = zset([k for k, _ in new], [v for _, v in new], list(new.values()))
        lsm.replace_rows(pa.array(ks, pa.binary()), t)
        for kv in [kv for kv in self.model[bucket] if kv[0] in set(ks)]:
            del self.model[bucket][kv]
        add(self.model[bucket], t)

    @rule()
    def write_and_checkpoint(self):
        self.env.commit(list(self.open.values()))
        self.open = {}
        self.durable = {b: dict(m) for b, m in self.model.items()}

    @rule()
    def task_fails(self):
        """A task dies before writing: nothing of it is visible, the state is as checkpointed."""
        self.open = {}
        self.model = {b: dict(m) for b, m in self.durable.items()}

    @rule()
    def reopen_storage(self):
        self.open = {}
        self.model = {b: dict(m) for b, m in self.durable.items()}
        self.env.reopen_storage()

    @invariant()
    def scan_matches(self):
        for b in self.open:
            rows = list(self.lsm(b).scan())
            keys = [k for t in rows for k in t.column("key").to_pylist()]
            assert keys == sorted(keys)
            assert {kv: w for t in rows for kv, w in as_dict(t).items()} == self.model[b]


class LSMModelRaw(LSMModel):
    config = TINY_RAW


_model_settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                           suppress_health_check=list(HealthCheck))
TestLSMModel = LSMModel.TestCase
TestLSMModel.settings = _model_settings
TestLSMModelRaw = LSMModelRaw.TestCase
TestLSMModelRaw.settings = settings(_model_settings, max_examples=12)


# -- reads proportional to the delta -------------------------------------------------------------

def _expected_reads(reader, op, side, bucket, keys) -> tuple[int, int]:
    """(reads a lookup of ``keys`` needs, pages the bucket has), from the stored fences, one
    plain comparison per (key, page): the root, each big run's index page, and every page
    whose [first, last] holds a key."""
    root = Root.from_bytes(reader.read(page_id(op, side, bucket, 0)), pid=0)
    need, total = 1, 1
    for run in root.runs:
        f = run.fences
        if f is None:
            pid = page_id(op, side, bucket, run.index_seq)
            f = decode_index(reader.read(pid), pid=pid, pages=run.pages)
            need += 1
            total += 1
        total += run.pages
        need += sum(1 for i in range(run.pages)
                    if any(f.firsts[i] <= k <= f.lasts[i] for k in keys))
    return need, total


def test_lookup_reads_only_the_pages_the_keys_fall_in(env):
    cfg = LSMConfig(page_bytes=512, fanout=64, inline_fence_pages=2)  # no merges: 10 runs
    rng = np.random.default_rng(7)
    model: dict = {}
    for i in range(10):
        lsm = env.open(0, cfg)
        n = 2000 if i < 8 else 20  # and two small runs with inline fences
        ks = rng.integers(0, 1 << 40, n)
        t = zset(ks.tolist(), rng.integers(0, 5, n).tolist(), [1] * n)
        lsm.insert_updates(t)
        add(model, t)
        env.commit([lsm])
    keys = [kb(k) for k in rng.choice([int.from_bytes(k, "big") for k, _ in model], 3)]
    keys += [kb(1 << 41)]  # above every key: no page holds it
    need, total = _expected_reads(env.reader, OP, SIDE, 0, keys)
    assert total > 10 * need  # the bucket is much bigger than what the lookup needs
    before = env.reader.reads
    lsm = env.open(0, cfg)
    got = lsm.lookup_many(pa.array(keys * 3, pa.binary()))  # repeats cost nothing more
    assert env.reader.reads - before == need == lsm.pages_read
    assert as_dict(got) == model_rows(model, keys)
    before = env.reader.reads
    lsm.lookup_many(pa.array(keys, pa.binary()))  # decoded pages are kept for the task
    assert env.reader.reads == before


def test_a_key_spanning_pages_is_found_whole(env):
    cfg = LSMConfig(page_bytes=512, inline_fence_pages=0)
    lsm = env.open(0, cfg)
    big = zset([7] * 300 + [3, 9], list(range(300)) + [1, 1], [1] * 302)
    lsm.insert_updates(big)
    env.commit([lsm])
    lsm = env.open(0, cfg)
    assert lsm.root.runs[0].pages > 5
    got = lsm.lookup_many(pa.array([kb(7)], pa.binary()))
    assert as_dict(got) == {(kb(7), kb(i)): 1 for i in range(300)}
    for edge in (3, 9):  # in the first / last page only: root + run index + that page
        lsm = env.open(0, cfg)
        assert as_dict(lsm.lookup_many(pa.array([kb(edge)], pa.binary()))) == {
            (kb(edge), kb(1)): 1}
        assert lsm.pages_read == 3


# -- write amplification ----------------------------------------------------------------------

def test_write_amplification_is_bounded_and_merges_are_tiered(env):
    """A grouped aggregate's updates (retract the old value, insert the new) for 120 batches:
    each key's rows are rewritten a bounded number of times; runs stay few; the bucket is
    never rewritten whole as a routine."""
    cfg = LSMConfig(page_bytes=4096, fanout=4, tier_base_bytes=4096)
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 1 << 40, 20_000))
    n = len(keys)
    counts = dict.fromkeys(keys.tolist(), 1)
    lsm = env.open(0, cfg)
    lsm.insert_updates(zset(keys.tolist(), [1] * n, [1] * n))
    first = env.commit([lsm])
    total = WriteStats()
    full_rewrites, max_runs = 0, 0
    for _ in range(120):
        lsm = env.open(0, cfg)
        ks = rng.choice(keys, 60, replace=False).tolist()
        old = as_dict(lsm.lookup_many(pa.array([kb(k) for k in ks], pa.binary())))
        assert old == {(kb(k), kb(counts[k])): 1 for k in ks}
        ups = zset(ks + ks, [counts[k] for k in ks] + [counts[k] + 1 for k in ks],
                   [-1] * len(ks) + [1] * len(ks))
        for k in ks:
            counts[k] += 1
        lsm.insert_updates(ups)
        s = env.commit([lsm])
        total.add(s)
        full_rewrites += s.rows_written >= n
        max_runs = max(max_runs, s.runs)
    wa = (total.raw_bytes_written + first.raw_bytes_written) / (
        total.delta_raw_bytes + first.delta_raw_bytes)
    assert 1.0 <= wa <= 10.0, wa
    assert total.merges > 10  # merges happen...
    assert full_rewrites <= 1  # ...but the 20k-key base run is almost never part of one
    assert max_runs <= 3 * (cfg.fanout - 1) + 2
    lsm = env.open(0, cfg)
    got = {k: int.from_bytes(v, "big") for (k, v), w in as_dict(
        pa.concat_tables(list(lsm.scan()))).items()}
    assert got == {kb(k): c for k, c in counts.items()}


# -- retries, deletions, scans, inputs -----------------------------------------------------------------

def _run_bytes(run) -> tuple:
    return (run.leftover_ids.tolist(), run.leftover_sizes.tolist(), run.leftover_data,
            run.file_page_ids.tolist(), run.deleted_ids.tolist())


def test_retried_write_produces_identical_page_ids_and_bytes(env):
    cfg = LSMConfig(page_bytes=512, fanout=3, tier_base_bytes=100, inline_fence_pages=1)
    rng = np.random.default_rng(5)
    for _ in range(2):  # two runs: the retried write below merges them with its delta
        lsm = env.open(4, cfg)
        lsm.insert_updates(zset(rng.integers(0, 500, 200).tolist(), [1] * 200, [1] * 200))
        env.commit([lsm])
    # an aggregate-like update of known keys (retract val 1, insert val 2: replacing rows)
    # and random changes (data rows)
    upd = rng.choice(500, 120, replace=False).tolist()
    delta = pa.concat_tables([
        zset(upd + upd, [1] * 120 + [2] * 120, [-1] * 120 + [1] * 120),
        zset(rng.integers(0, 500, 150).tolist(), rng.integers(0, 3, 150).tolist(),
             rng.choice([-1, 1], 150).tolist())])
    n = delta.num_rows
    runs = []
    for attempt in range(2):
        lsm = env.open(4, cfg)
        rows = delta if attempt == 0 else delta.take(rng.permutation(n))  # another order
        if attempt == 0:
            lsm.insert_updates(rows)
        else:  # and split across calls
            lsm.insert_updates(rows.slice(0, 70))
            lsm.insert_updates(rows.slice(70))
        lsm.lookup_many(rows.column("key"))
        lsm.delete_keys(pa.array([kb(1), kb(2)], pa.binary()))
        w = PageRunWriter(env.store, run_id=f"attempt-{attempt}")
        stats = lsm.write(w)
        runs.append(w.finish())
    assert stats.merges >= 1 and stats.pages_deleted > 0
    assert _run_bytes(runs[0]) == _run_bytes(runs[1])
    # the driver may absorb the retry's run after the first one: the state is the same
    env.storage.absorb(runs)
    env.reader = ReservoirReader.open(env.store, version=env.storage.checkpoint())
    assert env.open(4, cfg).lookup_many(pa.array([kb(1)], pa.binary())).num_rows == 0


def test_delete_keys_drops_every_value_of_the_keys_across_runs(env):
    cfg = LSMConfig(page_bytes=256, fanout=8)
    for i in range(3):
        lsm = env.open(0, cfg)
        lsm.insert_updates(zset([1, 2, 3, 4], [i, i, i, i], [1, 1, 1, 1]))
        env.commit([lsm])
    lsm = env.open(0, cfg)
    lsm.insert_updates(zset([2, 5], [9, 9], [1, 1]))  # before the delete: dropped too
    lsm.delete_keys(pa.array([kb(2), kb(3)], pa.binary()))
    lsm.insert_updates(zset([3], [7], [1]))  # after it: kept
    expect = {(kb(1), kb(i)): 1 for i in range(3)} | {(kb(4), kb(i)): 1 for i in range(3)}
    expect |= {(kb(5), kb(9)): 1, (kb(3), kb(7)): 1}
    assert as_dict(lsm.lookup_many(pa.array([kb(k) for k in range(6)], pa.binary()))) == expect
    env.commit([lsm])
    lsm = env.open(0, cfg)
    assert any(r.kind == 1 for r in lsm.root.runs)  # a tombstone run, no rewrite of the rest
    assert as_dict(lsm.lookup_many(pa.array([kb(k) for k in range(6)], pa.binary()))) == expect
    assert as_dict(pa.concat_tables(list(lsm.scan()))) == expect


def test_writes_that_also_delete_keys_still_merge(env):
    """A join that retracts rows writes, every batch, a data run and a small replacing run
    (delete_keys). The small run must not keep the data runs from merging: the runs stay few
    and the rows written stay a bounded multiple of the delta (before: a run per batch)."""
    cfg = LSMConfig(page_bytes=4096, fanout=4, tier_base_bytes=4096)
    rng = np.random.default_rng(5)
    live: dict[int, int] = {}
    total, max_runs = WriteStats(), 0
    for b in range(40):
        lsm = env.open(0, cfg)
        new = rng.integers(0, 1 << 40, 400).tolist()
        lsm.insert_updates(zset(new, [b] * len(new), [1] * len(new)))
        gone = rng.choice(sorted(live), 5, replace=False).tolist() if len(live) > 5 else []
        if gone:
            lsm.delete_keys(pa.array([kb(k) for k in gone], pa.binary()))
        for k in gone:
            live.pop(k)
        live.update(dict.fromkeys(new, b))
        s = env.commit([lsm])
        total.add(s)
        max_runs = max(max_runs, s.runs)
    assert max_runs <= 3 * (cfg.fanout - 1) + 2, max_runs
    assert total.merges >= 5
    assert total.raw_bytes_written <= 10 * total.delta_raw_bytes
    lsm = env.open(0, cfg)
    got = {int.from_bytes(k, "big"): int.from_bytes(v, "big") for (k, v), w in as_dict(
        pa.concat_tables(list(lsm.scan()))).items()}
    assert got == live


def test_unchanged_bucket_writes_nothing(env):
    cfg = LSMConfig()
    lsm = env.open(0, cfg)
    lsm.insert_updates(zset([1], [1], [1]))
    env.commit([lsm])
    lsm = env.open(0, cfg)
    lsm.lookup_many(pa.array([kb(1)], pa.binary()))
    lsm.delete_keys(pa.array([], pa.binary()))
    assert not lsm.changed
    w = PageRunWriter(env.store, run_id="x")
    assert lsm.write(w).pages_written == 0
    assert w.finish().page_count == 0
    with pytest.raises(RuntimeError):
        lsm.lookup_many(pa.array([kb(1)], pa.binary()))
    lsm = env.open(0, cfg)  # changes that cancel out write nothing either
    lsm.insert_updates(zset([2, 2], [1, 1], [1, -1]))
    assert lsm.changed
    w = PageRunWriter(env.store, run_id="y")
    assert lsm.write(w).pages_written == 0
    assert w.finish().page_count == 0


def test_updates_that_cancel_leave_an_empty_bucket(env):
    cfg = LSMConfig(fanout=3)
    for w in (1, -1, 1, -1):
        lsm = env.open(0, cfg)
        lsm.insert_updates(zset([1, 2], [1, 1], [w, w]))
        env.commit([lsm])
    lsm = env.open(0, cfg)
    assert lsm.lookup_many(pa.array([kb(1), kb(2)], pa.binary())).num_rows == 0
    assert list(lsm.scan()) == []


def test_bad_inputs_are_refused(env):
    lsm = env.open(0, LSMConfig())
    with pytest.raises(InvalidInput, match="nulls"):
        lsm.lookup_many(pa.array([b"a", None], pa.binary()))
    with pytest.raises(InvalidInput, match="binary"):
        lsm.lookup_many(pa.array([1, 2]))
    with pytest.raises(InvalidInput, match="columns"):
        lsm.insert_updates(pa.table({"key": [b"a"], "w": [1]}))
    with pytest.raises(InvalidInput, match="'w'"):
        lsm.insert_updates(pa.table({"key": [b"a"], "val": [b"b"], "w": [1.5]}))
    with pytest.raises(InvalidInput, match="'val'.*nulls"):
        lsm.insert_updates(pa.table({"key": [b"a"], "val": pa.array([None], pa.binary()),
                                     "w": [1]}))
    for bad in ({"page_bytes": 10}, {"fanout": 2}, {"compression": "lz4"}, {"zstd_level": 0}):
        with pytest.raises(InvalidInput, match=next(iter(bad))):
            LSMConfig(**bad)
    with pytest.raises(InvalidInput, match="out of range"):
        page_id(512, 0, 0, 0)


def test_sides_and_buckets_do_not_share_pages(env):
    cfg = LSMConfig()
    a, b, c = env.open(0, cfg, side=0), env.open(0, cfg, side=1), env.open(1, cfg, side=0)
    for i, x in enumerate((a, b, c)):
        x.insert_updates(zset([1], [i], [1]))
    env.commit([a, b, c])
    for i, x in enumerate((env.open(0, cfg, side=0), env.open(0, cfg, side=1),
                           env.open(1, cfg, side=0))):
        assert as_dict(x.lookup_many(pa.array([kb(1)], pa.binary()))) == {(kb(1), kb(i)): 1}


def test_deletions_survive_merges_that_leave_older_runs(env):
    """A merge of the newest runs that holds a tombstone but not the (bigger, older) run the
    deleted rows live in must keep the tombstone: the deleted key stays deleted."""
    cfg = LSMConfig(page_bytes=1024, fanout=3, tier_base_bytes=256)
    lsm = env.open(0, cfg)
    lsm.insert_updates(zset(list(range(2000)), [1] * 2000, [1] * 2000))  # a high-tier run
    env.commit([lsm])
    lsm = env.open(0, cfg)
    lsm.delete_keys(pa.array([kb(5), kb(6)], pa.binary()))
    env.commit([lsm])
    merged = 0
    for i in range(6):  # small runs: tier-0 merges that include the tombstone, not the base
        lsm = env.open(0, cfg)
        lsm.insert_updates(zset([3000 + i, 6], [1, 100 + i], [1, 1]))
        merged += env.commit([lsm]).merges
        got = as_dict(env.open(0, cfg).lookup_many(pa.array([kb(5), kb(6)], pa.binary())))
        assert got == {(kb(6), kb(100 + j)): 1 for j in range(i + 1)}
    lsm = env.open(0, cfg)
    assert merged >= 2 and lsm.root.runs[0].rows == 2000  # the base run was never rewritten


def test_a_later_task_on_the_worker_reuses_decoded_pages_and_checks_them(env):
    """The worker's page cache: a second task's lookup of the same committed pages reads and
    decodes nothing but the root, returns the same rows; a changed page (new version) is
    decoded afresh."""
    from headrace.pipeline.state.cache import PAGES

    cfg = LSMConfig(page_bytes=512)
    lsm = BucketLSM(env.reader, OP, SIDE, 3, cfg, shared_cache=True)
    t = zset(list(range(2000)), [1] * 2000, [1] * 2000)
    lsm.insert_updates(t)
    env.commit([lsm])
    keys = pa.array([kb(k) for k in (5, 900, 1999)], pa.binary())
    first = BucketLSM(env.reader, OP, SIDE, 3, cfg, shared_cache=True).lookup_many(keys)
    hits, reads = PAGES.hits, env.reader.reads
    second = BucketLSM(env.reader, OP, SIDE, 3, cfg, shared_cache=True)
    again = second.lookup_many(keys)
    # three pages and the run's index page come from the cache; only the root is read
    assert PAGES.hits - hits == 4 and as_dict(again) == as_dict(first)
    assert env.reader.reads - reads == 1 == second.pages_read
    upd = BucketLSM(env.reader, OP, SIDE, 3, cfg, shared_cache=True)
    upd.insert_updates(zset([900], [1], [-1]))
    env.commit([upd])
    after = BucketLSM(env.reader, OP, SIDE, 3, cfg, shared_cache=True).lookup_many(keys)
    assert as_dict(after) == {k: v for k, v in as_dict(first).items() if k[0] != kb(900)}
