"""The memory of one state bucket's task under a worker's cap: where the 1 GiB capacity run's
address space goes, measured without Spark in a few seconds.

One bucket is loaded in small batches until it holds ``--keys`` keys (the capacity run's
bucket at 50M keys over 32 buckets: ~1.5M), then takes a few deltas; its top-tier merges are
the task's largest allocations. The job's own task function drives it
(``pipeline_scaling.amortised_state_bytes``, one partition, one bucket) with
``PYSPARK_EXECUTOR_MEMORY_MB`` set, so the caches take the sizes a capped worker gives them.
Printed: the peak of Arrow's memory pool, and this process's peak address space (VmPeak, what
RLIMIT_AS limits) and RSS. The allocator settings of a capped worker (worker_daemon.py) are
applied when ``--daemon-settings`` is given; compare a run without it.

Run: ``python benchmarks/merge_memory.py [--keys 1500000] [--daemon-settings]``. A
diagnostic: no results file (figures in docs/pipeline.md, "Memory of the Python workers").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--keys", type=int, default=1_500_000)
    a.add_argument("--load", type=int, default=31_250, help="keys added per load batch")
    a.add_argument("--deltas", type=int, default=8)
    a.add_argument("--cap-mb", type=int, default=1024)
    a.add_argument("--daemon-settings", action="store_true")
    args = a.parse_args()
    os.environ["PYSPARK_EXECUTOR_MEMORY_MB"] = str(args.cap_mb)  # the caches' capped sizes
    if args.daemon_settings:
        from headrace.spark.worker_daemon import _fit_allocators_to_cap

        _fit_allocators_to_cap()
    else:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # the same pool both ways
    import pyarrow as pa
    from pipeline_scaling import amortised_state_bytes

    pool, peak, stop = pa.default_memory_pool(), [0], threading.Event()

    def sample() -> None:  # the pool's own max_memory() counts from the process's start
        while not stop.wait(0.0005):
            peak[0] = max(peak[0], pool.bytes_allocated())

    threading.Thread(target=sample, daemon=True).start()
    vm0 = _status_kib("VmSize")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        amortised_state_bytes(Path(d), args.keys, args.load, batches=args.deltas,
                              partitions=1, buckets=1, load=args.load)
    stop.set()
    print(json.dumps({
        "keys": args.keys, "daemon_settings": args.daemon_settings,
        "seconds": round(time.perf_counter() - t0, 1),
        "arrow_pool_peak_mb": round(peak[0] / 1e6, 1),
        "vm_at_start_mb": round(vm0 * 1024 / 1e6, 1),
        "vm_peak_mb": round(_status_kib("VmPeak") * 1024 / 1e6, 1),
        "rss_peak_mb": round(_status_kib("VmHWM") * 1024 / 1e6, 1)}))


if __name__ == "__main__":
    main()
