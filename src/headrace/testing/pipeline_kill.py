"""Kill -9 the demo pipeline at random moments and restart it (tests and benchmarks/).

The pipeline runs in ``python -m headrace.spark.demo_worker`` in its own process group, so a
SIGKILL takes its Spark JVM and Python workers down with it, exactly like a machine dying.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

from headrace.spark.demo_worker import spawn_worker, worker_events


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_and_kill(args: list[str], rng: random.Random, max_delay_s: float,
                 after_batches: int = 1) -> int:
    """Start the worker, wait for ``after_batches`` committed batches, then SIGKILL it after a
    random delay (mid-batch, between batches, wherever it is). Returns the batches seen."""
    proc = spawn_worker(args)
    seen = 0
    try:
        for ev in worker_events(proc):
            if ev["event"] == "batch":
                seen += 1
                if seen >= after_batches:
                    time.sleep(rng.uniform(0, max_delay_s))
                    break
    finally:
        kill_group(proc)
    return seen


def run_to_end(args: list[str], timeout_s: float = 600) -> dict:
    """Run the worker until idle (with --until-idle in args); returns its events by kind."""
    proc = spawn_worker(args)
    out: dict = {"batches": 0}
    try:
        for ev in worker_events(proc):
            if ev["event"] == "batch":
                out["batches"] += 1
            else:
                out[ev["event"]] = ev
    finally:
        rc = proc.wait(timeout=timeout_s)
    out["returncode"] = rc
    return out
