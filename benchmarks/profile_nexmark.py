"""Where a Nexmark micro-batch's time goes: q0, q1, q3 (quick sizes) under py-spy, both engines.

For each query, headrace's pipeline and then Spark's fair run (nexmark_spark.py: the same queue
through ``headrace.queue``, Spark's decode, a Parquet sink) run once each at ``--partitions``
while:

- ``py-spy record --idle --threads`` samples the driver (this process) and every Python process
  the JVM starts (the worker daemons with ``--subprocesses``: the task workers, the data source
  planners and the streaming source runner), 50 times a second;
- every request of the driver's store is logged (verb and key, digits folded) per batch;
- the CPU seconds of the driver, the JVM, the task workers and the other Python processes
  per batch (``/proc``): on a shared machine wall times stretch, CPU seconds do not;
- Spark's own account is kept: each trigger's ``durationMs`` phases and, from the REST API
  (the UI is on in this session), each stage's tasks' run, CPU, deserialise, GC, shuffle
  write and fetch-wait times.

It prints, per query and engine: the triggers' phase medians, the stages, the driver's
batch-function time split by what it waits on, the workers' samples split by activity, the
store requests per batch, and the top functions of each process group. ``--out DIR`` keeps the
raw collapsed stacks (flamegraph input) and a JSON of everything. Needs ``py-spy`` (``pip
install py-spy``). The findings, with figures, are in ``benchmarks/PROFILE.md``.

Run: ``python benchmarks/profile_nexmark.py [--queries q0,q1,q3] [--partitions 2]
[--entries columnar|json] [--out /tmp/nexmark-profile]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nexmark as nx  # noqa: E402
from benchlib import scratch_dir  # noqa: E402
from nexmark_spark import fair_views, run_stream  # noqa: E402
from spark_baseline import spark_confs  # noqa: E402

from headrace.nexmark import GeneratorConfig  # noqa: E402
from headrace.nexmark.producer import produce_events  # noqa: E402
from headrace.nexmark.queries import QUERIES  # noqa: E402

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
RATE = 50

# a sample whose innermost frame is one of these waits for something outside the process
IDLE_LEAF = re.compile(r"^(SocketIO\.readinto|socket\.recv\w*|read_int|_read_with_length|"
                       r"Condition\.wait|Event\.wait|Queue\.get|select|poll|"
                       r"BaseSelector\.select|\w*Selector\.select|manager|accept) ")
JVM_WAIT = re.compile(r"^(RecordBatchStreamReader\.__init__|open_stream|"
                      r"ArrowStreamSerializer\.load_stream|.*\.read_next_batch) |"
                      r"py4j/")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", default="q0,q1,q3")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--entries", choices=("columnar", "json"), default="columnar")
    p.add_argument("--events", type=int, default=nx.SIZES["quick"]["events"])
    p.add_argument("--out", default=None, help="keep the collapsed stacks and a JSON here")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- processes

def _children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (the JVM starts its Python workers from many)."""
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def jvm_pid() -> int:
    for c in _children(os.getpid()):
        if "java" in _cmdline(c):
            return c
    raise RuntimeError("no Spark JVM among this process's children")


