"""Failure injection at every stage of the commit lifecycle, then restart, restore and sweep."""

from __future__ import annotations

import os

import pytest
from backup_testlib import read_tree, sample_tree, write_tree

from headrace.backup import BackupConfig, BackupManager, RestoreManager
from headrace.codec import ManualClock
from headrace.errors import FormatError, HeadraceError
from headrace.retry import RetryPolicy
from headrace.store import FaultyStore, LocalStore, open_store

HOUR_MS = 3_600_000


def config(clock: ManualClock) -> BackupConfig:
    fast = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0, clock=clock)
    return BackupConfig(chunk_size=8192, upload_workers=3, download_workers=3, ttl_ms=HOUR_MS,
                        retry=fast)


def mutate(src) -> None:
    os.unlink(src / "000002.sst")
    (src / "000004.sst").write_bytes(b"4" * 20_000)
    (src / "MANIFEST-000001").write_bytes(b"new manifest")
    (src / "sub" / "deep" / "deeper" / "b.batch").unlink()


def all_keys(store, folder: str) -> set[str]:
    return {m.key.rsplit("/", 1)[1] for m in store.list(f"backup/{folder}/")}


# stage -> (fault plan for set_faults, does the caller get to record the new index?)
STAGES = {
    "upload": dict(fail_rate=1.0, verbs={"put"}, keys=lambda k: "/blobs/" in k),
    "upload-partial": dict(fail_calls=range(2, 1000), verbs={"put"},
                           keys=lambda k: "/blobs/" in k),
    "index-write": dict(fail_rate=1.0, verbs={"put"}, keys=lambda k: "/index/" in k),
    "cleanup-remove-ttl": dict(fail_rate=1.0, verbs={"put"}, keys=lambda k: "/permanent/" in k),
    "cleanup-delete": dict(fail_rate=1.0, verbs={"delete", "delete_many"}),
}


@pytest.mark.parametrize("stage", [*STAGES, "not-recorded"])
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_fault_at_each_stage_then_restart(stage, backend, tmp_path, request):
    if backend == "local":
        inner = LocalStore(tmp_path / "store")
    else:
        inner = open_store(request.getfixturevalue("s3_url"))
    clock = ManualClock()
    cfg = config(clock)
    store = FaultyStore(inner, seed=1)
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    recorded = {}  # the caller's durable checkpoint record

    bm = BackupManager(store, config=cfg, clock=clock)
    recorded["index"] = bm.upload(src, "c1")
    bm.cleanup(recorded["index"])
    tree1 = read_tree(src)

    mutate(src)
    tree2 = read_tree(src)
    clock.advance(60)
    if stage == "not-recorded":  # upload succeeded, the process died before recording
        bm.upload(src, "c2")
    else:
        store.set_faults(**STAGES[stage])
        with pytest.raises(HeadraceError):
            new = bm.upload(src, "c2")
            recorded["index"] = new  # the caller records, then cleans up
            bm.cleanup(new)
    bm.close()
    store.clear()
    expected = tree2 if stage.startswith("cleanup") else tree1

    # restart: a new process starts from what was recorded
    bm2 = BackupManager(store, config=cfg, clock=clock,
                        previous_index_blob_id=recorded["index"])
    with RestoreManager(store, config=cfg, clock=clock) as rm:
        rm.restore(recorded["index"], tmp_path / "restored")
    assert read_tree(tmp_path / "restored") == expected

    # before the TTL passes, the sweep keeps the young garbage (it may be an upload in flight)
    bm2.sweep()
    clock.advance(2 * HOUR_MS / 1000)
    report = bm2.sweep()
    committed = bm2.blobs.get_index(recorded["index"])
    assert all_keys(inner, "blobs") == committed.dir_index.present_blob_ids()
    assert all_keys(inner, "index") == {recorded["index"]}
    assert all_keys(inner, "permanent") == {recorded["index"]}
    assert report.blobs_young == 0
    # and the committed snapshot still restores on a new host
    with RestoreManager(store, config=cfg, clock=clock) as rm:
        rm.restore(recorded["index"], tmp_path / "host2")
    assert read_tree(tmp_path / "host2") == expected

    # the next commit after restart diffs against the recorded snapshot
    (src / "late.sst").write_bytes(b"late")
    third = bm2.upload(src, "c3")
    bm2.cleanup(third)
    assert bm2.metrics()["files_retained"] > 0
    bm2.close()


