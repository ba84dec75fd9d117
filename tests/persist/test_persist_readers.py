"""Issue 15 item 4: every reader holds a since-capability while it reads; a read that can no
longer be served raises SinceViolation, never wrong data.

The race "a read-only snapshot meets compaction + sweep" is forced at the exact store call (the
GET of the first part), with HookStore; lease expiry with a ManualClock.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from persist_hooks import HookStore, is_part

from headrace.codec import ManualClock
from headrace.errors import InvalidInput
from headrace.persist import (
    InvalidBounds,
    LeaseExpired,
    PersistClient,
    SinceViolation,
    make_updates,
)
from headrace.persist.collection import Collection
from headrace.store import LocalStore, open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "s")
    return open_store(request.getfixturevalue("s3_url"))


def contents(snap: pa.Table) -> Counter:
    return Counter(dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(),
                            strict=True)))


def fill(client: PersistClient, shard: str = "s", n: int = 10) -> None:
    """Time t adds k=t and retracts k=t-1: the contents at t are exactly {t: 1}."""
    w = client.open_writer(shard)
    for t in range(n):
        ks, ds = ([t], [1]) if t == 0 else ([t, t - 1], [1, -1])
        w.compare_and_append(make_updates({"k": ks}, [t] * len(ks), ds), t, t + 1)


def compact_and_sweep_at_since(store, since: int, seen: list):
    """Another process: a reader promises since, compaction merges everything, sweep runs."""
    def run():
        other = PersistClient(store)
        other.open_reader("s").downgrade_since(since)
        seen.append(other.since("s"))
        other.compact("s", max_parts=1)
        other.sweep(grace_s=0)
    return run


def test_read_only_snapshot_racing_compaction_and_sweep_is_correct(store):
    """Old code: the read-only snapshot held nothing; since moved past as_of, compaction advanced
    times to 8, the sweep deleted the parts, and the re-read returned an empty table."""
    client = PersistClient(store)
    fill(client)
    hooked = HookStore(store)
    seen: list = []
    hooked.when("get", is_part, compact_and_sweep_at_since(store, 8, seen))
    snap = PersistClient(hooked).read_only("s").snapshot(3)
    assert hooked.fired, "the race did not happen"
    assert contents(snap) == Counter({3: 1})
    assert seen[0] <= 3  # the read's one-shot lease held since while it read ...
    assert client.since("s") == 8 and len(client.state("s").leased) == 1  # ... and let go


def test_reader_that_lost_its_lease_mid_read_raises_since_violation(tmp_path):
    """The capability runs out during the read (a stalled process): never wrong data."""
    store = LocalStore(tmp_path / "s")
    clock = ManualClock()
    client = PersistClient(store, clock=clock)
    fill(client)
    hooked = HookStore(store)
    reader = PersistClient(hooked, clock=clock).open_reader("s", lease_s=60)

    def stall_then_race():
        clock.advance(120)  # our lease ran out; the next state change drops it
        other = PersistClient(store, clock=clock)
        other.open_reader("s").downgrade_since(8)
        other.compact("s", max_parts=1)
        other.sweep(grace_s=0)
    hooked.when("get", is_part, stall_then_race)
    with pytest.raises(SinceViolation) as ei:
        reader.snapshot(3)
    assert (ei.value.as_of, ei.value.since) == (3, 8)
    with pytest.raises(LeaseExpired):
        reader.downgrade_since(4)


def test_updates_from_since_itself_are_refused(tmp_path):
    """Old code allowed lower == since: compaction advances older times *to* since, so updates
    from before lower were returned as if written at lower."""
    client = PersistClient(LocalStore(tmp_path / "s"))
    fill(client)
    client.open_reader("s").downgrade_since(3)
    client.compact("s", max_parts=1)
    reader = client.read_only("s")
    with pytest.raises(SinceViolation):
        reader.updates_between(3, 6)
    ups = reader.updates_between(4, 6)  # since < lower: exact
    assert sorted(zip(ups.column("k").to_pylist(), ups.column("time").to_pylist(),
                      ups.column("diff").to_pylist(), strict=True)) == \
        [(3, 4, -1), (4, 4, 1), (4, 5, -1), (5, 5, 1)]


def test_one_shot_reads_do_not_move_since(tmp_path):
    client = PersistClient(LocalStore(tmp_path / "s"))
    fill(client)
    assert contents(client.read_only("s").snapshot(7)) == Counter({7: 1})
    assert contents(client.read_only("s").snapshot(2)) == Counter({2: 1})  # still readable
    state = client.state("s")
    assert state.since == 0 and state.leased == ()


def test_resume_reader_keeps_its_place_or_refuses(tmp_path):
    """A restarted stream takes its reader up again; after its lease ran out it re-registers
    only if since has not passed what it still needs."""
    clock = ManualClock()
    client = PersistClient(LocalStore(tmp_path / "s"), clock=clock)
    fill(client)
    r = client.open_reader("s", lease_s=60)
    r.downgrade_since(2)
    other = client.open_reader("s", lease_s=10_000)
    other.downgrade_since(6)
    assert client.since("s") == 2  # r holds it
    again = client.resume_reader("s", r.reader_id, since=2, lease_s=60)  # still registered
    assert again.reader_id == r.reader_id and client.since("s") == 2
    clock.advance(120)
    client.open_reader("s").expire()  # any state change drops the expired lease
    assert client.since("s") == 6
    with pytest.raises(SinceViolation):
        client.resume_reader("s", r.reader_id, since=2, lease_s=60)
    back = client.resume_reader("s", r.reader_id, since=6, lease_s=60)
    assert back.reader_id == r.reader_id and back.since() == 6
    with pytest.raises(InvalidInput):
        client.resume_reader("s", "../x", since=0)


def test_collection_reader_holds_its_rendition_shards(tmp_path):
    """Old code read the rendition shards without registering: another reader advancing their
    since (and compaction) broke the collection reader's next poll."""
    client = PersistClient(LocalStore(tmp_path / "s"))
    coll = Collection.create(client, "c", "r1")
    shard = coll.rendition("r1").shard_names[0]
    fill(client, shard, 4)
    coll.advance(4)
    reader = coll.reader(0)
    first = reader.poll()
    w = client.open_writer(shard)
    for t in range(4, 8):
        w.compare_and_append(make_updates({"k": [t, t - 1]}, [t, t], [1, -1]), t, t + 1)
    coll.advance(8)
    client.open_reader(shard).downgrade_since(7)  # another reader is done up to 7
    client.compact(shard, max_parts=1)
    acc: Counter = Counter()
    for table in first + reader.poll():
        for k, d in zip(table.column("k").to_pylist(), table.column("diff").to_pylist(),
                        strict=True):
            acc[k] += d
    assert +acc == Counter({7: 1})
    assert client.since(shard) == 7  # the reader has downgraded to its frontier
    reader.close()
    assert all(r.since >= 7 for r in client.state(shard).leased)


