"""ReservoirBatchStore: the BatchStore contract and a circuit, on a local folder and on S3."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from headrace.spine import Batch, Circuit, SpineConfig
from headrace.spine.reservoir_store import ReservoirBatchStore
from headrace.store import CountingStore, open_store
from headrace.testing.batchstore_conformance import BatchStoreTests


class TestReservoirBatchStoreLocal(BatchStoreTests):
    @pytest.fixture
    def batch_store_factory(self, tmp_path):
        return lambda: ReservoirBatchStore(str(tmp_path / "bucket"), page_bytes=4096)


class TestReservoirBatchStoreS3(BatchStoreTests):
    @pytest.fixture
    def batch_store_factory(self, s3_url):
        return lambda: ReservoirBatchStore(s3_url, page_bytes=4096)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_circuit_on_reservoir_commits_and_resumes(where, tmp_path, request):
    url = str(tmp_path / "bucket") if where == "local" else request.getfixturevalue("s3_url")
    cfg = SpineConfig(merge_fanout=2, base_rows=100, memory_budget_bytes=20_000)
    rng = np.random.default_rng(5)
    batches = [Batch.from_arrow(pa.table({"key": rng.integers(0, 300, 400),
                                          "val": rng.integers(0, 3, 400),
                                          "w": rng.choice([-1, 1], 400)})) for _ in range(6)]
    counting = CountingStore(open_store(url))
    with Circuit.open(ReservoirBatchStore(counting, page_bytes=8192), "g", config=cfg) as c:
        sp = c.spine("s", pa.int64(), pa.int64())
        for b in batches[:4]:
            sp.insert(b)
        c.commit(step=4)
        for b in batches[4:]:
            sp.insert(b)  # never committed: lost by the "crash" below
        sp.wait_idle(30)
        counts = counting.counts()
    assert 0 < counts["puts"] <= 10, counts  # one commit: a few objects, not one per batch
    with Circuit.open(ReservoirBatchStore(url, page_bytes=8192), "g", config=cfg) as c:
        assert c.step == 4
        assert c.spine("s").to_table().equals(Batch.merge(batches[:4]).to_table())
        c.spine("s").insert(batches[4])
        c.commit()
        c.gc_checkpoint()
    with Circuit.open(ReservoirBatchStore(url, page_bytes=8192), "g", config=cfg) as c:
        assert c.step == 5
        assert c.spine("s").to_table().equals(Batch.merge(batches[:5]).to_table())


def _table(seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch.from_arrow(pa.table({"key": rng.integers(0, 50, 100),
                                      "val": rng.integers(0, 3, 100),
                                      "w": np.ones(100, np.int64)}))


def test_second_circuit_on_a_local_stream_is_refused(tmp_path):
    from headrace.spine import StorageLocked

    url = str(tmp_path / "bucket")
    with Circuit.open(ReservoirBatchStore(url, page_bytes=4096), "g") as c:
        c.spine("s", pa.int64(), pa.int64()).insert(_table(1))
        c.commit(step=1)
        with pytest.raises(StorageLocked, match="two circuits"):
            ReservoirBatchStore(url, page_bytes=4096)
        c.spine("s").insert(_table(2))
        c.commit(step=2)
    with Circuit.open(ReservoirBatchStore(url, page_bytes=4096), "g") as c:
        assert c.step == 2
        assert c.spine("s").to_table().equals(Batch.merge([_table(1), _table(2)]).to_table())


def test_second_circuit_on_s3_is_fenced_and_the_committed_one_stays_intact(s3_url):
    """No flock on S3: the reservoir's commit fences whichever circuit commits second."""
    from headrace.reservoir import ConcurrentWriter, ReservoirOptions

    small = ReservoirOptions(max_file_size=16384)  # batches span several data files

    first = Circuit.open(ReservoirBatchStore(s3_url, page_bytes=4096, options=small), "g")
    first.spine("s", pa.int64(), pa.int64()).insert(_table(1))
    with Circuit.open(ReservoirBatchStore(s3_url, page_bytes=4096, options=small), "g") as second:
        for seed in range(20, 26):  # several data files, as the first circuit's below
            second.spine("s", pa.int64(), pa.int64()).insert(_table(seed))
        second.commit(step=1)
    with pytest.raises(ConcurrentWriter):
        for seed in range(3, 8):  # enough for the first circuit to ship full data files
            first.spine("s").insert(_table(seed))
        first.commit(step=1)
    first.close()
    with Circuit.open(ReservoirBatchStore(s3_url, page_bytes=4096, options=small), "g") as c:
        assert c.step == 1
        assert c.spine("s").to_table().equals(
            Batch.merge([_table(seed) for seed in range(20, 26)]).to_table())


def test_gc_checkpoint_is_durable_and_costs_one_commit_however_many_it_removes(tmp_path):
    """Dropping old checkpoints is one reservoir checkpoint (before, each removal was left
    uncommitted, so a reopen showed the removed checkpoints again)."""
    puts = {}
    for n in (3, 6):
        url = str(tmp_path / f"b{n}")
        counting = CountingStore(open_store(url))
        with Circuit.open(ReservoirBatchStore(counting, page_bytes=8192), "g") as c:
            sp = c.spine("s", pa.int64(), pa.int64())
            for i in range(n):
                sp.insert(_table(i))
                c.commit()
            sp.wait_idle(30)
            before = counting.counts()["puts"]
            assert len(c.gc_checkpoint()) == n - 2
            puts[n] = counting.counts()["puts"] - before
        with Circuit.open(ReservoirBatchStore(url, page_bytes=8192), "g") as c:
            assert len(c.checkpoints()) == 2 and c.step == n
            assert c.spine("s").to_table().equals(
                Batch.merge([_table(i) for i in range(n)]).to_table())
    assert puts[3] == puts[6] <= 3, puts
