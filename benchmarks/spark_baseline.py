"""Baseline for issue 8: plain Spark Structured Streaming with RocksDBStateStoreProvider.

The workload (``write_input``) is shared with ``pipeline_vs_spark.py``: one Parquet file per
micro-batch of rows ``(key int64 in [0, n_keys), amount int64)``; the first batch(es) touch every
key, so the state holds ~n_keys keys. ``run_spark_rocksdb`` runs ``groupBy(key).agg(count,
sum(amount))`` in update mode into a ``noop`` sink with the RocksDB state store, and measures:

* per micro-batch, exactly: files created under the checkpoint location (``state/`` = state
  PUTs; everything = state + offsets + commits + sources + metadata), their bytes, and Hadoop's
  local ``.crc`` side files separately (they would not exist on S3). The query is fed one input
  file at a time (copied into its source folder, then ``processAllAvailable()``), and the
  checkpoint folder is listed before and after each batch, so every new file belongs to that batch;
* batch duration from the query progress (``durationMs.triggerExecution``) and steady-state
  throughput (input rows / summed batch durations, first batch excluded);
* recovery after ``kill -9``: a child process runs the same query on the same checkpoint with one
  more input file and is SIGKILLed as soon as the first state file of that batch appears (mid
  state commit); a new child process restarts from the checkpoint. ``recovery_s`` = time from the
  restarted process's SparkSession being ready to the end of its first completed micro-batch (from
  the progress timestamp + duration): query start + state reload + re-running the batch. JVM /
  SparkSession start-up is measured separately (``recovery_session_s``, the cold-start baseline
  any PySpark process pays), as is the same first batch on an empty checkpoint in a fresh process
  (``recovery_cold_query_s``: same work without state to reload).

Run: ``python benchmarks/spark_baseline.py [--quick]`` -> ``benchmarks/results/spark_baseline.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
SCHEMA = "key LONG, amount LONG"


# ---------------------------------------------------------------------------------------- input

def write_input(input_dir, n_batches: int, rows_per_batch: int, n_keys: int, seed: int,
                first_rows: int | None = None) -> None:
    """Write ``n_batches`` Parquet files ``batch-00000.parquet``... (one per micro-batch).

    Batch 0 has ``first_rows`` rows (default ``rows_per_batch``), the others ``rows_per_batch``.
    Row ``g`` (global index) has key ``perm[g]`` while ``g < n_keys`` (a seeded permutation, so the
    first batch(es) touch every key once: with ``first_rows=n_keys`` batch 0 alone does), then
    uniform random keys; ``amount`` is uniform in [1, 1000]. Deterministic from the arguments.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    first_rows = rows_per_batch if first_rows is None else first_rows
    for name, v in (("n_batches", n_batches), ("rows_per_batch", rows_per_batch),
                    ("n_keys", n_keys), ("first_rows", first_rows)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    out = Path(input_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_keys).astype(np.int64)
    start = 0
    for b in range(n_batches):
        n = first_rows if b == 0 else rows_per_batch
        g = np.arange(start, start + n, dtype=np.int64)
        start += n
        cover = g < n_keys
        keys = np.empty(n, dtype=np.int64)
        keys[cover] = perm[g[cover]]
        keys[~cover] = rng.integers(0, n_keys, int((~cover).sum()), dtype=np.int64)
        amount = rng.integers(1, 1001, n, dtype=np.int64)
        table = pa.table({"key": keys, "amount": amount})
        tmp = out / f".batch-{b:05d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, out / f"batch-{b:05d}.parquet")


def input_files(input_dir) -> list[Path]:
    """The micro-batch files of ``input_dir`` in batch order."""
    return sorted(Path(input_dir).glob("batch-*.parquet"))


# ------------------------------------------------------------------------------ query + counting

def spark_confs(partitions: int, changelog: bool) -> dict[str, str]:
    return {
        "spark.sql.streaming.stateStore.providerClass": PROVIDER,
        CHANGELOG_CONF: "true" if changelog else "false",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.adaptive.enabled": "false",
    }


def _start_query(spark, src: Path, ckpt: Path, name: str, max_files_per_trigger: int = 1):
    from pyspark.sql import functions as F

    df = (spark.readStream.schema(SCHEMA)
          .option("maxFilesPerTrigger", max_files_per_trigger).parquet(str(src)))
    agg = df.groupBy("key").agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"))
    return (agg.writeStream.format("noop").outputMode("update").queryName(name)
            .option("checkpointLocation", str(ckpt)).start())


def _stage(file: Path, src: Path, name: str) -> None:
    """Copy an input file into the query's source folder atomically (hidden name, then rename)."""
    src.mkdir(parents=True, exist_ok=True)
    tmp = src / f".{name}.tmp"
    shutil.copyfile(file, tmp)
    os.replace(tmp, src / name)


def _snapshot(root: Path) -> dict[str, int]:
    """relative path -> size of every file under root."""
    out: dict[str, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                out[os.path.relpath(p, root)] = os.stat(p).st_size
            except FileNotFoundError:
                pass
    return out


def _kind(rel: str) -> str:
    base = os.path.basename(rel)
    if base.endswith(".crc"):
        return "crc"
    if base.endswith(".tmp") or ".tmp" in base:
        return "tmp"
    return "data"


def _is_version_file(rel: str) -> bool:
    """A state store version file of one partition: state/<op>/<partition>/<v>.changelog|zip|sst."""
    parts = rel.split(os.sep)
    return (len(parts) >= 4 and parts[0] == "state" and parts[2].isdigit()
            and _kind(rel) == "data" and parts[-1].endswith((".changelog", ".zip", ".sst")))


def _ext(rel: str) -> str:
    base = os.path.basename(rel)
    top = rel.split(os.sep, 1)[0]
    return base.rsplit(".", 1)[1] if "." in base else f"{top}/N"


def _diff(before: dict[str, int], after: dict[str, int]) -> dict:
    new = {k: v for k, v in after.items() if k not in before}
    data = {k: v for k, v in new.items() if _kind(k) == "data"}
    state = {k: v for k, v in data.items() if k.startswith("state" + os.sep)}
    return {
        "state_files": len(state),
        "state_bytes": sum(state.values()),
        "checkpoint_files": len(data),
        "checkpoint_bytes": sum(data.values()),
        "crc_files": sum(1 for k in new if _kind(k) == "crc"),
        "tmp_files": sum(1 for k in new if _kind(k) == "tmp"),
        "by_ext": dict(Counter(_ext(k) for k in data)),
    }


def _progress_end(p: dict) -> float:
    """Wall-clock end of a progress event: trigger start timestamp + triggerExecution."""
    ts = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return ts + p["durationMs"]["triggerExecution"] / 1000.0


def _data_progress(query, batch_id: int | None = None) -> dict | None:
    for p in reversed(query.recentProgress):
        p = p if isinstance(p, dict) else json.loads(p.json)
        if p.get("numInputRows", 0) > 0 and (batch_id is None or p["batchId"] == batch_id):
            return p
    return None


# ------------------------------------------------------------------------------ child processes

def _child_main(cfg: dict) -> None:
    """Child process: start a session and the query on cfg's checkpoint; report timings.

    mode "crash": run until killed by the parent. mode "first": write the timing of the first
    completed micro-batch to cfg["result"], then stop.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from headrace.testing.spark import local_spark

    extra = spark_confs(cfg["partitions"], cfg["changelog"])
    extra.update(cfg.get("extra", {}))
    spark = local_spark("spark-baseline-child", master=cfg["master"],
                        shuffle_partitions=cfg["partitions"], extra=extra)
    t_session = time.time()
    q = _start_query(spark, Path(cfg["src"]), Path(cfg["ckpt"]), "baseline_child",
                     cfg["max_files_per_trigger"])
    t_started = time.time()
    deadline = time.time() + cfg.get("timeout_s", 600)
    p = None
    while p is None:
        if time.time() > deadline:
            raise TimeoutError("no micro-batch completed in the child")
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        p = _data_progress(q)
        if p is None:
            time.sleep(0.005)
    if cfg["mode"] == "crash":  # the parent kills us before this; keep the query running anyway
        q.awaitTermination()
        return
    result = {"t_session": t_session, "t_started": t_started, "t_first_end": _progress_end(p),
              "t_seen": time.time(), "batch_id": p["batchId"], "rows": p["numInputRows"],
              "trigger_s": p["durationMs"]["triggerExecution"] / 1000.0,
              "state_rows_total": sum(o.get("numRowsTotal", 0)
                                      for o in p.get("stateOperators", []))}
    tmp = cfg["result"] + ".tmp"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, cfg["result"])
    q.stop()
    spark.stop()


def _spawn(cfg: dict, log: Path) -> tuple[subprocess.Popen, float]:
    t_spawn = time.time()
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child",
                                 json.dumps(cfg)], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, t_spawn


def _run_first_batch_child(cfg: dict, log: Path, timeout_s: float) -> dict:
    res_path = Path(cfg["result"])
    res_path.unlink(missing_ok=True)
    proc, t_spawn = _spawn(cfg, log)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise TimeoutError(f"child did not finish in {timeout_s} s; see {log}") from None
    if not res_path.exists():
        raise RuntimeError(f"child exited with {rc} and no result; see {log}")
    r = json.loads(res_path.read_text())
    r["t_spawn"] = t_spawn
    return r


# ----------------------------------------------------------------------------------- the runner

def run_spark_rocksdb(spark, input_dir, work_dir, partitions: int = 200, changelog: bool = True,
                      max_files_per_trigger: int = 1, recovery: bool = True,
                      child_timeout_s: float = 600.0, cold_reference: bool = True) -> dict:
    """Run the baseline query over ``input_files(input_dir)`` (one file = one micro-batch).

    Returns a flat dict: state_files_per_batch, checkpoint_files_per_batch, bytes_per_batch,
    state_bytes_per_batch, crc_files_per_batch, batch_s_p50, rows_per_s, recovery_s (and the
    recovery_* components), state_rows_total, partitions, changelog (1/0), plus first-batch
    figures. Per-batch figures are medians over the steady-state batches (all but the first).
    ``work_dir`` must not hold a previous run. The SQL confs are set on ``spark`` for the query's
    start and restored afterwards; children get the same confs and master.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if max_files_per_trigger != 1:
        raise ValueError("max_files_per_trigger must be 1: one input file = one micro-batch")
    files = input_files(input_dir)
    if not files:
        raise ValueError(f"input_dir has no batch-*.parquet files: {input_dir}")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    src, ckpt = work / "src", work / "checkpoint"
    if ckpt.exists():
        raise ValueError(f"work_dir already has a checkpoint: {ckpt}")
    src.mkdir(parents=True, exist_ok=True)

    confs = spark_confs(partitions, changelog)
    saved = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    batches = []
    try:
        q = _start_query(spark, src, ckpt, f"baseline_{'cl' if changelog else 'nocl'}_{os.getpid()}",
                         max_files_per_trigger)
        try:
            before = _snapshot(ckpt)
            for i, f in enumerate(files):
                _stage(f, src, f"b{i:05d}.parquet")
                q.processAllAvailable()
                p = _data_progress(q, i)
                if p is None:
                    raise RuntimeError(f"no progress for micro-batch {i}")
                after = _snapshot(ckpt)
                d = _diff(before, after)
                before = after
                d.update(batch_id=i, rows=p["numInputRows"],
                         batch_s=p["durationMs"]["triggerExecution"] / 1000.0,
                         state_rows_total=sum(o.get("numRowsTotal", 0)
                                              for o in p.get("stateOperators", [])))
                batches.append(d)
        finally:
            q.stop()
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)

    steady = batches[1:] or batches

    def med(key):
        return statistics.median(b[key] for b in steady)

    res = {
        "partitions": partitions,
        "changelog": int(changelog),
        "batches": len(batches),
        "rows_per_batch": batches[-1]["rows"],
        "state_rows_total": batches[-1]["state_rows_total"],
        "state_files_per_batch": med("state_files"),
        "checkpoint_files_per_batch": med("checkpoint_files"),
        "bytes_per_batch": med("checkpoint_bytes"),
        "state_bytes_per_batch": med("state_bytes"),
        "crc_files_per_batch": med("crc_files"),
        "batch_s_p50": med("batch_s"),
        "rows_per_s": sum(b["rows"] for b in steady) / sum(b["batch_s"] for b in steady),
        "first_batch_state_files": batches[0]["state_files"],
        "first_batch_checkpoint_files": batches[0]["checkpoint_files"],
        "first_batch_s": batches[0]["batch_s"],
        "state_files_total": sum(b["state_files"] for b in batches),
        "checkpoint_files_total": sum(b["checkpoint_files"] for b in batches),
    }
    for ext, n in Counter(e for b in steady for e, c in b["by_ext"].items()
                          for _ in range(c)).items():
        res[f"files_per_batch_{ext.replace('/N', '').replace('/', '_')}"] = n / len(steady)
    res["_batches"] = batches  # detail for callers; dropped by the report

    if recovery:
        res.update(_measure_recovery(spark, files, work, src, ckpt, partitions, changelog,
                                     max_files_per_trigger, len(batches), child_timeout_s,
                                     cold_reference))
    return res


def _measure_recovery(spark, files, work, src, ckpt, partitions, changelog, mftr, n_done,
                      timeout_s, cold_reference: bool = True) -> dict:
    conf = spark.sparkContext.getConf()
    extra = {}
    for k in ("spark.driver.memory", "spark.ui.showConsoleProgress"):
        if conf.contains(k):
            extra[k] = conf.get(k)
    base = {"partitions": partitions, "changelog": changelog, "master": spark.sparkContext.master,
            "max_files_per_trigger": mftr, "extra": extra, "timeout_s": timeout_s}
    log = work / "children.log"

    # 1. crash: one more batch (a copy of the last input file), SIGKILL mid state commit
    _stage(files[-1], src, "r00000.parquet")
    pre = _snapshot(ckpt)
    cfg = dict(base, mode="crash", src=str(src), ckpt=str(ckpt), result=str(work / "crash.json"))
    proc, _ = _spawn(cfg, log)
    deadline = time.time() + timeout_s
    killed_at = None
    while killed_at is None:
        if proc.poll() is not None:
            raise RuntimeError(f"crash child exited early ({proc.returncode}); see {log}")
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise TimeoutError(f"crash child wrote no state in {timeout_s} s; see {log}")
        new = [k for k in _snapshot(ckpt) if k not in pre and _kind(k) == "data"]
        new_state = [k for k in new if _is_version_file(k)]
        if new_state or os.path.exists(ckpt / "commits" / str(n_done)):
            os.killpg(proc.pid, signal.SIGKILL)  # the child JVM is in the same process group
            proc.wait()
            killed_at = {"new_state_files": len(new_state), "new_files": sorted(new)}
        else:
            time.sleep(0.01)
    after_kill = {k for k, _ in _snapshot(ckpt).items() if k not in pre and _kind(k) == "data"}
    committed = os.path.exists(ckpt / "commits" / str(n_done))
    if committed:  # killed too late for batch n_done: give the restart another batch to run
        _stage(files[-1], src, "r00001.parquet")

    # 2. restart on the same checkpoint in a new process: time to first completed micro-batch
    cfg = dict(base, mode="first", src=str(src), ckpt=str(ckpt), result=str(work / "recover.json"))
    r = _run_first_batch_child(cfg, log, timeout_s)

    out = {
        "recovery_s": r["t_first_end"] - r["t_session"],
        "recovery_total_s": r["t_first_end"] - r["t_spawn"],
        "recovery_session_s": r["t_session"] - r["t_spawn"],
        "recovery_batch_s": r["trigger_s"],
        "recovery_batch_id": r["batch_id"],
        "recovery_state_rows_total": r["state_rows_total"],
        "kill_new_state_files": killed_at["new_state_files"],
        "kill_new_checkpoint_files": len(after_kill),
        "kill_after_commit": int(committed),
        "_kill_new_files": killed_at["new_files"],
    }
    if cold_reference:  # 3. the same batch on an empty checkpoint, in a new process
        cold_src, cold_ckpt = work / "cold_src", work / "cold_checkpoint"
        _stage(files[-1], cold_src, "r00000.parquet")
        cfg = dict(base, mode="first", src=str(cold_src), ckpt=str(cold_ckpt),
                   result=str(work / "cold.json"))
        c = _run_first_batch_child(cfg, log, timeout_s)
        out.update({"recovery_cold_query_s": c["t_first_end"] - c["t_session"],
                    "recovery_cold_session_s": c["t_session"] - c["t_spawn"],
                    "recovery_minus_cold_s": (r["t_first_end"] - r["t_session"])
                    - (c["t_first_end"] - c["t_session"])})
    return out


# ------------------------------------------------------------------------------------------ main

def main(argv=None) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib import parse_args, report, scratch_dir

    from headrace.testing.spark import local_spark

    args = parse_args("Spark Structured Streaming + RocksDBStateStoreProvider baseline (issue 8)",
                      argv)
    # batch 0 touches every key once (state = n_keys keys), later batches update random keys
    if args.quick:
        n_keys, rows, n_batches = 20_000, 20_000, 3
    else:
        n_keys, rows, n_batches = 1_000_000, 100_000, 5
    partitions = 200
    figures: dict = {"n_keys": n_keys, "first_batch_rows_input": n_keys,
                     "rows_per_batch_input": rows, "n_batches": n_batches}
    counts: dict = {}
    with scratch_dir("spark-baseline") as d:
        write_input(d / "input", n_batches, rows, n_keys, seed=8, first_rows=n_keys)
        spark = local_spark("spark-baseline", master="local[2]", shuffle_partitions=partitions,
                            extra={"spark.driver.memory": "3g",
                                   "spark.ui.showConsoleProgress": "false"})
        try:
            for changelog in (True, False):
                tag = "changelog_on" if changelog else "changelog_off"
                t0 = time.perf_counter()
                r = run_spark_rocksdb(spark, d / "input", d / tag, partitions=partitions,
                                      changelog=changelog)
                r["wall_s"] = time.perf_counter() - t0
                for b in r.pop("_batches"):
                    print(f"  [{tag}] batch {b['batch_id']}: rows={b['rows']} "
                          f"batch_s={b['batch_s']:.2f} state_files={b['state_files']} "
                          f"checkpoint_files={b['checkpoint_files']} "
                          f"bytes={b['checkpoint_bytes']} crc={b['crc_files']} "
                          f"tmp={b['tmp_files']} by_ext={b['by_ext']}", flush=True)
                kill_files = r.pop("_kill_new_files", [])
                print(f"  [{tag}] crash child killed after it wrote {len(kill_files)} checkpoint "
                      f"files: {kill_files[:6]}{' ...' if len(kill_files) > 6 else ''}",
                      flush=True)
                for k, v in r.items():
                    figures[f"{k}_{tag}"] = v
                counts[f"puts_state_{tag}"] = r["state_files_total"]
                counts[f"puts_checkpoint_{tag}"] = r["checkpoint_files_total"]
        finally:
            spark.stop()
    return report("spark_baseline", figures, args, counts)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child_main(json.loads(sys.argv[2]))
    else:
        main()