def test_bad_times_are_typed_errors(tmp_path):
    client = PersistClient(LocalStore(tmp_path / "s"))
    fill(client, n=2)
    reader = client.read_only("s")
    for call in (lambda: reader.snapshot("1"), lambda: reader.snapshot(-1),
                 lambda: reader.updates_between(0.5, 2), lambda: reader.updates_between(0, "x"),
                 lambda: next(reader.listen(None)), lambda: client.open_reader("s", as_of="0")):
        with pytest.raises((InvalidBounds, InvalidInput)):
            call()


def test_lease_free_read_writes_nothing_and_reads_right(store):
    """``read_only(shard, lease=False)``: what tools that must not write (the CLI) read with.
    The leased one-shot read puts two state versions; this one puts none."""
    from headrace.store import CountingStore

    fill(PersistClient(store))
    counted = CountingStore(store)
    client = PersistClient(counted)
    reader = client.read_only("s", lease=False)
    assert contents(reader.snapshot(3)) == Counter({3: 1})
    ups = reader.updates_between(4, 6)
    assert sorted(ups.column("k").to_pylist()) == [3, 4, 4, 5]
    assert counted.counts()["puts"] == 0 and counted.counts()["deletes"] == 0
    client.read_only("s").snapshot(3)
    assert counted.counts()["puts"] == 2  # the leased read, for comparison
    with pytest.raises(InvalidInput, match="lease"):
        client.read_only("s", lease="no")


def test_lease_free_read_racing_compaction_and_sweep_raises_since_violation(store):
    """Holding nothing, the read cannot stop compaction: it must notice (since re-checked after
    the parts were read) and fail, never return the compacted contents."""
    fill(PersistClient(store))
    hooked = HookStore(store)
    seen: list = []
    hooked.when("get", is_part, compact_and_sweep_at_since(store, 8, seen))
    reader = PersistClient(hooked).read_only("s", lease=False)
    with pytest.raises(SinceViolation) as ei:
        reader.snapshot(3)
    assert hooked.fired, "the race did not happen"
    assert (ei.value.as_of, ei.value.since) == (3, 8) and seen == [8]
    with pytest.raises(SinceViolation):  # and a new read at 3 is refused up front
        reader.snapshot(3)
    assert contents(reader.snapshot(8)) == Counter({8: 1})
