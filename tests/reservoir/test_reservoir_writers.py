"""Two writers of one stream, and commits whose reply is lost (issue 15, items 1 and 2).

A fenced writer never changes an object the winner's committed checkpoint references, and gets
ConcurrentWriter; interleavings are forced by call order (one process) or by stdin/stdout
handshakes with a child process, never by sleeps.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from headrace.reservoir import (
    CommitUnknown,
    ConcurrentWriter,
    ReservoirOptions,
    ReservoirReader,
    ReservoirStorage,
)
from headrace.reservoir.verify import verify_stream
from headrace.retry import RetryPolicy
from headrace.store import FaultyStore, LocalStore, open_store

MODES = ["bundled", "file"]
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0)


def _opts(mode: str, **kw) -> ReservoirOptions:
    return ReservoirOptions(**{"max_file_size": 16384, "registry": mode,
                               "snapshot_interval": 100, **kw})


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store", fsync=False)
    return open_store(request.getfixturevalue("s3_url"))


def _write(st: ReservoirStorage, tag: bytes, pids=range(20)) -> None:
    """Pages of ~3 KB into 16 KiB files: several full data files plus leftovers."""
    s = st.session()
    for pid in pids:
        s.write(pid, tag + bytes([pid]) * 3000)
    s.commit()


def _objects(store) -> dict[str, bytes]:
    return {m.key: store.get(m.key).data for m in store.list("default/")}


def _assert_untouched(store, before: dict[str, bytes]) -> None:
    after = _objects(store)
    changed = [k for k, data in before.items() if after.get(k) != data]
    assert not changed, f"the fenced writer changed committed objects: {changed}"


def _assert_reads(store, opts, tag: bytes, version: int) -> None:
    with ReservoirReader.open(store, options=opts) as r:
        assert r.version == version
        assert [r.read(p) for p in range(20)] == [tag + bytes([p]) * 3000 for p in range(20)]
    assert verify_stream(store, options=opts).ok


@pytest.mark.parametrize("mode", MODES)
def test_fenced_writer_changes_nothing_the_winner_committed(store, mode):
    opts = _opts(mode)
    loser = ReservoirStorage.open(store, options=opts)
    with ReservoirStorage.open(store, options=opts) as winner:
        _write(winner, b"win")
        assert winner.checkpoint() == 1
    before = _objects(store)
    _write(loser, b"lose")  # full files upload now, leftovers at checkpoint
    with pytest.raises(ConcurrentWriter):
        loser.checkpoint()
    _assert_untouched(store, before)
    _assert_reads(store, opts, b"win", 1)
    loser.reset()  # reloads the winner's checkpoint: the loser may carry on from there
    assert loser.version == 1
    _write(loser, b"next")
    assert loser.checkpoint() == 2
    loser.close()
    _assert_reads(store, opts, b"next", 2)


@pytest.mark.parametrize("mode", MODES)
def test_writer_fenced_past_a_snapshot_still_loses(tmp_path, mode):
    """The winner's snapshot deleted versions 1 and 2: a writer still at 0 finds version 1 free
    again. It must still lose, and its stray object must not be taken for a checkpoint."""
    store = LocalStore(tmp_path / "s", fsync=False)
    opts = _opts(mode, snapshot_interval=3)
    zombie = ReservoirStorage.open(store, options=opts)
    with ReservoirStorage.open(store, options=opts) as winner:
        for _ in range(5):
            _write(winner, b"win")
            winner.checkpoint()
    before = _objects(store)
    _write(zombie, b"zombie")
    with pytest.raises(ConcurrentWriter):
        zombie.checkpoint()
    zombie.close()
    _assert_untouched(store, before)
    _assert_reads(store, opts, b"win", 5)
    with ReservoirStorage.open(store, options=opts) as again:
        assert again.version == 5


@pytest.mark.parametrize("mode", MODES)
def test_overtaken_writer_does_not_sweep_the_winners_objects(tmp_path, mode):
    store = LocalStore(tmp_path / "s", fsync=False)
    opts = _opts(mode)
    stale = ReservoirStorage.open(store, options=opts)
    with ReservoirStorage.open(store, options=opts) as winner:
        for _ in range(2):
            _write(winner, b"win")
            winner.checkpoint()
    before = _objects(store)
    with pytest.raises(ConcurrentWriter):
        stale.sweep_orphans(grace_s=0)
    stale.close()
    _assert_untouched(store, before)
    _assert_reads(store, opts, b"win", 2)


@pytest.mark.parametrize("mode", MODES)
def test_two_writer_processes(tmp_path, mode):
    root = tmp_path / "s"
    store = LocalStore(root, fsync=False)
    opts = _opts(mode)
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("writer_child.py")), str(root), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().split() == ["ready", "0"]
        with ReservoirStorage.open(store, options=opts) as winner:
            _write(winner, b"win")
            assert winner.checkpoint() == 1
        before = _objects(store)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ConcurrentWriter"
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
    _assert_untouched(store, before)
    _assert_reads(store, opts, b"win", 1)


@pytest.mark.parametrize("mode", MODES)
def test_commit_with_lost_reply_and_failed_read_back(tmp_path, mode):
    """The commit PUT lands but its reply is lost, and reading it back fails too: the checkpoint
    is reported as CommitUnknown (not as failed), and reset() learns it landed."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    faulty = FaultyStore(inner, seed=1)
    opts = _opts(mode)
    commit_key = (lambda k: "/ckpt/" in k) if mode == "bundled" else (
        lambda k: k.endswith("/registry"))
    with ReservoirStorage.open(faulty, options=opts, retry=FAST) as st:
        _write(st, b"one")
        assert st.checkpoint() == 1
        _write(st, b"two")
        faulty.set_faults(lost_reply_rate=1.0, fail_rate=1.0, verbs={"get", "list"},
                          keys=commit_key)
        with pytest.raises(CommitUnknown):
            st.checkpoint()
        assert faulty.injected["lost_reply"] >= 1
        faulty.clear()
        st.reset()
        assert st.version == 2  # it had landed
        assert st.read(3) == b"two" + bytes([3]) * 3000
        _write(st, b"three")
        assert st.checkpoint() == 3  # no false ConcurrentWriter, nothing bricked
    _assert_reads(inner, opts, b"three", 3)