def _cpu(pid: int, children: bool) -> float | None:
    """CPU seconds of ``pid`` (with its exited, reaped children's if ``children``)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return sum(int(x) for x in f[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")


class Recorder:
    """py-spy on the driver and on every Python process the JVM starts, until ``stop()``."""

    def __init__(self, folder: Path, tag: str):
        self.folder, self.tag = folder, tag
        folder.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, tuple[subprocess.Popen, Path, str]] = {}
        self.jvm = jvm_pid()
        # CPU seconds per process: (role, first seen, last seen); a process started after the
        # recorder counts from 0. Driver and JVM without children (py-spy, Python workers).
        self.cpu: dict[int, list] = {}
        self._sample_cpu(first=True)
        self._spy(os.getpid(), "driver", subprocesses=False)
        self._stop = False
        import threading

        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _spy(self, pid: int, role: str, subprocesses: bool) -> None:
        out = self.folder / f"{self.tag}-{role}-{pid}.txt"
        args = [PY_SPY, "record", "--pid", str(pid), "--rate", str(RATE), "--idle",
                "--threads", "-f", "raw", "-o", str(out)]
        if subprocesses:
            args.append("--subprocesses")
        err = open(out.with_suffix(".err"), "w")  # noqa: SIM115 - py-spy's own complaints
        self.procs[pid] = (subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err),
                           out, role)

    def _sample_cpu(self, first: bool = False) -> None:
        pids = [(os.getpid(), "driver", False), (self.jvm, "jvm", False)]
        for c in _children(self.jvm):
            cmd = _cmdline(c)
            if "python" in cmd:  # a daemon and the workers it forked (exited ones included)
                role = "workers" if "worker_daemon" in cmd else "other_python"
                pids += [(x, role, True) for x in [c, *_children(c)]]
        for pid, role, children in pids:
            v = _cpu(pid, children)
            if v is None:
                continue
            if pid not in self.cpu:
                self.cpu[pid] = [role, v if first else 0.0, v]
            self.cpu[pid][2] = v

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used since the recorder started, per role (sampled every 0.3 s: a
        process that lived less than that is missed)."""
        out = dict.fromkeys(("driver", "jvm", "workers", "other_python"), 0.0)
        for role, a, b in self.cpu.values():
            out[role] += b - a
        return out

    def _watch(self) -> None:
        while not self._stop:
            self._sample_cpu()
            for c in _children(self.jvm):
                if c in self.procs:
                    continue
                cmd = _cmdline(c)
                if "python" not in cmd:
                    continue
                role = ("worker" if "worker_daemon" in cmd or "pyspark.worker" in cmd
                        else "planner")
                time.sleep(0.5)  # a just-started interpreter: py-spy needs its libpython mapped
                self._spy(c, role, subprocesses=True)
            time.sleep(0.3)

    def stop(self) -> dict[str, list[Path]]:
        self._stop = True
        self._thread.join()
        self._sample_cpu()
        files = defaultdict(list)
        for proc, _, _ in self.procs.values():
            proc.send_signal(signal.SIGINT)
        for proc, out, role in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            if out.exists():
                files[role].append(out)
        return files


# ------------------------------------------------------------------------------ analysis

_FRAME = re.compile(r"^(?P<fn>[^ ]+) \((?P<file>[^:)]*)(:\d+)?\)$")


def load_stacks(files: list[Path]) -> Counter:
    """Collapsed stacks (root first, ';'-joined, 'fn (file:line)') -> sample counts."""
    out: Counter = Counter()
    for f in files:
        for line in f.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack and n.isdigit():
                out[stack] += int(n)
    return out


def _frames(stack: str) -> list[tuple[str, str]]:
    frames = []
    for part in stack.split(";"):
        m = _FRAME.match(part.strip())
        if m:
            frames.append((m["fn"], m["file"]))
        else:
            frames.append((part.strip(), ""))
    return frames


def _where(frames: list[tuple[str, str]]) -> tuple[str, str]:
    """(task, doing) of one sample, frames root first. task: the outermost headrace frame —
    what the process runs (a task function, the source's read, the batch function's step);
    doing: the innermost headrace frame, marked "[JVM]" when the frames inside it wait on the
    JVM (an Arrow stream from it, a py4j call), "[import]" when they import a module, "[idle]"
    when they wait on a lock or timer; "idle" when no headrace frame runs."""
    def mine(file: str) -> bool:  # the worker daemon only hosts pyspark's worker loop
        return file.startswith("headrace/") and not file.endswith("worker_daemon.py")

    ours = [f"{fn} ({file.removeprefix('headrace/')})" for fn, file in frames if mine(file)]
    if not ours:
        leaf = next((f"{fn} " for fn, file in reversed(frames) if file), "")
        return "no headrace frame", ("idle" if IDLE_LEAF.match(leaf) else "pyspark/other")
    inner = len(frames) - 1 - next(i for i, (_, file) in enumerate(reversed(frames))
                                   if mine(file))
    below = [f"{fn} {file}" for fn, file in frames[inner + 1:]]
    mark = (" [JVM]" if any(JVM_WAIT.search(f) for f in below) else
            " [import]" if any("importlib" in f for f in below) else
            " [idle]" if IDLE_LEAF.match(below[-1] if below else f"{frames[-1][0]} ") else "")
    return ours[0], ours[-1] + mark


def split_samples(stacks: Counter, within: str | None = None) -> dict:
    """Samples by task and, within each task, by what it was doing (``_where``); ``within``:
    only samples one of whose frames matches it."""
    keep = re.compile(within) if within else None
    tasks: dict[str, Counter] = defaultdict(Counter)
    for stack, n in stacks.items():
        frames = [f for f in _frames(stack) if f[1]]
        if keep and not any(keep.search(f"{fn} {file}") for fn, file in frames):
            continue
        task, doing = _where(frames)
        tasks[task][doing] += n
    return {t: {"samples": sum(c.values()), "doing": dict(c.most_common(12))}
            for t, c in sorted(tasks.items(), key=lambda kv: -sum(kv[1].values()))}


