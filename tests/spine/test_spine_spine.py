"""Spine: background merges, the consolidated view, cursor, truncate_below, errors surfaced."""

from __future__ import annotations

import shutil
import threading
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from headrace.errors import InvalidInput
from headrace.spine import Batch, Circuit, Spine, SpineConfig, SpineError
from headrace.spine.errors import SpineWriteError


def rows(seed: int, n: int = 300, keys: int = 500) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"key": rng.integers(0, keys, n), "val": rng.integers(0, 3, n),
                     "w": rng.choice([-1, 1], n)})


def as_dict(t: pa.Table) -> dict:
    return {(k, v): w for k, v, w in
            zip(*(t.column(c).to_pylist() for c in ("key", "val", "w")), strict=True)}


def add(model: dict, t: pa.Table) -> None:
    for k, v, w in zip(*(t.column(c).to_pylist() for c in ("key", "val", "w")), strict=True):
        model[(k, v)] += w


def test_background_merges_keep_the_view_and_shrink_the_spine():
    cfg = SpineConfig(merge_fanout=3, base_rows=200)
    model: dict = defaultdict(int)
    with Spine(pa.int64(), pa.int64(), name="bg", config=cfg) as sp:
        names = [t.name for t in threading.enumerate()]
        assert "headrace-spine-merge-bg" in names
        for i in range(60):
            t = rows(i)
            add(model, t)
            sp.insert(t)  # a raw Arrow table is consolidated on the way in
        assert sp.wait_idle(30)
        m = sp.metrics()
        assert m["merges"] > 5 and m["batches"] < 20
        assert as_dict(sp.to_table()) == {k: w for k, w in model.items() if w}
        assert all(len(b) <= sum(len(x) for x in sp.batches) for b in sp.batches)
    assert "headrace-spine-merge-bg" not in [t.name for t in threading.enumerate()]


def test_readers_see_consistent_views_while_merges_swap():
    cfg = SpineConfig(merge_fanout=2, base_rows=50)
    sp = Spine(pa.int64(), pa.int64(), config=cfg)
    total = rows(0, n=2000)
    batches = [Batch.from_arrow(total.slice(i, 100)) for i in range(0, 2000, 100)]
    errors = []

    def reader():
        try:
            for _ in range(40):
                t = sp.to_table()
                assert t.num_rows == 0 or t.column("w").to_numpy().all()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=reader, name="test-reader")
    th.start()
    for b in batches:
        sp.insert(b)
    th.join()
    sp.wait_idle(30)
    assert not errors
    assert sp.to_table().equals(Batch.from_arrow(total).to_table())
    sp.close()


def test_sync_merge_step_and_compact():
    sp = Spine.from_batches([Batch.from_arrow(rows(i, n=10)) for i in range(4)],
                            config=SpineConfig(merge_fanout=2, background_merge=False))
    before = sp.to_table()
    assert sp.merge_step() is True
    assert len(sp.batches) == 3
    sp.compact()
    assert len(sp.batches) == 1 and sp.to_table().equals(before)
    assert sp.merge_step() is False
    sp.close()


def test_cursor_walks_keys_in_order_and_seeks():
    cfg = SpineConfig(background_merge=False)
    parts = [rows(i, n=400, keys=300) for i in range(5)]
    sp = Spine.from_batches([Batch.from_arrow(p) for p in parts], config=cfg)
    model: dict = defaultdict(int)
    for p in parts:
        add(model, p)
    live = {k: w for k, w in model.items() if w}
    by_key: dict = defaultdict(dict)
    for (k, v), w in live.items():
        by_key[k][v] = w
    cur = sp.cursor(chunk_rows=64)
    seen = []
    for key, vals in cur:
        seen.append(key)
        assert dict(zip(vals.column("val").to_pylist(), vals.column("w").to_pylist(),
                        strict=True)) == by_key[key]
    assert seen == sorted(by_key)
    cur.seek(150)
    assert cur.valid() and cur.key() == min(k for k in by_key if k >= 150)
    assert cur.weight() == sum(by_key[cur.key()].values())
    bounded = [k for k, _ in sp.cursor(lo=100, hi=120)]
    assert bounded == sorted(k for k in by_key if 100 <= k < 120)
    one = Batch.from_arrow(parts[0])
    bc = one.cursor(chunk_rows=50)
    bc.seek(10)
    assert bc.key() == min(k for k in one.to_table().column("key").to_pylist() if k >= 10)
    assert [k for k, _ in one.cursor()] == sorted(set(one.to_table().column("key").to_pylist()))


def test_string_keys_cursor_and_lookup():
    t = pa.table({"key": ["b", "a", "c", "a"], "val": [1.0, 2.0, 3.0, 2.0], "w": [1, 1, 1, -1]})
    sp = Spine.from_batches([Batch.from_arrow(t), Batch.from_pydict(["d"], [4.0], [5])])
    assert [k for k, _ in sp.cursor()] == ["b", "c", "d"]
    got = sp.lookup_many(pa.array(["a", "d", "zz"]))
    assert as_dict(got) == {("d", 4.0): 5}


