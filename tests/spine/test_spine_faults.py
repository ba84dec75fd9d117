"""Spine under disk faults and concurrent merges: typed errors, bounded retries, nothing lost.

Disk faults are injected at ``batchstore._write_file`` (the one place spine bytes reach the
disk); retries run on a ManualClock, so no test sleeps.
"""

from __future__ import annotations

import errno

import pyarrow as pa
import pytest

from headrace.codec import ManualClock
from headrace.retry import RetryPolicy
from headrace.spine import Batch, Circuit, LocalBatchStore, Spine, SpineConfig, SpineError
from headrace.spine import batchstore as bs
from headrace.spine.errors import SpineWriteError

SYNC = SpineConfig(background_merge=False)


def _retry(attempts: int = 4) -> RetryPolicy:
    return RetryPolicy(max_attempts=attempts, clock=ManualClock())


class DiskFaults:
    """Make the next ``times`` file writes (whose name ends with ``suffix``) fail with ``err``."""

    def __init__(self, monkeypatch, err: int, times: int, suffix: str = ""):
        self.err, self.left, self.suffix = err, times, suffix
        self.failed: list[str] = []
        real = bs._write_file

        def write(path, parts):
            if self.left and path.name.removesuffix(".mut").endswith(self.suffix):
                self.left -= 1
                self.failed.append(path.name)
                raise OSError(self.err, errno.errorcode[self.err])
            return real(path, parts)

        monkeypatch.setattr(bs, "_write_file", write)


def _table(sp: Spine) -> dict:
    t = sp.to_table()
    return {(k, v): w for k, v, w in zip(*(t.column(c).to_pylist() for c in ("key", "val", "w")),
                                        strict=True)}


def _open(path, retry=None) -> Circuit:
    return Circuit.open(LocalBatchStore(path, write_retry=retry or _retry()), "fp", config=SYNC)


def test_transient_enospc_on_batch_writes_is_retried_and_the_commit_lands(tmp_path, monkeypatch):
    with _open(tmp_path) as c:
        sp = c.spine("s", pa.int64(), pa.int64())
        sp.insert(Batch.from_pydict([1, 2, 3], [0, 0, 0], [1, 1, 1]))
        faults = DiskFaults(monkeypatch, errno.ENOSPC, times=3, suffix=".batch")
        c.commit()
        assert len(faults.failed) == 3
        want = _table(sp)
    assert not list(tmp_path.glob("*.mut"))
    with _open(tmp_path) as c:
        assert _table(c.spine("s")) == want


def test_a_full_disk_fails_commit_typed_and_loses_nothing(tmp_path, monkeypatch):
    with _open(tmp_path) as c:
        sp = c.spine("s", pa.int64(), pa.int64())
        sp.insert(Batch.from_pydict([1, 2], [0, 0], [1, 1]))
        first = c.commit()
        committed = _table(sp)
        sp.insert(Batch.from_pydict([3], [0], [5]))
        faults = DiskFaults(monkeypatch, errno.ENOSPC, times=10**6, suffix=".batch")
        with pytest.raises(SpineWriteError) as ei:
            c.commit()
        err = ei.value
        assert isinstance(err, SpineError) and isinstance(err, OSError)
        assert err.errno == errno.ENOSPC and err.attempts == 4 and len(faults.failed) == 4
        assert err.path.endswith(".batch") and err.path in str(err)
        assert [e.id for e in c.checkpoints()] == [first]
        assert c.step == 1  # a failed commit does not advance the step
        assert not list(tmp_path.glob("*.mut"))
        faults.left = 0  # space freed: the same circuit commits everything it holds
        second = c.commit()
        assert c.step == 2
        want = _table(sp)
        assert want == {**committed, (3, 0): 5}
    with _open(tmp_path) as c:
        assert c.resumed_from.id == second
        assert _table(c.spine("s")) == want


