"""Shard semantics on the local store and on S3 (moto): appends, bounds, readers, listen."""

from __future__ import annotations

import pyarrow as pa
import pytest

from headrace.codec import ManualClock
from headrace.errors import InvalidInput
from headrace.persist import (
    InvalidBounds,
    LeaseExpired,
    PersistClient,
    SinceViolation,
    SnapshotTimeout,
    TokenMismatch,
    UpperMismatch,
    make_updates,
)
from headrace.store import LocalStore, open_store


@pytest.fixture(params=["local", "s3"])
def client(request, tmp_path):
    if request.param == "local":
        return PersistClient(LocalStore(tmp_path / "s"))
    return PersistClient(open_store(request.getfixturevalue("s3_url")))


def rows(snapshot: pa.Table) -> set:
    return {tuple(r.values()) for r in snapshot.to_pylist()}


def test_empty_shard(client):
    assert client.upper("s") == 0 and client.since("s") == 0
    with pytest.raises(SnapshotTimeout):
        client.read_only("s").snapshot(0, timeout_s=0.05)


def test_compare_and_append_and_snapshot(client):
    w = client.open_writer("s")
    w.compare_and_append(make_updates({"k": ["a", "b", "a"]}, [0, 1, 2], [1, 1, 1]), 0, 3)
    w.compare_and_append(make_updates({"k": ["a", "c"]}, [3, 4], [-2, 5]), 3, 10)
    r = client.read_only("s")
    assert rows(r.snapshot(0)) == {("a", 1)}
    assert rows(r.snapshot(2)) == {("a", 2), ("b", 1)}
    assert rows(r.snapshot(4)) == {("b", 1), ("c", 5)}
    assert client.upper("s") == 10
    with pytest.raises(UpperMismatch) as ei:
        w.compare_and_append(make_updates({"k": ["x"]}, [5]), 3, 11)
    assert (ei.value.expected, ei.value.current) == (3, 10)
    assert rows(r.snapshot(9)) == {("b", 1), ("c", 5)}  # the loser changed nothing


def test_bounds_errors_are_not_mismatches(client):
    w = client.open_writer("s")
    for updates, lo, hi in [(make_updates({"k": ["a"]}, [5]), 0, 5),
                            (make_updates({"k": ["a"]}, [0]), 1, 5),
                            (make_updates({"k": []}, []), 5, 5),
                            (make_updates({"k": []}, []), 5, 2)]:
        with pytest.raises(InvalidBounds):
            w.compare_and_append(updates, lo, hi)
    with pytest.raises(InvalidInput):
        w.compare_and_append(pa.table({"k": ["a"], "time": [0]}), 0, 1)
    assert client.upper("s") == 0


def test_schema_is_fixed_by_first_write(client):
    w = client.open_writer("s")
    w.compare_and_append(make_updates({"k": ["a"]}, [0]), 0, 1)
    with pytest.raises(InvalidInput):
        w.compare_and_append(make_updates({"k": [1]}, [1]), 1, 2)
    assert client.schema("s") == pa.schema([("k", pa.string())])


def test_append_is_idempotent_and_trims(client):
    w = client.open_writer("s")
    batch = make_updates({"k": ["a", "b"]}, [0, 1])
    assert w.append(batch, 0, 2)
    assert not w.append(batch, 0, 2)  # a retry after success: no-op
    assert w.append(make_updates({"k": ["b", "c"]}, [1, 2]), 1, 3)  # overlaps: trimmed to 2
    assert rows(client.read_only("s").snapshot(2)) == {("a", 1), ("b", 1), ("c", 1)}
    with pytest.raises(UpperMismatch):
        w.append(make_updates({"k": ["z"]}, [7]), 7, 8)  # would leave a gap


def test_finish_makes_upper_empty(client):
    w = client.open_writer("s")
    w.compare_and_append(make_updates({"k": ["a"]}, [0]), 0, 1)
    w.compare_and_append(make_updates({"k": ["b"]}, [1]), 1, None)
    assert client.upper("s") is None
    assert rows(client.read_only("s").snapshot(100)) == {("a", 1), ("b", 1)}
    with pytest.raises(UpperMismatch) as ei:
        w.compare_and_append(make_updates({"k": ["c"]}, [2]), 2, 3)
    assert ei.value.current is None


