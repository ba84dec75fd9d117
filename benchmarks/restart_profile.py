"""Where a restart's time goes: the recovery of ``pipeline_scaling.py``, repeated and timed.

``pipeline_scaling.py`` measures one restart (``recovery_ratio_vs_spark_best_p``); one figure
of a few seconds on a 2-core machine varies by ±15 % from run to run, too little to tell a
change from noise. This runs the same crash once — a child driver SIGKILLed at the state
checkpoint of its second batch, over ``--keys`` keys and 100k-row deltas — then restarts a copy
of the crashed store and Spark checkpoint ``--restarts`` times, each in a fresh driver process
(SparkSession start excluded, as in pipeline_scaling), and prints each restart's timeline in
seconds after ``run()`` is called:

- ``recovered`` / ``warm_called`` / ``range_built`` / ``plan_built``: the driver's steps
  (Pipeline.recover, the worker warm-up's submission call, the interrupted batch's queue range
  and static plan built);
- ``job N`` submitted → done, and each stage's first task → done (Spark's REST API; the UI is on
  in these children only);
- ``committed``: the first batch committed (the recovery figure), and the CPU seconds the
  driver, its JVM and the Python workers used until then (÷ the wall time: how many of the
  machine's cores the restart kept busy; near the core count, only less work helps).

Run: ``python benchmarks/restart_profile.py [--keys 250000] [--restarts 4] [--alternate
NAME=VALUE]``; ``--alternate`` runs every other restart with that environment variable set
(an A/B of a change behind a switch, on the same crashed state, interleaved so the machine's
drift hits both; ``--alternate HEADRACE_DIRECT_RESTART=0``: the static plan against the direct
job, pipeline/direct.py). No results file: a diagnostic; the figures that count are
pipeline_scaling's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline_scaling as ps  # noqa: E402
from benchlib import scratch_dir  # noqa: E402
from spark_baseline import input_files  # noqa: E402

HERE = Path(__file__).resolve()


def _rest_times(spark, t0: float) -> list[str]:
    """Jobs and stages of this application from Spark's REST API, seconds after ``t0``."""
    base = spark.sparkContext.uiWebUrl + "/api/v1/applications/" + \
        spark.sparkContext.applicationId

    def get(path):
        with urllib.request.urlopen(base + path, timeout=10) as r:
            return json.loads(r.read())

    def at(stamp):
        if not stamp:
            return float("nan")
        when = datetime.strptime(stamp.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
        return when.timestamp() - t0

    lines = []
    for job in sorted(get("/jobs"), key=lambda j: j["jobId"]):
        lines.append(f"job {job['jobId']} {job['name'][:40]!r}: submitted "
                     f"{at(job.get('submissionTime')):.2f}, done {at(job.get('completionTime')):.2f}")
    for st in sorted(get("/stages"), key=lambda s: s["stageId"]):
        lines.append(f"  stage {st['stageId']} ({st['numTasks']} tasks): submitted "
                     f"{at(st.get('submissionTime')):.2f}, first task "
                     f"{at(st.get('firstTaskLaunchedTime')):.2f}, done "
                     f"{at(st.get('completionTime')):.2f}")
    return lines


def _tree_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process and its descendants, by part:
    ``driver`` (this Python process), the JVM's threads by kind (``jvm jit`` compiler,
    ``jvm gc``, ``jvm other``; what they had when this is called), ``python workers`` (the
    worker daemon, its workers and what their exited children used), and ``total``."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(path: Path) -> tuple[str, int, int, int] | None:
        try:
            text = path.read_text()
        except OSError:
            return None
        name = text[text.index("(") + 1:text.rindex(")")]
        f = text.rsplit(")", 1)[1].split()
        # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
        return name, int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14])

    procs = {int(d.name): st for d in Path("/proc").iterdir()
             if d.name.isdigit() and (st := stat(d / "stat")) is not None}
    parts = {"driver": 0.0, "jvm jit": 0.0, "jvm gc": 0.0, "jvm other": 0.0,
             "python workers": 0.0}
    todo, seen = [(os.getpid(), "driver")], set()
    while todo:
        pid, part = todo.pop()
        seen.add(pid)
        name, _, own, children = procs[pid]
        if name == "java":  # the JVM: its compiler and GC threads, the rest (exited ones too)
            parts["jvm other"] += own / tick
            for t in Path(f"/proc/{pid}/task").iterdir():
                st = stat(t / "stat")
                if st is not None and ("Compiler" in st[0] or st[0].startswith(("GC", "G1"))):
                    kind = "jvm jit" if "Compiler" in st[0] else "jvm gc"
                    parts[kind] += st[2] / tick
                    parts["jvm other"] -= st[2] / tick
            parts["python workers"] += children / tick  # workers it reaped
        else:
            parts[part] += (own + children) / tick
        for c, (_, ppid, _, _) in procs.items():
            if ppid == pid and c not in seen:
                todo.append((c, "python workers" if name == "java" else part))
    parts["total"] = sum(parts.values())
    return parts


