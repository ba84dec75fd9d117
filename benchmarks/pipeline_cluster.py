"""Issue 8: the demo pipeline on a multi-process Spark cluster gives the same output.

Runs the demo worker twice over the same queue contents, on separate copies of the store:
``local[2]`` and ``local-cluster[2,1,1024]`` (two executors in their own JVMs, each with its
own Python workers, all bound to 127.0.0.1). Both outputs are checked against the from-scratch
PySpark computation and against each other.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import parse_args, report, scratch_dir  # noqa: E402

from headrace.spark.demo import DemoSpec, encode, generate_events, produce  # noqa: E402
from headrace.testing.pipeline_kill import run_to_end  # noqa: E402


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    spec = DemoSpec(seed=21, customers=40, orders=1500 if args.quick else 10_000)
    figures = {}
    with scratch_dir("cluster") as work:
        seed_root = work / "seed-store"
        payloads = encode(generate_events(spec))
        step = len(payloads) // 4 + 1
        for i in range(0, len(payloads), step):
            produce(str(seed_root), payloads[i : i + step])
        outputs = {}
        for label, master in (("local", "local[2]"), ("cluster", "local-cluster[2,1,1024]")):
            root = work / f"store-{label}"
            shutil.copytree(seed_root, root)
            t0 = time.perf_counter()
            end = run_to_end(["--root", str(root), "--partitions", "4", "--master", master,
                              "--checkpoint-dir", str(work / f"ckpt-{label}"),
                              "--batches-per-trigger", "1", "--until-idle",
                              "--verify-seed", str(spec.seed), "--customers",
                              str(spec.customers), "--orders", str(spec.orders)])
            figures[f"{label}_seconds"] = time.perf_counter() - t0
            figures[f"{label}_batches"] = end["batches"]
            figures[f"{label}_output_identical_to_batch"] = int(
                bool(end.get("verified", {}).get("ok")))
            outputs[label] = end.get("verified", {}).get("got")
        figures["cluster_equals_local"] = int(outputs["local"] == outputs["cluster"]
                                              and outputs["local"] is not None)
    report("pipeline_cluster", figures, args)
    if not figures["cluster_equals_local"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
