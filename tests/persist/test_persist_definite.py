"""Issue 15 item 5: definiteness. Writing *different* data for times a shard already holds is a
DefinitenessViolation; writing the same data again (a replay) is a no-op. Old code dropped both
silently (``append`` returned False, the sink called it a replay)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from headrace.persist import (
    DefinitenessViolation,
    PersistClient,
    SinceViolation,
    UpperMismatch,
    make_updates,
    upload_part,
)
from headrace.store import CountingStore, LocalStore, open_store


@pytest.fixture(params=["local", "s3"])
def client(request, tmp_path):
    if request.param == "local":
        return PersistClient(LocalStore(tmp_path / "s"))
    return PersistClient(open_store(request.getfixturevalue("s3_url")))


def batch(ks, t, diffs=None):
    return make_updates({"k": ks}, [t] * len(ks), diffs)


def test_append_tells_a_replay_from_a_conflict(client):
    w = client.open_writer("s")
    assert w.append(batch(["a", "b"], 0), 0, 1)
    assert not w.append(batch(["b", "a"], 0), 0, 1)  # same updates, other order: a replay
    assert not w.append(make_updates({"k": ["a", "b", "b"]}, [0, 0, 0], [1, 2, -1]), 0, 1)
    with pytest.raises(DefinitenessViolation) as ei:
        w.append(batch(["a", "c"], 0), 0, 1)  # different data for time 0
    assert (ei.value.shard, ei.value.lower, ei.value.upper, ei.value.differing) == \
        ("s", 0, 1, 2)
    other = client.open_writer("s")  # a second writer (another instance of the pipeline)
    with pytest.raises(DefinitenessViolation):
        other.append(batch(["a"], 0), 0, 1)
    assert client.upper("s") == 1


def test_overlapping_append_checks_the_overlap_before_appending_the_rest(client):
    w = client.open_writer("s")
    w.append(make_updates({"k": ["a", "b"]}, [0, 1]), 0, 2)
    with pytest.raises(DefinitenessViolation):
        w.append(make_updates({"k": ["a", "X", "c"]}, [0, 1, 2]), 0, 3)
    assert client.upper("s") == 2  # nothing of the conflicting batch landed
    assert w.append(make_updates({"k": ["a", "b", "c"]}, [0, 1, 2]), 0, 3)  # agrees: trims
    snap = client.read_only("s").snapshot(2)
    assert sorted(snap.column("k").to_pylist()) == ["a", "b", "c"]


def test_compare_and_append_still_raises_upper_mismatch(client):
    w = client.open_writer("s")
    w.compare_and_append(batch(["a"], 0), 0, 1)
    with pytest.raises(UpperMismatch):  # the pipeline detects its own replays by this
        w.compare_and_append(batch(["other"], 0), 0, 1)
    w.verify_written(batch(["a"], 0), 0, 1)
    with pytest.raises(DefinitenessViolation):
        w.verify_written(batch(["other"], 0), 0, 1)


def test_append_parts_replay_and_conflict(client):
    """The split write: a replayed micro-batch's re-uploaded parts are compared, then deleted."""
    driver = client.open_writer("s")
    wid = driver.register()

    def upload(ks, t):
        return upload_part(client.store, "s", wid, pa.table({"k": ks, "diff": [1] * len(ks)}),
                           time=t)
    assert driver.append_parts([upload(["a"], 0), upload(["b"], 0)], 0, 1)
    same = [upload(["b", "a"], 0)]  # the replay split its rows differently
    assert not driver.append_parts(same, 0, 1)
    assert not client.store.exists(same[0].key)
    bad = [upload(["a", "z"], 0)]
    with pytest.raises(DefinitenessViolation):
        driver.append_parts(bad, 0, 1)
    assert driver.append_parts([], 1, 2) and client.upper("s") == 2  # an empty batch
    with pytest.raises(DefinitenessViolation):  # an empty replay of a batch that had rows
        driver.append_parts([], 0, 1)


def test_replay_of_the_last_batch_is_checked_after_compaction(tmp_path):
    """Compaction never merges the newest batch, so its replay can always be compared; a range
    whose times compaction blurred is refused (SinceViolation), never guessed."""
    client = PersistClient(LocalStore(tmp_path / "s"), auto_compact_at=None)
    w = client.open_writer("s")
    for t in range(10):
        w.append(batch([f"k{t}", "same"], t), t, t + 1)
    client.open_reader("s").downgrade_since(9)  # a caught-up reader: since = upper - 1
    client.compact("s", max_parts=2)
    assert [(p.lower, p.upper, p.floor) for p in client.state("s").parts] == \
        [(0, 9, 8), (9, 10, 0)]  # times 0..7 were advanced to 8; batch 9 is as written
    assert not w.append(batch(["same", "k9"], 9), 9, 10)  # the replay: verified, a no-op
    with pytest.raises(DefinitenessViolation):
        w.append(batch(["k9"], 9), 9, 10)
    with pytest.raises(SinceViolation):
        w.append(batch(["k3", "same"], 3), 3, 4)  # time 3 now reads as 8: not comparable
    client.compact("s", max_parts=1)  # only an explicit max_parts=1 merges the newest batch
    with pytest.raises(SinceViolation):
        w.append(batch(["same", "k9"], 9), 9, 10)


