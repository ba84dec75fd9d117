"""Shared plumbing for benchmark scripts (the benchmark contract of DESIGN.md).

Each benchmark: ``args = parse_args(description)``; measure headrace and its baseline in the
same run; ``report(name, figures, args, counts)`` prints a table and writes
``benchmarks/results/NAME.json`` (flat numbers + ``quick`` + store operation counts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SCRATCH_ROOT = Path(os.environ.get("HEADRACE_BENCH_DIR", tempfile.gettempdir()))


def parse_args(description: str, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes, same code path (< 60 s)")
    p.add_argument("--url", default=None, help="object store URL (default: a temp folder)")
    return p.parse_args(argv)


@contextmanager
def scratch_dir(name: str):
    d = Path(tempfile.mkdtemp(prefix=f"hr-bench-{name}-", dir=SCRATCH_ROOT))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.s = time.perf_counter() - self.t0


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every descendant (the Spark JVM, its Python
    workers; exited ones included): on a shared machine the wall time says little about the
    run's own cost, this says what it would need alone (at best wall = CPU / cores)."""
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu(pid: int) -> float:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return 0.0
        return sum(int(x) for x in fields[11:15]) / ticks  # utime stime cutime cstime

    def children(pid: int) -> list[int]:
        out = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                out += [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
        return out

    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += cpu(pid)
        todo += children(pid)
    return total


def report(name: str, figures: dict, args: argparse.Namespace,
           counts: dict | None = None) -> dict:
    out = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in figures.items()}
    out["quick"] = bool(args.quick)
    for k, v in (counts or {}).items():
        out[f"store_{k}"] = v
    # a --quick run never overwrites the committed full-size figures
    where = RESULTS / "quick" if args.quick else RESULTS
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    width = max(len(k) for k in out)
    print(f"== {name} ({'quick' if args.quick else 'full'}) ==")
    for k, v in out.items():
        print(f"  {k:<{width}}  {v:,.4g}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    sys.stdout.flush()
    return out