def top_functions(stacks: Counter, n: int = 25) -> list[tuple[str, int]]:
    """Functions by inclusive samples (a sample counts once per function in its stack)."""
    inc: Counter = Counter()
    for stack, c in stacks.items():
        for key in {f"{fn} ({file})" for fn, file in _frames(stack) if file}:
            inc[key] += c
    return inc.most_common(n)


def summarise_samples(files: dict[str, list[Path]]) -> dict:
    out = {}
    driver = load_stacks(files.get("driver", []))
    # the batch function runs on a py4j callback thread, called by pyspark's foreachBatch wrapper
    out["driver_batch_fn"] = split_samples(driver, within=r"^ForeachBatchFunction\.call ")
    for role in ("worker", "planner"):
        st = load_stacks(files.get(role, []))
        out[f"{role}_samples"] = sum(st.values())
        out[f"{role}_by_task"] = split_samples(st)
        out[f"{role}_top"] = top_functions(st)
    return out


# -------------------------------------------------------------------------------- Spark

def rest(spark, path: str):
    base = (spark.sparkContext.uiWebUrl + "/api/v1/applications/"
            + spark.sparkContext.applicationId)
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.loads(r.read())


def stages_since(spark, seen: set[int]) -> list[dict]:
    """Completed stages not in ``seen`` (then added to it), with their task time totals."""
    out = []
    for s in rest(spark, "/stages?status=complete"):
        key = s["stageId"] * 1000 + s["attemptId"]
        if key in seen:
            continue
        seen.add(key)
        out.append({"id": s["stageId"], "name": s["name"][:60], "tasks": s["numTasks"],
                    "run_s": s["executorRunTime"] / 1000,
                    "cpu_s": s["executorCpuTime"] / 1e9,
                    "deserialize_s": s["executorDeserializeTime"] / 1000,
                    "gc_s": s["jvmGcTime"] / 1000,
                    "shuffle_write_s": s.get("shuffleWriteTime", 0) / 1e9,
                    "fetch_wait_s": s.get("shuffleFetchWaitTime", 0) / 1000,
                    "shuffle_write_bytes": s.get("shuffleWriteBytes", 0),
                    "input_bytes": s.get("inputBytes", 0),
                    "output_bytes": s.get("outputBytes", 0)})
    return sorted(out, key=lambda s: s["id"])


def stage_summary(stages: list[dict], batches: int) -> list[dict]:
    """Stages grouped by name: count, and per batch the sums of their task times."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in stages:
        groups[s["name"]].append(s)
    out = []
    for name, ss in groups.items():
        row = {"name": name, "stages": len(ss), "tasks": sum(s["tasks"] for s in ss)}
        for k in ("run_s", "cpu_s", "deserialize_s", "gc_s", "shuffle_write_s",
                  "fetch_wait_s"):
            row[k + "_per_batch"] = round(sum(s[k] for s in ss) / max(batches, 1), 3)
        out.append(row)
    return sorted(out, key=lambda r: -r["run_s_per_batch"])


def phase_medians(durations: list[dict]) -> dict[str, float]:
    keys = sorted({k for d in durations for k in d})
    return {k: statistics.median(d.get(k, 0) for d in durations) / 1000 for k in keys}


# ---------------------------------------------------------------------------- the runs

def _fold(key: str) -> str:
    return re.sub(r"\d+", "N", key)


def log_requests(p) -> list[tuple[str, str]]:
    """Every request of the pipeline's driver store, as (verb, key with digits folded)."""
    log: list[tuple[str, str]] = []
    inner = p.store.inner
    for verb in ("get", "get_range", "put", "list", "head", "delete", "delete_many"):
        fn = getattr(inner, verb, None)
        if fn is None:
            continue

        def wrapped(*a, _fn=fn, _verb=verb, **kw):
            key = a[0] if a else kw.get("key", kw.get("prefix", ""))
            log.append((_verb, _fold(str(key) if not isinstance(key, list) else "[keys]")))
            return _fn(*a, **kw)

        setattr(inner, verb, wrapped)
    return log