def test_leased_readers_hold_since_and_expire():
    clock = ManualClock()
    client = PersistClient("memory://lease-test", clock=clock)
    w = client.open_writer("s")
    w.compare_and_append(make_updates({"k": ["a"]}, [0]), 0, 10)
    r1 = client.open_reader("s", lease_s=10)
    r2 = client.open_reader("s", lease_s=100)
    r1.downgrade_since(5)
    assert client.since("s") == 0  # r2 still at 0
    r2.downgrade_since(3)
    assert client.since("s") == 3
    with pytest.raises(SinceViolation):
        r2.snapshot(2)
    clock.advance(50)  # r1's lease runs out; the next state change drops it
    r2.downgrade_since(8)
    assert [x.reader_id for x in client.state("s").leased] == [r2.reader_id]
    assert client.since("s") == 8
    with pytest.raises(LeaseExpired):
        r1.downgrade_since(9)


def test_critical_reader_token(client):
    client.open_writer("s").compare_and_append(make_updates({"k": ["a"]}, [0]), 0, 10)
    c = client.open_reader("s", "ckpt")
    c.compare_and_downgrade_since("", "t1", 4)
    with pytest.raises(TokenMismatch):
        c.compare_and_downgrade_since("", "t2", 6)
    c.compare_and_downgrade_since("t1", "t2", 6)
    again = client.open_reader("s", "ckpt")  # reopening keeps its since
    assert again.since() == 6 and client.since("s") == 6


def test_listen_yields_in_time_order_with_progress(client):
    w = client.open_writer("s")
    w.compare_and_append(make_updates({"k": ["a"]}, [0]), 0, 1)
    r = client.open_reader("s")
    events = r.listen(0, poll_s=0.01, timeout_s=0.3)
    w.compare_and_append(make_updates({"k": ["c", "b"]}, [3, 1]), 1, 4)
    first = next(events)
    assert first.progress == 4
    assert first.updates.column("time").to_pylist() == [1, 3]
    w.compare_and_append(make_updates({"k": ["d"]}, [5]), 4, None)
    second = next(events)
    assert second.progress is None and second.updates.column("k").to_pylist() == ["d"]
    assert list(events) == []
    assert client.since("s") >= 3  # listening downgraded the reader's since


def test_compaction_bounds_parts_and_preserves_snapshots(client):
    w = client.open_writer("s")
    expect = {}
    for t in range(12):
        w.compare_and_append(make_updates({"k": ["a", f"x{t % 3}"]}, [t, t], [1, 1]), t, t + 1)
        expect[t] = rows(client.read_only("s").snapshot(t))
    reader = client.open_reader("s")
    reader.downgrade_since(6)
    res = client.compact("s", max_parts=3)
    assert res.applied and len(client.state("s").parts) == 3
    for t in range(6, 12):
        assert rows(client.read_only("s").snapshot(t)) == expect[t]
    # the compactor deleted its inputs: what is stored is what the state references
    listed = {m.key for m in client.store.list("persist/shards/s/parts/")}
    assert listed == {p.key for p in client.state("s").parts}
    assert client.sweep(grace_s=0).parts_deleted == 0
    for t in range(6, 12):
        assert rows(client.read_only("s").snapshot(t)) == expect[t]


def test_background_compaction_past_the_threshold():
    client = PersistClient("memory://auto-compact", auto_compact_at=5, compact_to=2)
    w = client.open_writer("s")
    for t in range(20):
        w.compare_and_append(make_updates({"k": [t % 3]}, [t]), t, t + 1)
        if t % 4 == 3:
            client.wait_for_compactions()
            assert len(client.state("s").parts) <= 5
    client.close()
    assert client.metrics()["compactions"] >= 3
    snap = client.read_only("s").snapshot(19)
    assert dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(),
                    strict=True)) == {0: 7, 1: 7, 2: 6}


def test_transient_errors_and_lost_replies_lose_and_duplicate_nothing(tmp_path):
    from headrace.store import FaultyStore

    faulty = FaultyStore(LocalStore(tmp_path / "s"), seed=3)
    client = PersistClient(faulty)
    w = client.open_writer("s")
    faulty.set_faults(fail_rate=0.15, lost_reply_rate=0.25, verbs={"put", "get", "head"})
    for t in range(25):
        w.append(make_updates({"k": [t]}, [t]), t, t + 1)
    faulty.clear()
    assert faulty.injected["fail"] > 5 and faulty.injected["lost_reply"] > 5
    assert client.upper("s") == 25
    snap = client.read_only("s").snapshot(24)
    assert sorted(snap.column("k").to_pylist()) == list(range(25))
    assert set(snap.column("diff").to_pylist()) == {1}
