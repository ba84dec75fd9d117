"""Issue 15 item 3: the sweep against in-flight writers, and verified links.

A part is never deleted while a live (registered, unexpired) writer may link it; a writer whose
lease was dropped cannot link; linking checks that every part exists with its size. Interleavings
are forced with HookStore callbacks at exact store calls, and lease expiry with clocks.
"""

from __future__ import annotations

import pickle
import time

import pyarrow as pa
import pytest
from persist_hooks import HookStore, is_part

from headrace.codec import ManualClock
from headrace.errors import FormatError, InvalidInput, NotFound
from headrace.persist import LeaseExpired, PersistClient, make_updates, upload_part
from headrace.store import CountingStore, LocalStore, open_store

HOUR_MS = 3_600_000


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "s")
    return open_store(request.getfixturevalue("s3_url"))


def later(store, seconds: float) -> PersistClient:
    """A second process whose clock reads ``seconds`` after now (the sweeper)."""
    return PersistClient(store, clock=ManualClock(int((time.time() + seconds) * 1000)))


def keys(table: pa.Table) -> list:
    return sorted(table.column("k").to_pylist())


def test_sweep_spares_a_slow_writers_part_while_its_lease_runs(store):
    """Old code: the sweep deleted the uploaded, not yet linked part once older than the grace,
    the CAS linked it anyway, and the shard was unreadable (NotFound)."""
    hooked = HookStore(store)
    writer = PersistClient(hooked).open_writer("s")
    writer.compare_and_append(make_updates({"k": [0]}, [0]), 0, 1)
    swept = []
    # the writer stalls between its part upload and its CAS for 700 s (grace 600, lease 900)
    hooked.when("put", is_part, lambda: swept.append(later(store, 700).sweep(grace_s=600)))
    writer.compare_and_append(make_updates({"k": [1, 2]}, [1, 1]), 1, 2)
    assert swept and swept[0].parts_deleted == 0
    assert keys(PersistClient(store).read_only("s").snapshot(1)) == [0, 1, 2]


def test_a_writer_whose_lease_was_dropped_cannot_link_and_retries_under_a_new_id(store):
    """Stalled past its lease: the sweep drops the writer and deletes the part; the link CAS then
    refuses (the writer is gone), and compare_and_append re-uploads under a fresh writer id."""
    hooked = HookStore(store)
    writer = PersistClient(hooked).open_writer("s")
    writer.compare_and_append(make_updates({"k": [0]}, [0]), 0, 1)
    first_id = writer.writer_id
    swept = []
    hooked.when("put", is_part, lambda: swept.append(later(store, 7200).sweep(grace_s=600)))
    writer.compare_and_append(make_updates({"k": [1]}, [1]), 1, 2)
    assert swept[0].parts_deleted == 1  # the stalled upload was collected ...
    assert writer.writer_id != first_id  # ... and the append went through under a new id
    client = PersistClient(store)
    assert keys(client.read_only("s").snapshot(1)) == [0, 1]
    stored = {m.key for m in store.list("persist/shards/s/parts/")}
    assert {p.key for p in client.state("s").parts} <= stored  # nothing linked is missing


def test_attached_writer_gone_gets_lease_expired_and_links_nothing(store):
    """A Spark driver's writer (attached by id) whose lease ran out: LeaseExpired, no link."""
    driver = PersistClient(store)
    wid = driver.register_writer("s", lease_s=60).writer_id
    part = upload_part(store, "s", wid, make_updates({"k": [1]}, [0]))
    assert later(store, 120).sweep(grace_s=0).parts_deleted == 1  # expired: dropped, collected
    with pytest.raises(LeaseExpired):
        driver.open_writer("s", wid).link_parts([part], 0, 1)
    assert driver.upper("s") == 0


def test_link_verifies_parts_exist_with_their_size(store):
    """Old code linked whatever PartMetas it was given: a lost part made the shard unreadable."""
    client = PersistClient(store)
    writer = client.register_writer("s")
    parts = [upload_part(store, "s", writer.writer_id, make_updates({"k": [i]}, [0]))
             for i in range(3)]
    store.delete(parts[1].key)
    with pytest.raises(NotFound) as ei:
        writer.link_parts(parts, 0, 1)
    assert ei.value.key == parts[1].key
    from dataclasses import replace
    with pytest.raises(FormatError) as fe:
        writer.link_parts([replace(parts[0], size=parts[0].size + 1)], 0, 1)
    assert fe.value.key == parts[0].key
    assert client.upper("s") == 0  # nothing was linked
    writer.link_parts([parts[0], parts[2]], 0, 1)
    assert keys(client.read_only("s").snapshot(0)) == [0, 2]