def test_a_failing_commit_point_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    with _open(tmp_path) as c:
        sp = c.spine("s", pa.int64(), pa.int64())
        sp.insert(Batch.from_pydict([1], [0], [1]))
        first = c.commit()
        sp.insert(Batch.from_pydict([2], [0], [1]))
        DiskFaults(monkeypatch, errno.EIO, times=10**6, suffix="checkpoints.headrace")
        with pytest.raises(SpineWriteError, match="checkpoints.headrace") as ei:
            c.commit()
        assert ei.value.errno == errno.EIO
        folders = [p.name for p in tmp_path.iterdir() if p.is_dir()]
        assert folders == [first]  # the uncommitted checkpoint's folder is gone
    monkeypatch.undo()
    with _open(tmp_path) as c:
        assert c.resumed_from.id == first
        assert _table(c.spine("s")) == {(1, 0): 1}


def test_a_permanent_error_is_not_retried(tmp_path, monkeypatch):
    with _open(tmp_path) as c:
        c.spine("s", pa.int64(), pa.int64()).insert(Batch.from_pydict([1], [0], [1]))
        faults = DiskFaults(monkeypatch, errno.EROFS, times=10**6)
        with pytest.raises(SpineWriteError, match="errno 30") as ei:
            c.commit()
        assert ei.value.attempts == 1 and len(faults.failed) == 1


def test_a_spill_that_cannot_be_written_stays_in_memory_until_commit(tmp_path, monkeypatch):
    cfg = SpineConfig(background_merge=False, memory_budget_bytes=0)  # every batch spills
    with Circuit.open(LocalBatchStore(tmp_path, write_retry=_retry(2)), "fp", config=cfg) as c:
        sp = c.spine("s", pa.int64(), pa.int64())
        DiskFaults(monkeypatch, errno.ENOSPC, times=10**6, suffix=".batch")
        sp.insert(Batch.from_pydict([1, 2], [0, 0], [1, 1]))
        sp.insert(Batch.from_pydict([2, 3], [0, 0], [1, 1]))
        sp.compact()  # the merge's spill fails: the merge still succeeds, in memory
        assert sp.metrics()["spill_failures"] >= 1
        assert _table(sp) == {(1, 0): 1, (2, 0): 2, (3, 0): 1}
        with pytest.raises(SpineWriteError):
            c.commit()
        monkeypatch.undo()
        c.commit()
    with Circuit.open(tmp_path, "fp", config=cfg) as c:
        assert _table(c.spine("s")) == {(1, 0): 1, (2, 0): 2, (3, 0): 1}


# ---- cursor snapshots -----------------------------------------------------------------------
WATCH = {50_000, 79_999, 90_000}


def _drain(cur, n: int | None = None) -> list:
    """(key, weight) per key; the weight is read only for the keys the test changes (speed)."""
    out = []
    while cur.valid() and (n is None or len(out) < n):
        k = cur.key()
        out.append((k, cur.weight() if k in WATCH else 1))
        cur.next_key()
    return out


@pytest.mark.parametrize("persisted", [False, True])
def test_a_cursor_yields_its_snapshot_while_merges_change_the_spine(tmp_path, persisted):
    cfg = SpineConfig(background_merge=False, memory_budget_bytes=0 if persisted else 1 << 30)
    store = LocalBatchStore(tmp_path) if persisted else None
    n = 80_000  # several cursor chunks (an in-memory batch has a sparse key every 4096 rows)
    batches = [Batch.from_pydict(list(range(i, n, 4)), [0] * (n // 4), [1] * (n // 4))
               for i in range(4)]
    if persisted:  # mapped files that a merge will delete
        batches = [store.write_batch(b) for b in batches]
    sp = Spine(pa.int64(), pa.int64(), name="s", config=cfg, store=store, batches=batches)
    before = [(k, 1) for k in range(n)]
    cur = sp.cursor(chunk_rows=1000)
    head = _drain(cur, 20_000)  # past the first chunk
    # while the cursor is open: new rows ahead of it, a merge of everything, a truncation
    sp.insert(Batch.from_pydict([50_000, 79_999, 90_000], [0, 0, 0], [7, -1, 1]))
    sp.compact()
    sp.truncate_below(40_000)
    assert len(sp.batches) == 1 and len(sp.to_table()) == n - 40_000
    if persisted:  # the merged inputs' files were deleted under the cursor's maps
        assert len(list(tmp_path.glob("*.batch"))) == 1
    rest = _drain(cur)
    assert head + rest == before
    assert [k for k, _ in sp.cursor(lo=79_990)] == list(range(79_990, 79_999)) + [90_000]
    sp.close()
    if store is not None:
        store.close()
