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