def _child(root: str, ckpt: str, partitions: int) -> None:
    from headrace.pipeline import Pipeline
    from headrace.pipeline.driver import job, static_plan
    from headrace.pipeline.driver.batch import BatchDriver

    # pipeline_scaling's session, with the UI on for its REST API
    spark = ps._spark(partitions, "headrace-restart-profile", **{"spark.ui.enabled": "true"})
    marks: dict[str, float] = {}
    t0, cpu0 = time.time(), _tree_cpu_s()

    def mark(name, fn):
        def wrapped(*a, **kw):
            out = fn(*a, **kw)
            marks.setdefault(name, time.time() - t0)
            return out
        return wrapped

    Pipeline.recover = mark("recovered", Pipeline.recover)
    BatchDriver.range_entries = mark("range_built", BatchDriver.range_entries)
    job.warm_workers = mark("warm_called", job.warm_workers)
    static_plan.build = mark("plan_built", static_plan.build)

    p = ps._build(spark, root, ckpt, partitions)

    def committed(info):
        if "committed" not in marks:
            marks["committed"] = time.time() - t0
            marks["cpu_s"] = {k: v - cpu0[k] for k, v in _tree_cpu_s().items()}

    p.on_batch = committed
    p.run(until_idle=True, max_runs=1)
    print("RESULT " + json.dumps({"marks": marks, "spark": _rest_times(spark, t0)}), flush=True)
    spark.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--keys", type=int, default=250_000)
    a.add_argument("--restarts", type=int, default=4)
    a.add_argument("--partitions", type=int, default=2)
    a.add_argument("--alternate", default=None, metavar="NAME=VALUE")
    args = a.parse_args()
    with scratch_dir("restart_profile") as work:
        inp = ps._inputs(work, args.keys, 100_000, "rec")
        root, ckpt = ps._recovery_dirs(work)
        ps._produce_files(root, input_files(inp)[:3])
        crash = ps._spawn(["crash", root, ckpt, str(args.partitions)])
        if "returncode" not in crash or crash["returncode"] != -9:
            raise SystemExit(f"the crash child was not SIGKILLed: {crash}")
        committed: dict[str, list[float]] = {}
        for i in range(args.restarts):
            env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
            variant = "default"
            if args.alternate and i % 2:
                name, _, value = args.alternate.partition("=")
                env[name], variant = value, args.alternate
            r_root, r_ckpt = work / f"r{i}" / "store", work / f"r{i}" / "ckpt"
            shutil.copytree(root, r_root, symlinks=True)
            shutil.copytree(ckpt, r_ckpt, symlinks=True)
            out = subprocess.run([sys.executable, str(HERE), "--child", str(r_root),
                                  str(r_ckpt), str(args.partitions)], capture_output=True,
                                 text=True, env=env, timeout=900)
            res = next((json.loads(line[7:]) for line in out.stdout.splitlines()
                        if line.startswith("RESULT ")), None)
            if res is None:
                raise SystemExit(f"restart {i} failed: {out.stderr[-2000:]}")
            marks = res["marks"]
            committed.setdefault(variant, []).append(marks["committed"])
            cpu = marks.pop("cpu_s")
            print(f"restart {i} ({variant}): " + ", ".join(f"{k} {v:.2f}" for k, v in
                                               sorted(marks.items(), key=lambda kv: kv[1])))
            print(f"   CPU {cpu['total']:.2f} s ({cpu['total'] / marks['committed']:.2f} cores "
                  "busy): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if k != "total"))
            for line in res["spark"]:
                print("   " + line)
            shutil.rmtree(work / f"r{i}")
        for variant, times in committed.items():
            print(f"restart -> first batch committed, {args.keys:,} keys, {variant}: median "
                  f"{statistics.median(times):.2f} s, all " + ", ".join(f"{c:.2f}" for c in times))


if __name__ == "__main__":
    main()
