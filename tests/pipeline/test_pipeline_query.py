"""``Pipeline.start()``: a background query reports progress and stops from another thread."""

from __future__ import annotations

import time

import pytest

from headrace.testing.queries import encode_entries, produce_entries

pytestmark = pytest.mark.spark


def test_started_pipeline_reports_progress_and_stops(spark, tmp_path):
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    root = str(tmp_path / "store")
    rows = [{"k": i % 3, "v": i} for i in range(30)]
    produce_entries(root, "in", encode_entries("t", rows))
    p = Pipeline(spark, root, name="bg", partitions=2, buckets=2,
                 checkpoint_dir=str(tmp_path / "ck"))
    t = p.read_queue("in", {"t": "k long, v long"})["t"]
    t.group_by("k").agg(F.sum("v").alias("s")).write_shard("sums")
    q = p.start(processing_time="1 second")
    try:
        deadline = time.monotonic() + 180
        while not q.recent_progress and time.monotonic() < deadline and q.is_active:
            time.sleep(0.5)
        first = q.last_progress
        assert first is not None, q.status
        assert first["input_rows"] == 30 and first["rows_per_second"] > 0
        assert first["requests"]["puts"] >= 1  # the state checkpoint and the commits
        assert q.status["message"] == "running"
        produce_entries(root, "in", encode_entries("t", [{"k": 0, "v": 1000}]))
        while len(q.recent_progress) < 2 and time.monotonic() < deadline and q.is_active:
            time.sleep(0.5)
        assert q.last_progress["input_rows"] == 1
    finally:
        q.stop()
    assert not q.is_active and q.status["message"] == "stopped"
    assert q.await_termination(1) is True
    got = {r["k"]: r["s"] for r in p.read_shard("sums").to_pylist()}
    assert got == {0: sum(range(0, 30, 3)) + 1000, 1: sum(range(1, 30, 3)),
                   2: sum(range(2, 30, 3))}


@pytest.mark.parametrize("inner", ["OSError: [Errno 12] Cannot allocate memory",
                                   "MemoryError: Unable to allocate 512. MiB"])
def test_a_query_stopped_by_worker_memory_says_to_raise_buckets(inner):
    from headrace.pipeline.driver.trigger import failure_text

    # as PySpark reports a Python worker's error: the worker's traceback inside its own text
    wrapped = Exception("An exception was thrown from the Python worker. Please see the "
                        "stack trace below.\nTraceback (most recent call last):\n"
                        f"  File \"x.py\", line 1, in merge\n{inner}\n")
    text = failure_text(wrapped)
    assert text.startswith(inner)
    assert "Pipeline(buckets=...)" in text and "spark.executor.pyspark.memory" in text
    other = failure_text(Exception("ValueError: bad row"))
    assert other == "ValueError: bad row"
