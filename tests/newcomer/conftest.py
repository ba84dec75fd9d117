"""Fixtures of the newcomer suite: stores populated through the libraries' own APIs (a queue,
reservoir streams, shards, a pipeline's progress shard and state stream, a backup, a spine
directory), and one run of every example and every python block of the guide."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from newcomer_lib import DOCS, LONG_SHARD, REPO


def _populate(root: Path, spine_dir: Path, backup_src: Path) -> None:
    from headrace.backup import BackupManager
    from headrace.buffer import Producer, ProducerConfig
    from headrace.persist import PersistClient, make_updates
    from headrace.pipeline.plan.progress import GRAPH_KEY, STATE_KEY, commit_progress
    from headrace.reservoir import ReservoirStorage
    from headrace.spine import Batch, Circuit, SpineConfig
    from headrace.store import LocalStore

    url = str(root)
    with Producer(ProducerConfig(url=url, flush_size_bytes=1)) as p:  # one batch per produce
        for i in range(3):
            p.produce([b'{"table":"orders","order_id":%d}' % i]).watcher.await_durable(timeout=10)
    store = LocalStore(root, fsync=False)
    with ReservoirStorage.open(store, stream="sales.state") as st:  # the pipeline's state
        for v in range(2):
            s = st.session()
            s.write(v, b"state %d" % v)
            s.commit()
            st.checkpoint()
    client = PersistClient(store, auto_compact_at=None)
    w = client.open_writer("orders")
    for t in range(3):
        w.compare_and_append(make_updates({"k": [f"a{t}", f"b{t}"]}, [t, t]), t, t + 1)
    client.open_writer(LONG_SHARD).compare_and_append(make_updates({"k": ["x"]}, [0]), 0, 1)
    # pipeline "sales": two committed micro-batches, the second consumed through sequence 1
    old: dict[str, int] = {}
    for t, (seq, version) in enumerate([(0, 1), (1, 2)]):
        new = {"ingest": seq, STATE_KEY: version, f"{GRAPH_KEY}:f00d": 0}
        commit_progress(client, "sales.progress", t, old, new)
        old = new
    client.close()
    (backup_src / "sub").mkdir(parents=True)
    (backup_src / "a.sst").write_bytes(b"a" * 1000)
    (backup_src / "sub" / "b.log").write_bytes(b"b" * 10)
    with BackupManager(store, prefix="backup") as bm:
        bm.cleanup(bm.upload(backup_src, "ck-1"))
    cfg = SpineConfig(background_merge=False, memory_budget_bytes=0)
    with Circuit.open(spine_dir, "newcomer", config=cfg) as c:
        sp = c.spine("counts", pa.int64(), pa.int64())
        sp.insert(Batch.from_arrow(pa.table({"key": np.arange(10, dtype=np.int64),
                                             "val": np.zeros(10, dtype=np.int64),
                                             "w": np.ones(10, dtype=np.int64)})))
        c.commit(step=1)


@pytest.fixture(scope="session")
def populated(tmp_path_factory) -> dict[str, Path]:
    """A store root with one of everything, plus a spine directory. Tests only read it."""
    base = tmp_path_factory.mktemp("newcomer")
    paths = {"root": base / "root", "spine": base / "spine", "src": base / "src"}
    _populate(paths["root"], paths["spine"], paths["src"])
    return paths


@pytest.fixture(scope="session")
def many_parts(tmp_path_factory) -> Path:
    """A shard of 16 Parquet parts: enough for `shard verify`'s reads to leave pyarrow's thread
    pool busy at exit, which aborted about half the runs before the clean exit."""
    from headrace.persist import PersistClient, make_updates

    root = tmp_path_factory.mktemp("parts")
    client = PersistClient(str(root), auto_compact_at=None)
    w = client.open_writer("big")
    rows = 2000
    for t in range(16):
        w.compare_and_append(make_updates({"k": np.arange(rows) + t * rows,
                                           "s": [f"v{i}" for i in range(rows)]}, [t] * rows),
                             t, t + 1)
    client.close()
    return root


_DOCS_RUN: dict = {}  # the background run of examples and doc blocks (pytest_collection_finish)


def _start_docs_run() -> dict:
    """Start run_docs.py over every examples/*.py (each on a new local folder store) and every
    python block of DOCS (in a new working directory each), in one subprocess."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="headrace-runnable-"))
    jobs = [{"name": p.name, "kind": "example", "path": str(p), "arg": str(base / p.stem)}
            for p in sorted((REPO / "examples").glob("*.py"))]
    for md in DOCS:
        (base / md.stem).mkdir()
        jobs.append({"name": md.name, "kind": "doc", "path": str(md), "arg": str(base / md.stem)})
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    out, err = open(base / "stdout.txt", "wb"), open(base / "stderr.txt", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("run_docs.py")),
                             json.dumps(jobs)], stdout=out, stderr=err, env=env, cwd=base)
    return {"base": base, "proc": proc, "files": (out, err)}


def pytest_collection_finish(session) -> None:
    """The examples and doc blocks take minutes of mostly waiting (Spark start-up, scheduling):
    when a selected test needs them, start their run now, beside the rest of the suite."""
    if any("runnable_docs" in getattr(item, "fixturenames", ()) for item in session.items):
        _DOCS_RUN.update(_start_docs_run())


def pytest_collection_modifyitems(session, config, items) -> None:
    """The tests that read the background run go last, so it has the whole suite's time."""
    uses = ["runnable_docs" in getattr(item, "fixturenames", ()) for item in items]
    items[:] = [i for i, u in zip(items, uses, strict=True) if not u] + \
        [i for i, u in zip(items, uses, strict=True) if u]


def pytest_sessionfinish(session, exitstatus) -> None:
    import shutil

    if _DOCS_RUN:
        if _DOCS_RUN["proc"].poll() is None:  # the session stopped early (-x, ^C)
            _DOCS_RUN["proc"].kill()
            _DOCS_RUN["proc"].wait()
        for f in _DOCS_RUN["files"]:
            f.close()
        shutil.rmtree(_DOCS_RUN["base"], ignore_errors=True)
        _DOCS_RUN.clear()


@pytest.fixture(scope="session")
def runnable_docs() -> dict[str, dict]:
    """The background run's results: {job name: {"ok": bool, "out": its stdout}}; the
    subprocess's stderr under "stderr"."""
    if not _DOCS_RUN:
        _DOCS_RUN.update(_start_docs_run())
    run = _DOCS_RUN
    run["proc"].wait(timeout=1500)
    for f in run["files"]:
        f.flush()
    base = run["base"]
    stdout = (base / "stdout.txt").read_text(errors="replace")
    stderr = (base / "stderr.txt").read_text(errors="replace")
    assert run["proc"].returncode == 0, stderr[-3000:]
    sections = re.split(r"^=== (.+)\n", stdout, flags=re.M)[1:]
    results: dict[str, dict] = {"stderr": {"ok": True, "out": stderr}}
    print(stderr)  # each job's time (pytest shows it with -s or on a failure)
    for name, out in zip(sections[::2], sections[1::2], strict=True):
        if name.startswith("FAILED "):
            results[name.removeprefix("FAILED ")]["ok"] = False
        else:
            results[name] = {"ok": True, "out": out, "dir": base / Path(name).stem}
    return results
