"""LocalBatchStore: the BatchStore contract, the directory lock, crash safety under SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from headrace.spine import (
    Batch,
    Circuit,
    FingerprintMismatch,
    LocalBatchStore,
    ReservoirBatchStore,
    StorageLocked,
)
from headrace.testing.batchstore_conformance import BatchStoreTests


class TestLocalBatchStore(BatchStoreTests):
    @pytest.fixture
    def batch_store_factory(self, tmp_path):
        return lambda: LocalBatchStore(tmp_path / "state")


def test_second_process_is_refused_at_once(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from headrace.spine import LocalBatchStore
            store = LocalBatchStore({str(tmp_path)!r})
            print("holding", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        t0 = time.monotonic()
        with pytest.raises(StorageLocked, match=f"pid {holder.pid}"):
            Circuit.open(tmp_path, "fp")
        assert time.monotonic() - t0 < 1.0
    finally:
        holder.stdin.close()
        holder.wait(10)
    Circuit.open(tmp_path, "fp").close()  # free again once the holder is gone


def test_same_process_second_open_is_refused(tmp_path):
    with LocalBatchStore(tmp_path), pytest.raises(StorageLocked):
        LocalBatchStore(tmp_path)


def test_fingerprint_mismatch_is_refused_and_checkpoint_choice(tmp_path):
    with Circuit.open(tmp_path, "graph-A") as c:
        sp = c.spine("s", pa.int64(), pa.int64())
        sp.insert(Batch.from_pydict([1], [1], [1]))
        first = c.commit(step=5)
        sp.insert(Batch.from_pydict([2], [1], [1]))
        c.commit(step=6)
    with pytest.raises(FingerprintMismatch, match="graph-A"):
        Circuit.open(tmp_path, "graph-B")
    with Circuit.open(tmp_path, "graph-A", checkpoint=first) as c:
        assert c.step == 5
        assert c.spine("s").to_table().column("key").to_pylist() == [1]
    with Circuit.open(tmp_path, "graph-A") as c:
        assert c.step == 6
        assert c.spine("s").to_table().column("key").to_pylist() == [1, 2]
        with pytest.raises(ValueError):
            c.gc_checkpoint(keep=1)


ZYGOTE = textwrap.dedent("""
    import os, sys
    import numpy as np, pyarrow as pa
    from headrace.spine import Batch, Circuit, ReservoirBatchStore, SpineConfig

    def batch(i):
        rng = np.random.default_rng(i)
        n = 2000
        return Batch.from_arrow(pa.table({"key": rng.integers(0, 10000, n),
                                          "val": rng.integers(0, 3, n),
                                          "w": rng.choice([-1, 1, 2], n)}))

    def work(d, mode, progress):
        cfg = SpineConfig(merge_fanout=2, base_rows=1000, memory_budget_bytes=0,
                          block_bytes=4096, background_merge=(mode == "commit"))
        where = d if mode != "reservoir" else ReservoirBatchStore(d, page_bytes=65536)
        c = Circuit.open(where, "crash-graph", config=cfg)
        sp = c.spine("s", pa.int64(), pa.int64())
        i = c.step
        while True:
            i += 1
            sp.insert(batch(i))
            if mode == "merge":
                sp.compact()
                if i % 2:
                    continue
            c.commit(step=i)
            os.write(progress, f"{i}\\n".encode())

    Batch.merge([batch(1), batch(2)]).to_bytes()  # warm Arrow once, before forking
    import headrace.reservoir  # noqa: F401 - imported once here, not in every child
    for line in sys.stdin:
        d, mode, progress = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                work(d, mode, os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
            finally:
                os._exit(1)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        print("reaped", flush=True)
""")


def _batch(i: int) -> Batch:
    rng = np.random.default_rng(i)
    n = 2000
    return Batch.from_arrow(pa.table({"key": rng.integers(0, 10000, n),
                                      "val": rng.integers(0, 3, n),
                                      "w": rng.choice([-1, 1, 2], n)}))


_MODELS: dict[int, Batch] = {}


def _model(step: int) -> pa.Table:
    """The consolidated sum of batches 1..step (cached, built incrementally)."""
    if step not in _MODELS:
        _MODELS[step] = _batch(1) if step == 1 else Batch.merge([_batch(step), _model_b(step - 1)])
    return _MODELS[step].to_table()


def _model_b(step: int) -> Batch:
    _model(step)
    return _MODELS[step]


@pytest.fixture(scope="module")
def zygote():
    """One pre-warmed process that forks a child per run (so a run costs no imports)."""
    proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    yield proc
    proc.stdin.close()
    proc.wait(30)


@pytest.mark.parametrize("mode,kills", [("commit", 30), ("merge", 30), ("reservoir", 5)])
def test_sigkill_during_commit_or_merge_30_times(tmp_path, mode, kills, zygote):
    state, progress = tmp_path / "state", tmp_path / "progress"
    rng = random.Random(1234)
    acked: list[int] = []
    for _ in range(kills):
        zygote.stdin.write(f"{state} {mode} {progress}\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline())
        time.sleep(rng.uniform(*{"commit": (0.08, 0.35), "merge": (0.1, 0.45),
                                 "reservoir": (0.3, 0.9)}[mode]))
        os.kill(pid, signal.SIGKILL)
        assert zygote.stdout.readline().strip() == "reaped"
        acked = [int(x) for x in progress.read_text().split()] if progress.exists() else []
        _check_recovered(state, acked[-1] if acked else 0, mode)
    least = {"commit": 10, "merge": 3, "reservoir": 2}[mode]  # progress despite the kills
    assert len(acked) >= least, f"only {len(acked)} commits acknowledged: kills came too soon"


def _check_recovered(state: Path, last_acked: int, mode: str) -> None:
    where = state if mode != "reservoir" else ReservoirBatchStore(str(state), page_bytes=65536)
    with Circuit.open(where, "crash-graph") as c:  # runs startup gc
        step = c.step
        assert last_acked <= step <= last_acked + 3
        if mode != "reservoir":
            leftovers = [p for p in state.rglob("*") if p.name.endswith(".mut")]
            assert leftovers == []
        catalog = c.store.checkpoints()
        referenced = {b for e in catalog for m in c.store.read_manifests(e.id).values()
                      for b in m.batches}
        assert set(c.store.batch_names()) == referenced
        if step:
            got = c.spine("s").to_table()
            assert got.equals(_model(step)), f"step {step} differs from the model"
        c.gc_checkpoint()
