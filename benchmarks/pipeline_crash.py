"""Issue 8 crash run: SIGKILL the pipeline process at random moments N times (>= 10), then let it
finish; the output must equal a from-scratch PySpark computation and the queue must be drained.

Each cycle kills the whole process group (driver, JVM, Python workers) after a committed batch
plus a random delay, so kills land mid-batch, mid-checkpoint, between appends, anywhere. Every
other cycle also deletes Spark's checkpoint folder (a 'new host'). Prints one line per cycle and
writes benchmarks/results/pipeline_crash.json.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import parse_args, report, scratch_dir  # noqa: E402

from headrace.spark.demo import DemoSpec, encode, generate_events, produce  # noqa: E402
from headrace.testing.pipeline_kill import run_and_kill, run_to_end  # noqa: E402


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    kills = 3 if args.quick else 10
    spec = DemoSpec(seed=13, customers=50, orders=3000 if args.quick else 12_000)
    rng = random.Random(2026)
    with scratch_dir("crash") as work:
        root = str(work / "store")
        payloads = encode(generate_events(spec))
        waves = kills * 2 + 4
        step = len(payloads) // waves + 1
        for i in range(0, len(payloads), step):
            produce(root, payloads[i : i + step])
        ckpt = work / "spark-ckpt"
        common = ["--root", root, "--partitions", "3", "--checkpoint-dir", str(ckpt),
                  "--batches-per-trigger", "1"]
        t0 = time.perf_counter()
        for k in range(kills):
            seen = run_and_kill(common, rng, max_delay_s=4.0)
            wiped = k % 2 == 1
            if wiped:
                shutil.rmtree(ckpt, ignore_errors=True)
            print(f"kill {k + 1}/{kills}: after {seen} batch(es)"
                  f"{', Spark checkpoint deleted' if wiped else ''}", flush=True)
        end = run_to_end([*common, "--until-idle", "--verify-seed", str(spec.seed),
                          "--customers", str(spec.customers), "--orders", str(spec.orders)])
        elapsed = time.perf_counter() - t0
    ok = bool(end.get("verified", {}).get("ok"))
    report("pipeline_crash", {"kills": kills, "output_identical": int(ok),
                              "final_time": end["done"]["time"],
                              "replayed_on_last_start": end["recovered"]["replayed"],
                              "seconds": elapsed}, args)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