def test_link_refuses_parts_of_another_writer_or_shard(tmp_path):
    store = LocalStore(tmp_path / "s")
    client = PersistClient(store)
    mine = client.register_writer("s")
    other = client.register_writer("s")
    theirs = upload_part(store, "s", other.writer_id, make_updates({"k": [1]}, [0]))
    elsewhere = upload_part(store, "t", mine.writer_id, make_updates({"k": [1]}, [0]))
    for part in (theirs, elsewhere):
        with pytest.raises(InvalidInput):
            mine.link_parts([part], 0, 1)
    with pytest.raises(InvalidInput):
        upload_part(store, "s", "../escape", make_updates({"k": [1]}, [0]))


def test_split_write_costs(tmp_path):
    """Tasks upload (no consensus), the driver links once per batch. Verifying costs 1 HEAD per
    part up to 8, else one LIST; a steady writer registers once and never heartbeats apart."""
    from headrace.persist.uploads import parts_prefix, verify_parts

    counting = CountingStore(LocalStore(tmp_path / "s"))
    driver = PersistClient(counting, auto_compact_at=None)
    writer = driver.open_writer("s")
    wid = writer.register()
    for t, n in enumerate((3, 20)):
        metas = [upload_part(counting, "s", wid, make_updates({"k": [i]}, [t])) for i in range(n)]
        metas = pickle.loads(pickle.dumps(metas))  # what crosses from the tasks to the driver
        counting.reset()
        verify_parts(counting, metas, parts_prefix(driver.root, "s", wid))
        counts = counting.counts()
        assert (counts["heads"], counts["lists"]) == ((3, 0) if n <= 8 else (0, 1))
        writer.link_parts(metas, t, t + 1)
    snap = driver.read_only("s").snapshot(1)
    assert dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(),
                    strict=True)) == {i: 2 if i < 3 else 1 for i in range(20)}
    cas_before = driver.metrics()["state_cas_ok"]
    for t in range(2, 12):
        writer.compare_and_append(make_updates({"k": [t]}, [t]), t, t + 1)
    assert driver.metrics()["state_cas_ok"] - cas_before == 10  # one CAS per append, no more


def test_close_releases_the_writer_and_the_sweep_then_collects_its_orphans(tmp_path):
    store = LocalStore(tmp_path / "s")
    client = PersistClient(store)
    w = client.open_writer("s")
    w.compare_and_append(make_updates({"k": [0]}, [0]), 0, 1)
    orphan = upload_part(store, "s", w.writer_id, make_updates({"k": [9]}, [1]))
    assert client.sweep(grace_s=0).parts_deleted == 0  # live writer: maybe still linking it
    client.close()
    assert client.state("s").writers == ()
    assert PersistClient(store).sweep(grace_s=0).parts_deleted == 1
    assert not store.exists(orphan.key)


def test_verify_survives_compaction_but_not_a_lost_part(tmp_path):
    """``client.verify`` (what ``headrace shard verify`` needs): a part compacted and deleted
    under it is skipped by re-reading the state; a referenced part that is gone is NotFound."""
    store = LocalStore(tmp_path / "s")
    client = PersistClient(store, auto_compact_at=None)
    w = client.open_writer("s")
    for t in range(6):
        w.compare_and_append(make_updates({"k": [t]}, [t]), t, t + 1)
    hooked = HookStore(store)
    hooked.when("get", is_part, lambda: PersistClient(store).compact("s", max_parts=2))
    checked = PersistClient(hooked).verify("s")
    assert hooked.fired and len(checked.parts) == 2
    store.delete(checked.parts[0].key)
    with pytest.raises(NotFound) as ei:
        client.verify("s")
    assert ei.value.key == checked.parts[0].key


def test_compaction_whose_input_a_concurrent_compaction_deleted_gives_up_quietly(tmp_path):
    """Three writers compacting one shard (torture's faulty persist race): one compaction read
    parts another had just replaced and deleted, and its NotFound came out of client.close()."""
    store = LocalStore(tmp_path / "s")
    client = PersistClient(store, auto_compact_at=None)
    w = client.open_writer("s")
    for t in range(6):
        w.compare_and_append(make_updates({"k": [t]}, [t]), t, t + 1)
    hooked = HookStore(store)
    hooked.when("get", is_part, lambda: PersistClient(store).compact("s", max_parts=2))
    late = PersistClient(hooked)
    result = late.compact("s", max_parts=2)
    assert hooked.fired and not result.applied
    assert len(client.state("s").parts) == 2
    assert keys(client.read_only("s").snapshot(5, timeout_s=0)) == list(range(6))
    # a part still linked but missing is lost, not compacted: that one is raised
    parts = client.state("s").parts
    for t in range(6, 9):
        w.compare_and_append(make_updates({"k": [t]}, [t]), t, t + 1)
    store.delete(parts[0].key)
    with pytest.raises(NotFound) as ei:
        late.compact("s", max_parts=2)
    assert ei.value.key == parts[0].key
