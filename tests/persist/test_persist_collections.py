"""Collections with renditions and handover; reclocking; the recipe's resume point."""

from __future__ import annotations

from collections import Counter

import pytest

from headrace.errors import InvalidInput
from headrace.persist import InvalidBounds, PersistClient, UpperMismatch, make_updates
from headrace.persist.collection import Collection
from headrace.persist.reclock import RemapShard, resume_point
from headrace.store import LocalStore


@pytest.fixture
def client(tmp_path):
    return PersistClient(LocalStore(tmp_path / "s"))


def write(client, shard, rows, lo, hi):
    client.open_writer(shard).compare_and_append(
        make_updates({"k": [r[0] for r in rows]}, [r[1] for r in rows], [r[2] for r in rows]),
        lo, hi)


def contents_at(client, shard, t) -> Counter:
    snap = client.read_only(shard).snapshot(t)
    return Counter(dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(),
                            strict=True)))


def test_reader_crossing_a_handover_never_sees_a_mixture(client):
    coll = Collection.create(client, "orders", "r1")
    r1, r2 = coll.rendition("r1"), coll.rendition("r2", shards=2)
    write(client, r1.shard_names[0], [("a", 0, 1), ("b", 1, 1), ("a", 3, -1), ("c", 4, 1)], 0, 6)
    # rendition 2 is a different (fixed) computation of the same collection, in two shards
    write(client, r2.shard_names[0], [("A", 0, 1), ("B", 2, 1)], 0, 6)
    write(client, r2.shard_names[1], [("C", 3, 1), ("D", 5, 1)], 0, 6)
    coll.advance(2)
    # what each rendition holds at every time, read before the reader's since moves past it
    r1_at = {t: contents_at(client, r1.shard_names[0], t) for t in range(6)}
    r2_at = {t: contents_at(client, r2.shard_names[0], t) + contents_at(client, r2.shard_names[1],
                                                                        t) for t in range(6)}
    reader = coll.reader(0)
    acc: Counter = Counter()
    seen: dict[int, Counter] = {}

    def drain():
        for table in reader.poll():
            times = table.column("time").to_pylist()
            assert times == sorted(times)
            for k, t, d in zip(table.column("k").to_pylist(), times,
                               table.column("diff").to_pylist(), strict=True):
                acc[k] += d
                seen[t] = Counter({x: v for x, v in acc.items() if v})

    drain()
    with pytest.raises(InvalidBounds):
        coll.handover(r2, 1)  # below the meta upper: already declared unchanged
    coll.handover(r2, 4)
    coll.advance(6)
    drain()
    for t, contents in seen.items():
        assert contents == (r1_at if t < 4 else r2_at)[t], t
    assert 4 in seen and set(seen[4]) == {"A", "B", "C"}
    assert coll.active(5) == r2  # (times below the meta since are no longer readable)
    # the reader's meta since passed t_handover: rendition 1 is unreachable and collected
    assert coll.gc() == r1.shard_names
    assert r1.shard_names[0] not in client.list_shards()
    reader.close()


def test_create_is_idempotent(client):
    Collection.create(client, "c", "r1")
    Collection.create(client, "c", "r1")
    with pytest.raises(InvalidInput):
        Collection.create(client, "c", "other")


def test_reclock_binds_monotonic_addresses(client):
    remap = RemapShard(client, "remap")
    assert remap.reclock({"q": 10}) == 0
    assert remap.reclock({"q": 25, "p": 3}, time=5) == 5
    assert remap.addresses_at(0) == {"q": 10}
    assert remap.addresses_at(4) == {"q": 10}
    assert remap.addresses_at(5) == {"q": 25, "p": 3}
    assert remap.time_for("q", 12) == 5 and remap.time_for("q", 5) == 0
    assert remap.time_for("q", 99) is None
    with pytest.raises(InvalidInput):
        remap.reclock({"q": 20})  # backwards
    with pytest.raises(InvalidBounds):
        remap.addresses_at(6)  # not bound yet
    other = RemapShard(PersistClient(client.store), "remap")
    remap.reclock({"q": 30})
    with pytest.raises(UpperMismatch):
        other.writer.compare_and_append(make_updates({"source": ["q"], "address": [31]}, [6]),
                                        6, 7)  # a contender loses; it must read back
    assert other.addresses_at(6) == {"q": 30, "p": 3}


def test_resume_point_is_min_upper_with_bound_addresses(client):
    remap = RemapShard(client, "remap")
    for t, addr in enumerate([5, 9, 14, 20]):
        remap.reclock({"q": addr}, time=t)
    write(client, "out", [("x", 0, 1), ("y", 2, 1)], 0, 3)
    write(client, "state", [("s", 0, 1)], 0, 2)
    rp = resume_point(client, ["out"], ["state"], remap)
    assert rp.time == 2 and rp.addresses == {"q": 9}
    assert rp.uppers == {"out": 3, "state": 2}
    empty = resume_point(client, ["fresh"], [], remap)
    assert empty.time == 0 and empty.addresses == {}