def run_headrace(spark, name: str, root: str, ckpt: str, partitions: int) -> dict:
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name=name, partitions=partitions, checkpoint_dir=ckpt,
                 batches_per_trigger=1)
    QUERIES[name].build(p.read_queue(nx.QUEUE, nx.SCHEMAS)).write_shard(f"{name}.out")
    log = log_requests(p)
    marks, batches = [], []

    def on_batch(info: dict) -> None:
        marks.append(len(log))
        batches.append({"seconds": info["seconds"], "input_rows": info.get("input_rows"),
                        "requests": info.get("requests")})

    p.on_batch = on_batch
    t0 = time.perf_counter()
    p.run(until_idle=True)
    wall = time.perf_counter() - t0
    per_batch = []  # the driver's requests between one batch's end and the next's
    for a, b in zip(marks, marks[1:], strict=False):
        per_batch.append(Counter(f"{v} {k}" for v, k in log[a:b]))
    return {"wall_s": wall, "batches": batches,
            "batch_fn_s_median": statistics.median(b["seconds"] for b in batches[1:] or batches),
            "durations_ms": [x["durations_ms"] for x in p.spark_progress],
            "requests_total": len(log), "requests_before_first_batch": marks[0] if marks else 0,
            "requests_per_batch": [sum(c.values()) for c in per_batch],
            "requests_by_key_per_batch": (
                {k: round(v / len(per_batch), 2) for k, v in
                 sum(per_batch, Counter()).most_common()} if per_batch else {})}


def main(argv=None) -> None:
    args = parse(argv)
    nx.RETRIES = 5  # py-spy's pauses slow the Python processes' start further
    if not Path(PY_SPY).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    from headrace.testing.spark import local_spark

    spark = local_spark("headrace-nexmark-profile", master="local[2]",
                        shuffle_partitions=args.partitions,
                        extra={**spark_confs(args.partitions, changelog=True),
                               "spark.driver.memory": "4g", "spark.ui.enabled": "true",
                               "spark.ui.port": "0"})
    splits = spark.sparkContext.defaultParallelism
    sizes = nx.SIZES["quick"]
    cfg = GeneratorConfig(seed=nx.SEED, rate=sizes["rate"])
    report: dict = {"events": args.events, "batch_events": sizes["batch_events"],
                    "partitions": args.partitions, "entries": args.entries}
    with scratch_dir("nexmark-profile") as work:
        out = Path(args.out) if args.out else work / "stacks"
        seed = work / "queue"
        produce_events(str(seed), nx.QUEUE, args.events, config=cfg,
                       batch_events=sizes["batch_events"], entries=args.entries)
        nx.write_parquet(cfg, args.events, sizes["batch_events"], work / "parquet")
        nx.warm_up(spark, work, [args.partitions], args.entries, splits)
        seen: set[int] = set()
        stages_since(spark, seen)  # the warm-up's
        for name in [q.strip() for q in args.queries.split(",") if q.strip()]:
            for engine in ("headrace", "spark_fair"):
                tag = f"{name}-{engine}"
                print(f"-- {tag}", flush=True)
                rec = Recorder(out, tag)
                time.sleep(1.0)  # py-spy attached before the run starts
                def run(name=name, engine=engine, tag=tag):
                    shutil.rmtree(work / tag, ignore_errors=True)
                    root = nx.copy_queue(seed, work / tag / "store")
                    if engine == "headrace":
                        return run_headrace(spark, name, root, str(work / tag / "ckpt"),
                                            args.partitions)
                    return run_stream(spark, name, lambda wm: fair_views(
                        spark, root, args.entries, wm, splits), work / tag / "spark",
                        args.partitions, durable=True)

                retried: list[str] = []
                r = nx.once_more(run, retried, tag)
                r["retried"] = len(retried)
                if engine == "headrace":
                    n_batches = sum(1 for b in r["batches"] if (b["input_rows"] or 0) > 0)
                else:
                    r = {k: v for k, v in r.items() if k not in ("sink", "found")}
                    n_batches = r["batches"]
                files = rec.stop()
                r["cpu_s_per_batch"] = {k: round(v / max(n_batches, 1), 3)
                                        for k, v in rec.cpu_s().items()}
                r["phases_s_median"] = phase_medians(r.pop("durations_ms"))
                r["stages"] = stage_summary(stages_since(spark, seen), n_batches)
                r["samples"] = summarise_samples(files)
                report[tag] = r
                print(json.dumps(r, indent=1, default=str)[:12000], flush=True)
                shutil.rmtree(work / tag, ignore_errors=True)
                if args.out:
                    (out / "profile.json").write_text(json.dumps(report, indent=1,
                                                                 default=str))
    spark.stop()


if __name__ == "__main__":
    main()