def test_replay_check_cost(tmp_path):
    """A replay of a one-part batch GETs that part once (plus the state); identical re-uploaded
    parts are recognised by size and CRC with no part GET at all."""
    counting = CountingStore(LocalStore(tmp_path / "s"))
    client = PersistClient(counting, auto_compact_at=None)
    w = client.open_writer("s")
    for t in range(5):
        w.append(batch([t, t + 100], t), t, t + 1)
    counting.reset()
    client.state("s")
    state_gets = counting.counts()["gets"]  # floor, hint, version
    counting.reset()
    assert not w.append(batch([4, 104], 4), 4, 5)
    assert counting.counts()["gets"] == state_gets + 1  # + the one part of batch 4
    wid = w.register()
    table = pa.table({"k": [3, 103], "diff": [1, 1]})
    p1 = upload_part(counting, "s", wid, table, time=5)
    assert w.append_parts([p1], 5, 6)
    p2 = upload_part(counting, "s", wid, table, time=5)
    counting.reset()
    assert not w.append_parts([p2], 5, 6)
    assert counting.counts()["gets"] == state_gets  # byte-identical: no part GET


def test_spark_sink_commit_replay_is_checked(tmp_path):
    """The shard sink's commit of a batch already written: same rows → no-op, other rows →
    DefinitenessViolation (old code: a silent no-op either way)."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from headrace.spark.shard_source import ShardStreamWriter

    url = str(tmp_path / "store")
    options = {"url": url, "shard": "out"}
    schema = StructType([StructField("k", StringType()), StructField("v", LongType())])

    def run_batch(batch_id: int, rows: list[tuple[str, int]]):
        writer = ShardStreamWriter(options, schema)
        task = ShardStreamWriter.__new__(ShardStreamWriter)
        task.__dict__.update(writer.__getstate__())  # what Spark ships to the tasks
        rb = pa.record_batch([pa.array([r[0] for r in rows]), pa.array([r[1] for r in rows])],
                             names=["k", "v"])
        messages = [task.write(iter([rb])), task.write(iter([]))]
        ShardStreamWriter(options, schema).commit(messages, batch_id)

    run_batch(0, [("a", 1), ("b", 2)])
    run_batch(1, [("c", 3)])
    run_batch(1, [("c", 3)])  # Spark replays batch 1 (its commit log entry was lost)
    with pytest.raises(DefinitenessViolation):
        run_batch(0, [("a", 1), ("b", 999)])
    client = PersistClient(url)
    assert client.upper("out") == 2
    snap = client.read_only("out").snapshot(1)
    assert sorted(snap.column("v").to_pylist()) == [1, 2, 3]
    assert len(client.state("out").writers) == 1  # every batch reused one sink writer


def test_append_parts_from_a_stale_cache_is_decided_by_its_cas(client):
    """The driver links from its cached shard state. Another process moving the shard in
    between is met by the link's CAS, each way: a replay of the batch (the CAS loses, the head
    is read, the contents compared: no-op or DefinitenessViolation) and a change that leaves
    the upper (the CAS loses once, then lands). A writer linking batch after batch reads no
    consensus object: one consensus PUT per batch."""
    store = CountingStore(client.store)
    a = PersistClient(store, auto_compact_at=None).open_writer("s")
    wa = a.register()
    b = PersistClient(client.store).open_writer("s")  # another process: its own cache
    wb = b.register()

    def up(wid, ks, t):
        return upload_part(client.store, "s", wid,
                           pa.table({"k": ks, "diff": [1] * len(ks)}), time=t)

    assert a.append_parts([up(wa, ["x"], 0)], 0, 1)  # a's cache: upper 1
    assert b.append_parts([up(wb, ["y"], 1)], 1, 2)  # behind a's back
    same = [up(wa, ["y"], 1)]
    assert not a.append_parts(same, 1, 2)  # a replay: compared, its part deleted
    assert not client.store.exists(same[0].key)
    with pytest.raises(DefinitenessViolation):
        a.append_parts([up(wa, ["z"], 1)], 1, 2)
    PersistClient(client.store).open_writer("s").register()  # a CAS that leaves the upper
    assert a.append_parts([up(wa, ["w"], 2)], 2, 3)
    store.reset()
    for t in range(3, 8):
        assert a.append_parts([up(wa, [f"k{t}"], t)], t, t + 1)
    counts = store.counts()
    assert counts.get("gets", 0) == 0, counts  # neither head nor floor read
    assert counts.get("puts", 0) <= 5 + 1, counts  # one consensus PUT a batch (+ a hint)
    assert PersistClient(client.store).upper("s") == 8
    rows = PersistClient(client.store).open_reader("s").snapshot(7)
    assert sorted(rows["k"].to_pylist()) == ["k3", "k4", "k5", "k6", "k7", "w", "x", "y"]