def test_truncate_below_hides_then_drops_history():
    sp = Spine.from_batches([Batch.from_pydict([1, 5, 9], [0, 0, 0], [1, 1, 1]),
                             Batch.from_pydict([1, 9], [0, 0], [1, 1])])
    sp.truncate_below(5)
    assert sp.to_table().column("key").to_pylist() == [5, 9]
    assert sp.lookup_many(pa.array([1, 9])).column("key").to_pylist() == [9]
    sp.truncate_below(2)  # bounds only rise
    sp.compact()
    assert sum(len(b) for b in sp.batches) == 2


def test_zero_sum_across_batches_is_hidden():
    sp = Spine.from_batches([Batch.from_pydict([7], [1], [3]), Batch.from_pydict([7], [1], [-3])])
    assert sp.to_table().num_rows == 0
    assert sp.lookup_many(pa.array([7])).num_rows == 0


def test_bad_inputs_and_configs_are_refused():
    sp = Spine(pa.int64(), pa.int64(), config=SpineConfig(background_merge=False))
    with pytest.raises(InvalidInput):
        sp.insert(Batch.from_pydict(["x"], [1], [1]))
    with pytest.raises(ValueError, match="merge_fanout"):
        SpineConfig(merge_fanout=1)
    with pytest.raises(ValueError, match="block_bytes"):
        SpineConfig(block_bytes=1)
    with pytest.raises(InvalidInput):
        Spine.from_batches([])
    sp.close()
    with pytest.raises(SpineError, match="closed"):
        sp.insert(Batch.from_pydict([1], [1], [1]))


def test_background_merge_failure_is_surfaced(tmp_path, monkeypatch):
    cfg = SpineConfig(merge_fanout=2, base_rows=10)
    circuit = Circuit.open(tmp_path / "state", "fp", config=cfg)
    sp = circuit.spine("s", pa.int64(), pa.int64())

    def broken_merge(*args, **kwargs):
        raise RuntimeError("merge kernel failed")

    monkeypatch.setattr(Batch, "merge", broken_merge)
    sp.insert(Batch.from_arrow(rows(1, n=50)))
    sp.insert(Batch.from_arrow(rows(2, n=50)))
    with pytest.raises(SpineError, match="merge failed"):
        sp.wait_idle(30)
    with pytest.raises(SpineError):
        sp.insert(Batch.from_arrow(rows(3)))
    with pytest.raises(SpineError):
        circuit.close()


def test_a_vanished_disk_keeps_the_spine_serving_and_fails_the_commit(tmp_path):
    """Spilling is optional: a merge whose output cannot be written keeps it in memory; the
    commit, which must write it, raises SpineWriteError naming the file."""
    cfg = SpineConfig(merge_fanout=2, base_rows=10, memory_budget_bytes=0)
    circuit = Circuit.open(tmp_path / "state", "fp", config=cfg)
    sp = circuit.spine("s", pa.int64(), pa.int64())
    shutil.rmtree(tmp_path / "state")  # the disk goes away under the spine
    model: dict = defaultdict(int)
    for i in (1, 2, 3):
        sp.insert(Batch.from_arrow(rows(i, n=50)))
        add(model, rows(i, n=50))
    assert sp.wait_idle(30)
    assert as_dict(sp.to_table()) == {k: w for k, w in model.items() if w}
    assert sp.metrics()["spill_failures"] >= 1
    with pytest.raises(SpineWriteError, match=r"state/.*\.batch") as ei:
        circuit.commit()
    assert isinstance(ei.value, OSError)
    circuit.close()


def test_circuit_commit_is_all_spines_and_reopens(tmp_path):
    cfg = SpineConfig(merge_fanout=2, base_rows=50, memory_budget_bytes=4096)
    with Circuit.open(tmp_path, "g", config=cfg) as c:
        a = c.spine("agg", pa.int64(), pa.int64())
        j = c.spine("join.left", pa.large_string(), pa.large_binary())
        a.insert(Batch.from_arrow(rows(1)))
        j.insert(Batch.from_pydict(["x", "y"], [b"1", b"2"], [1, 2]))
        a.truncate_below(10)
        c.commit(step=3, identifier="after-step-3")
        a.insert(Batch.from_arrow(rows(2)))  # not committed
        want_a = Batch.merge([Batch.from_arrow(rows(1))], lower_bound=10).to_table()
        m = c.metrics()
        assert m["step"] == 3 and "spine_agg_rows" in m
    with Circuit.open(tmp_path, "g", config=cfg) as c:
        assert c.checkpoints()[-1].identifier == "after-step-3"
        assert c.spine("agg").to_table().equals(want_a)
        assert c.spine("agg").lower_bound == 10
        assert as_dict(c.spine("join.left").to_table()) == {("x", b"1"): 1, ("y", b"2"): 2}
        with pytest.raises(InvalidInput):
            c.spine("new-one")
        with pytest.raises(InvalidInput):
            c.spine("../escape", pa.int64(), pa.int64())
