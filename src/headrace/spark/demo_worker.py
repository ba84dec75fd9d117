"""The pipeline process of ``headrace demo`` (a separate process so the demo can SIGKILL it).

Prints one JSON line per event on stdout: {"event": "recovered"|"batch"|"done"|"verified", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time


def spawn_worker(args: list[str]) -> subprocess.Popen:
    """Start this module in a new process group (so a SIGKILL takes its JVM down with it)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    return subprocess.Popen([sys.executable, "-m", "headrace.spark.demo_worker", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)


def worker_events(proc: subprocess.Popen, idle_s: float | None = None):
    """The worker's JSON events; with ``idle_s``, yields None after that long without one (a
    reader thread keeps the caller free to decide to kill the worker meanwhile)."""
    q: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            if line.strip().startswith("{"):
                q.put(json.loads(line))
        q.put(StopIteration)

    threading.Thread(target=pump, name="headrace-demo-events", daemon=True).start()
    while True:
        try:
            ev = q.get(timeout=idle_s)
        except queue.Empty:
            yield None
            continue
        if ev is StopIteration:
            return
        yield ev


def emit(**kw) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--until-idle", action="store_true")
    ap.add_argument("--batches-per-trigger", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--verify-seed", type=int, default=None)
    ap.add_argument("--customers", type=int, default=200)
    ap.add_argument("--orders", type=int, default=20_000)
    args = ap.parse_args(argv)

    from headrace.spark.demo import (
        OUTPUT_SHARD,
        DemoSpec,
        build_pipeline,
        expected_totals,
        generate_events,
        normalize_totals,
    )
    from headrace.spark.local_session import session

    t_start = time.perf_counter()
    spark = session("headrace-demo", master=args.master, shuffle_partitions=args.partitions,
                    conf={"spark.sql.adaptive.enabled": "false"})
    p = build_pipeline(spark, args.root, partitions=args.partitions,
                       checkpoint_dir=args.checkpoint_dir,
                       batches_per_trigger=args.batches_per_trigger)
    p.on_batch = lambda info: emit(event="batch", **info)
    t0 = time.perf_counter()
    t = p.recover()
    emit(event="recovered", time=t, recover_s=round(time.perf_counter() - t0, 3),
         startup_s=round(time.perf_counter() - t_start, 3),
         replayed=int(p.metrics["replayed_batches"]))
    if args.until_idle:
        p.run(until_idle=True)
    else:
        p.run(until_idle=False, processing_time="1 second", timeout_s=args.seconds)
    counts = p.store.counts()
    task = {k.removeprefix("task_"): int(v) for k, v in p.metrics.items()
            if k.startswith("task_")}
    emit(event="done", batches=int(p.metrics["batches"]), time=p.time,
         batch_seconds=round(p.metrics["batch_seconds"], 3), driver_requests=counts,
         task_requests=task, driver_cost_usd=p.store.cost_usd())
    if args.verify_seed is not None:
        spec = DemoSpec(seed=args.verify_seed, customers=args.customers, orders=args.orders)
        want = normalize_totals(expected_totals(spark, generate_events(spec)))
        got = normalize_totals(p.read_shard(OUTPUT_SHARD))
        emit(event="verified", ok=got == want, rows=len(got), expected_rows=len(want),
             got=got[:10], want=want[:10])
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