def test_transient_faults_and_lost_replies_are_retried(tmp_path):
    clock = ManualClock()
    cfg = BackupConfig(chunk_size=8192, retry=RetryPolicy(max_attempts=30, base_delay_s=0.0,
                                                          max_delay_s=0.0, clock=clock))
    store = FaultyStore(LocalStore(tmp_path / "store"), seed=7, fail_rate=0.2,
                        lost_reply_rate=0.2)
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=cfg, clock=clock) as bm:
        index_id = bm.upload(src, "c1")
        bm.cleanup(index_id)
    with RestoreManager(store, config=cfg, clock=clock) as rm:
        rm.restore(index_id, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == sample_tree()
    assert store.injected["fail"] > 0 and store.injected["lost_reply"] > 0


def test_cleanup_and_restore_are_idempotent(tmp_path):
    clock = ManualClock()
    cfg = config(clock)
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=cfg, clock=clock) as bm:
        bm.cleanup(bm.upload(src, "c1"))
        mutate(src)
        second = bm.upload(src, "c2")
        for _ in range(3):
            bm.cleanup(second)
    with RestoreManager(store, config=cfg, clock=clock) as rm:
        for _ in range(2):
            rm.restore(second, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == read_tree(src)


def test_sweep_stops_on_unreadable_live_index(tmp_path):
    clock = ManualClock()
    cfg = config(clock)
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=cfg, clock=clock) as bm:
        index_id = bm.upload(src, "c1")
        bm.cleanup(index_id)
        bm.upload(src, "abandoned")
        key = f"backup/index/{index_id}"
        data = bytearray(store.get(key).data)
        data[100] ^= 0xFF
        store.put(key, bytes(data))
        clock.advance(2 * HOUR_MS / 1000)
        before = all_keys(store, "blobs")
        with pytest.raises(FormatError, match="sweep stopped, nothing deleted"):
            bm.sweep()
        assert all_keys(store, "blobs") == before


def test_dry_run_sweep_deletes_nothing(tmp_path):
    clock = ManualClock()
    cfg = config(clock)
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    with BackupManager(store, config=cfg, clock=clock) as bm:
        bm.upload(src, "never committed")
        clock.advance(2 * HOUR_MS / 1000)
        report = bm.sweep(dry_run=True)
        assert report.indexes_deleted == 1 and report.blobs_deleted > 0
        assert all_keys(store, "index")
        assert bm.sweep().blobs_deleted == report.blobs_deleted
        assert not all_keys(store, "blobs") and not all_keys(store, "index")


def test_two_lineages_share_a_prefix_and_survive_the_sweep(tmp_path):
    """Two tasks back up to one prefix: each cleanup drops only its own predecessor, and the
    sweep (references unioned over all live indexes) keeps both committed snapshots."""
    clock = ManualClock()
    cfg = config(clock)
    store = LocalStore(tmp_path / "store")
    committed = {}
    for task in ("a", "b"):
        write_tree(tmp_path / task, {**sample_tree(ord(task)), "task": task.encode()})
    with BackupManager(store, config=cfg, clock=clock) as bm_a, \
            BackupManager(store, config=cfg, clock=clock) as bm_b:
        for step in range(3):
            for task, bm in (("a", bm_a), ("b", bm_b)):
                (tmp_path / task / f"{step}.sst").write_bytes(bytes([step]) * 5000)
                committed[task] = bm.upload(tmp_path / task, step)
                bm.cleanup(committed[task])
        bm_a.upload(tmp_path / "a", "abandoned")
        clock.advance(2 * HOUR_MS / 1000)
        report = bm_a.sweep()
    assert report.indexes_live == 2 and report.indexes_deleted == 1
    for task in ("a", "b"):
        with RestoreManager(store, config=cfg, clock=clock) as rm:
            assert rm.read_index(committed[task]).checkpoint_id == "2"
            rm.restore(committed[task], tmp_path / f"restored-{task}")
        assert read_tree(tmp_path / f"restored-{task}") == read_tree(tmp_path / task)