@pytest.mark.parametrize("mode", MODES)
def test_commit_that_did_not_land_is_reloaded_as_not_committed(tmp_path, mode):
    inner = LocalStore(tmp_path / "s", fsync=False)
    faulty = FaultyStore(inner, seed=1)
    opts = _opts(mode)
    commit_key = (lambda k: "/ckpt/" in k) if mode == "bundled" else (
        lambda k: k.endswith("/registry"))
    with ReservoirStorage.open(faulty, options=opts, retry=FAST) as st:
        _write(st, b"one")
        assert st.checkpoint() == 1
        _write(st, b"two")
        faulty.set_faults(fail_rate=1.0, verbs={"put"}, keys=commit_key, retryable=False)
        with pytest.raises(Exception) as ei:
            st.checkpoint()
        assert not isinstance(ei.value, ConcurrentWriter)
        faulty.clear()
        st.reset()
        assert st.version == 1
        _write(st, b"again")
        assert st.checkpoint() == 2
    _assert_reads(inner, opts, b"again", 2)


def test_a_checkpoint_deleted_between_listing_and_reading_is_loaded_again(tmp_path):
    """Another writer's snapshot cleanup can delete a checkpoint this writer just listed: the
    load starts over (a stale listing is not damage) instead of failing with NotFound."""
    from headrace.errors import NotFound
    from headrace.reservoir import ReservoirStorage
    from headrace.store import LocalStore

    store = LocalStore(str(tmp_path / "s"), fsync=False)
    with ReservoirStorage.open(store) as st:
        for i in range(3):
            s = st.session()
            s.write(1 + i, b"page %d" % i)
            s.commit()
            st.checkpoint()
    real_get = store.get
    failed = []

    def get_once_missing(key):
        if "/ckpt/" in key and not failed:
            failed.append(key)
            raise NotFound(key)
        return real_get(key)

    store.get = get_once_missing
    with ReservoirStorage.open(store) as st:
        assert failed and st.read(3) == b"page 2"
