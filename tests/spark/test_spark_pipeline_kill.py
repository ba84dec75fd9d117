"""kill -9 of the whole pipeline process (driver, JVM, Python workers) mid-stream, then restart
on a 'new host' (all local caches and Spark's checkpoint deleted): same output as a batch
recomputation, queue drained."""

from __future__ import annotations

import random
import shutil

import pytest

from headrace.buffer import read_manifest
from headrace.persist import PersistClient
from headrace.spark.demo import DemoSpec, encode, generate_events, produce
from headrace.store import open_store
from headrace.testing.pipeline_kill import run_and_kill, run_to_end
from headrace.testing.spark import child_env

pytestmark = pytest.mark.spark


def test_sigkill_then_restart_on_new_host(tmp_path, monkeypatch):
    # the worker processes take this process's environment: their JVMs with C1 only (this
    # test starts no JVM of its own)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", child_env()["JAVA_TOOL_OPTIONS"])
    spec = DemoSpec(seed=5, customers=25, orders=800)
    root = str(tmp_path / "store")
    payloads = encode(generate_events(spec))
    step = len(payloads) // 4 + 1
    for i in range(0, len(payloads), step):
        produce(root, payloads[i : i + step])
    ckpt = tmp_path / "spark-ckpt"
    common = ["--root", root, "--partitions", "2", "--checkpoint-dir", str(ckpt),
              "--batches-per-trigger", "1"]
    seen = run_and_kill(common, random.Random(1), max_delay_s=1.0)
    assert seen >= 1
    shutil.rmtree(ckpt, ignore_errors=True)  # a new host: no Spark checkpoint, no caches
    end = run_to_end([*common, "--until-idle", "--verify-seed", "5", "--customers", "25",
                      "--orders", "800"])
    assert end["returncode"] == 0
    assert end["verified"]["ok"], end["verified"]
    # every produced batch was consumed, and the consumer's position is recorded durably
    store = open_store(root)
    manifest = read_manifest(store, "ingest/manifest")
    progress = PersistClient(store).read_only("demo.progress")
    consumed = {r["source"]: r["address"] for r in
                progress.snapshot(end["done"]["time"] - 1).to_pylist()}
    assert consumed["ingest"] == manifest.next_sequence - 1
