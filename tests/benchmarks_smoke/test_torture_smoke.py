"""A tiny configuration of benchmarks/torture.py, so the torture code keeps running (< 30 s):
SIGKILLed producers and racing reservoir writers lose nothing, and a corruption sweep of the
persist, spine and buffer files finds only right reads or typed errors (or, apart, wrong reads
where RFC 0001's formats have no check)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import torture  # noqa: E402
from torture_sweep import (  # noqa: E402
    SweepResult,
    buffer_target,
    persist_target,
    spine_target,
    sweep,
)


def test_kill_loops_lose_nothing(tmp_path):
    t = torture.Tally()
    rng = random.Random(7)
    acked = torture.kill_producers(tmp_path, 1, rng, t)
    torture.kill_reservoir_writers(tmp_path, 1, rng, t)
    assert t.n["kills"] == 5 and acked, t.failures
    for key in ("acked_lost", "acked_duplicated", "committed_damaged", "worker_errors"):
        assert t.n[key] == 0, t.failures


def test_corruption_sweep_reads_right_or_raises_typed(tmp_path):
    result = SweepResult()
    for build in (persist_target, spine_target, buffer_target):
        sweep(build(tmp_path / build.__name__), 6, 1, random.Random(3), result)
    assert result.mutations > 50 and result.typed > 0
    assert (result.silent_wrong_reads, result.untyped_errors) == (0, 0), result.examples
