"""Issue 14: Nexmark q0–q8 in headrace vs Spark Structured Streaming (RocksDB), same events.

Input: ``headrace.nexmark``'s generator (seed 14) writes N events into a headrace queue, one
queue batch per ``batch_events`` events, and the same events (a second pass of the
deterministic generator) as Parquet files, one file per kind and batch, for Spark.

Per query (``headrace.nexmark.queries``; the ones not expressible are in NOT_EXPRESSIBLE):

(A) headrace: a Pipeline over a copy of the queue (a pipeline consumes its queue), one queue
    batch per micro-batch, the query's Frame written to an output shard in update mode.
    ``qN_events_per_s_headrace`` = N / wall time of ``run(until_idle=True)`` (minus the
    benchmark's own probes). After each batch the pipeline's state stream (``qN.state/``) is
    listed and its latest checkpoint read: ``qN_state_puts_per_batch`` = new state objects per
    batch (mean over all batches but the first); ``qN_state_bytes_max`` = the largest live
    state (bytes of the pages the checkpoint references); ``_mid``/``_end`` = live state after
    the middle and the last batch (windowed queries: end <= 2x mid);
    ``qN_state_stored_bytes_end`` = all bytes under the state prefix at the end (superseded
    pages that older checkpoints still hold included).
(B) Spark Structured Streaming, RocksDBStateStoreProvider (changelog checkpointing on): the
    query's SQL over streaming views of the Parquet folders (``maxFilesPerTrigger`` 1, so one
    file per kind per micro-batch, a 10 s watermark on ``dateTime``), into a ``noop`` sink
    with ``trigger(availableNow)``, output mode append, else update. Where Spark refuses the
    query (its unsupported-operation checks), ``qN_spark_streaming_supported`` is 0, there is
    no ``qN_events_per_s_spark``, and the reason is printed. Spark gets its best
    configuration: the query runs again at each ``--spark-partitions`` count (2, 4, 8; fresh
    checkpoints) and the fastest wall time is ``qN_events_per_s_spark`` (``qN_spark_best_p``;
    the first run at ``--partitions`` is ``qN_events_per_s_spark_p{N}_first_run``).
(C) the oracle: the same SQL as Spark *batch* over all the Parquet files; headrace's final
    shard must equal it as a multiset of rows (``qN_equal_to_spark_batch``,
    ``headrace.nexmark.compare``). ``queries_equal_to_spark_batch`` counts the equal queries of
    q0–q8 (target 9).

Warm-up: before the measured queries, both engines run q0 and q3 over a small separate event set
(20k events) in the same JVM and Python workers, so neither pays the JVM's code generation and
JIT, or the Python workers' start, inside a measured query (without it the first headrace query
measured a cold JVM while Spark's best-of-3 ran warm). ``qN_events_per_s_headrace_steady`` and
``qN_events_per_s_spark_steady`` are per-batch rates: events per batch / the median micro-batch
time after the first batch (Spark: ``triggerExecution`` of its progress reports).

Sizes: quick (``--quick``): 200k events at 1,000 events/s of event time (200 s: 20 tumbling
windows), 4 batches of 50k. Full: 10M events at 10,000 events/s (1,000 s), 40 batches of 250k.
Run: ``python benchmarks/nexmark.py [--quick] [--queries core|all|q0,q5]`` (default: q0–q8;
``all`` adds q14–q17 and q20–q22). The full mode takes hours on 2 cores; ``--merge`` runs it in
parts: the queries run replace theirs in the mode's results file and keep the others' figures
(only when that file ran the same events, rate and batch size; ``queries_run`` lists what it
holds, request counts are summed per query).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS, report, scratch_dir  # noqa: E402
from spark_baseline import spark_confs  # noqa: E402

from headrace.nexmark import KINDS, SCHEMAS, Generator, GeneratorConfig  # noqa: E402
from headrace.nexmark.compare import results_equal  # noqa: E402
from headrace.nexmark.producer import produce_events  # noqa: E402
from headrace.nexmark.queries import (  # noqa: E402
    CORE,
    NOT_EXPRESSIBLE,
    QUERIES,
    WATERMARK_DELAY,
)

QUEUE = "nexmark"
SEED = 14
SIZES = {"quick": dict(events=200_000, rate=1_000, batch_events=50_000),
         "full": dict(events=10_000_000, rate=10_000, batch_events=250_000)}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="200k events (< 10 minutes)")
    p.add_argument("--url", default=None, help="object store URL (default: a temp folder)")
    p.add_argument("--queries", default="core",
                   help="comma-separated (e.g. q0,q5), 'core' (q0-q8) or 'all' (q14-q22 too)")
    p.add_argument("--events", type=int, default=None, help="override the mode's event count")
    p.add_argument("--partitions", type=int, default=2,
                   help="headrace tasks per stage (its default: one per core of local[2]) and "
                        "the shuffle partitions of Spark's first run")
    p.add_argument("--spark-partitions", default="2,4,8",
                   help="shuffle partitions tried for Spark streaming; the fastest is reported")
    p.add_argument("--no-spark-streaming", action="store_true",
                   help="skip (B); the batch oracle still runs")
    p.add_argument("--merge", action="store_true",
                   help="keep the other queries' figures of the mode's results file (same "
                        "events, rate and batch size): a full run done in parts")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------ input

def write_parquet(cfg: GeneratorConfig, events: int, batch_events: int, folder: Path) -> None:
    """The same events as the queue, one Parquet file per kind and batch."""
    import pyarrow.parquet as pq

    for kind in KINDS:
        (folder / kind).mkdir(parents=True, exist_ok=True)
    for i, batch in enumerate(Generator(cfg).batches(events, batch_events)):
        for kind in KINDS:
            pq.write_table(batch.tables[kind], folder / kind / f"batch-{i:05d}.parquet")


def copy_queue(seed_root: Path, root: Path) -> None:
    shutil.copytree(seed_root, root, ignore=shutil.ignore_patterns(".hr*"))


# --------------------------------------------------------------------------------- headrace

def _state_objects(p, name: str) -> dict[str, int]:
    return {m.key: m.size for m in p.store.list(f"{name}.state/")}


def _live_state_bytes(p, name: str) -> int:
    """Bytes of the pages the state's latest checkpoint references (superseded pages that
    older checkpoints still hold are not state)."""
    from headrace.reservoir.verify import inspect_stream

    return inspect_stream(p.store, f"{name}.state")["page_bytes"]


def warm_up(spark, work: Path, partitions: int) -> None:
    """q0 and q3 over 20k events in both engines (see the module docstring)."""
    cfg = GeneratorConfig(seed=SEED + 1, rate=1_000)
    root, parquet = work / "warm" / "queue", work / "warm" / "parquet"
    produce_events(str(root), QUEUE, 20_000, config=cfg, batch_events=10_000)
    write_parquet(cfg, 20_000, 10_000, parquet)
    t0 = time.perf_counter()
    for name in ("q0", "q3"):
        copy_queue(root, work / "warm" / name / "store")
        run_headrace(spark, name, str(work / "warm" / name / "store"),
                     str(work / "warm" / name / "ckpt"), partitions)
        run_spark_streaming(spark, name, parquet, work / "warm" / name / "spark")
        run_spark_batch(spark, name, parquet)
    shutil.rmtree(work / "warm", ignore_errors=True)
    print(f"-- warm-up (q0, q3 over 20k events, both engines): "
          f"{time.perf_counter() - t0:.1f} s", flush=True)


def run_headrace(spark, name: str, root: str, ckpt: str, partitions: int) -> dict:
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name=name, partitions=partitions, checkpoint_dir=ckpt,
                 batches_per_trigger=1)
    out = QUERIES[name].build(p.read_queue(QUEUE, SCHEMAS))
    out.write_shard(f"{name}.out")
    per_batch: list[dict] = []
    seen = {"objs": _state_objects(p, name)}

    def on_batch(info: dict) -> None:
        t = time.perf_counter()
        objs = _state_objects(p, name)
        per_batch.append({"seconds": info["seconds"],
                          "new_objects": sum(1 for k in objs if k not in seen["objs"]),
                          "stored": sum(objs.values()), "live": _live_state_bytes(p, name)})
        seen["objs"] = objs
        per_batch[-1]["probe_s"] = time.perf_counter() - t

    p.on_batch = on_batch
    t0 = time.perf_counter()
    p.run(until_idle=True)
    wall = time.perf_counter() - t0
    # listing and inspecting the state after each batch is the benchmark's, not the query's
    wall -= sum(b.get("probe_s", 0.0) for b in per_batch)
    result = p.read_shard(f"{name}.out")
    steady = per_batch[1:] or per_batch
    # Spark's triggerExecution of each batch with input, as Spark's own figure is measured
    # (a no-data batch that expires windows runs inside the trigger before it)
    triggers = [x["trigger_s"] for x in p.spark_progress if x["input_rows"] > 0]
    live = [b["live"] for b in per_batch]
    return {"wall_s": wall, "batches": len(per_batch), "result": result,
            "state_puts_per_batch": statistics.mean(b["new_objects"] for b in steady),
            "state_bytes_max": max(live), "state_bytes_mid": live[(len(live) - 1) // 2],
            "state_bytes_end": live[-1], "state_stored_bytes_end": per_batch[-1]["stored"],
            "batch_s_p50": statistics.median(b["seconds"] for b in per_batch),
            "steady_batch_s": statistics.median(triggers[1:] or triggers),
            "steady_batch_s_in_batch_function": statistics.median(b["seconds"] for b in steady),
            "late_rows": int(p.metrics.get("late_rows", 0)),
            "driver_requests": p.store.counts()["requests"],
            "task_requests": int(p.metrics.get("task_requests", 0))}


# ------------------------------------------------------------------------------------ Spark

def batch_views(spark, folder: Path) -> None:
    for kind in KINDS:
        spark.read.schema(SCHEMAS[kind]).parquet(str(folder / kind)).createOrReplaceTempView(kind)


def run_spark_batch(spark, name: str, folder: Path):
    batch_views(spark, folder)
    return spark.sql(QUERIES[name].sql).toArrow()


def _stream_views(spark, folder: Path, watermark: bool) -> None:
    for kind in KINDS:
        df = (spark.readStream.schema(SCHEMAS[kind]).option("maxFilesPerTrigger", 1)
              .parquet(str(folder / kind)))
        if watermark:
            df = df.withWatermark("dateTime", WATERMARK_DELAY)
        df.createOrReplaceTempView(kind)


def run_spark_streaming(spark, name: str, folder: Path, work: Path) -> dict:
    """Time the query as a stream (with a watermark on the sources, else without; output mode
    append, else update), or say why Spark refuses every combination."""
    import logging

    from pyspark.errors import AnalysisException, StreamingQueryException

    # PySpark logs each refusal with its JVM stack before raising it; the refusal is reported
    # below (the ``note``), so keep the stack out of the benchmark's output
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    refusals = []
    for watermark in (True, False):
        _stream_views(spark, folder, watermark)
        for mode in ("append", "update"):
            attempt = f"{mode}{'' if watermark else ', no watermark'}"
            try:
                df = spark.sql(QUERIES[name].sql)
                t0 = time.perf_counter()
                q = (df.writeStream.format("noop").outputMode(mode)
                     .option("checkpointLocation", str(work / f"ckpt-{mode}-{watermark}"))
                     .trigger(availableNow=True).start())
                q.awaitTermination()
            except (AnalysisException, StreamingQueryException) as e:
                refusals.append(f"{attempt}: {' '.join(str(e).split())[:300]}")
                continue
            wall = time.perf_counter() - t0
            progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
            state = max((sum(o.get("memoryUsedBytes", 0) for o in p.get("stateOperators", []))
                         for p in progress), default=0)
            steady = [p["durationMs"]["triggerExecution"] / 1000 for p in progress[1:]
                      or progress]
            return {"ok": True, "mode": mode, "watermark": watermark, "wall_s": wall,
                    "steady_batch_s": statistics.median(steady) if steady else None,
                    "batches": len(progress), "state_memory_bytes_max": state, "df": df}
    return {"ok": False, "reason": " | ".join(refusals)}


def spark_best_p(spark, run: dict, work: Path, candidates: list[int]) -> dict:
    """Spark's best configuration: the query (as ``run_spark_streaming`` found it runs) again at
    each shuffle-partition count, fresh checkpoints; the fastest wall time wins."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    walls = {}
    try:
        for p in candidates:
            spark.conf.set("spark.sql.shuffle.partitions", str(p))
            t0 = time.perf_counter()
            q = (run["df"].writeStream.format("noop").outputMode(run["mode"])
                 .option("checkpointLocation", str(work / f"ckpt-p{p}"))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            walls[p] = time.perf_counter() - t0
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    best = min(walls, key=walls.get)
    return {"best_p": best, "wall_s": walls[best], "walls": walls}


# ------------------------------------------------------------------------------------- main

def merged(figures: dict, quick: bool) -> dict:
    """``figures`` over the figures of the mode's results file, when that file ran the same
    input (events, rate, batch size): the full mode's hours of queries can run in parts."""
    path = RESULTS / "quick" / "nexmark.json" if quick else RESULTS / "nexmark.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    same = all(old.get(k) == figures[k] for k in ("events", "rate", "batch_events"))
    if not same:
        print(f"  --merge: {path} ran other input; not merged", flush=True)
        return figures
    keep = {k: v for k, v in old.items() if k != "quick" and not k.startswith("store_")}
    return {**keep, **figures}


def main(argv=None) -> None:
    args = parse(argv)
    sizes = dict(SIZES["quick" if args.quick else "full"])
    if args.events:
        sizes["events"] = args.events
    names = ([q for q in CORE if q in QUERIES] if args.queries == "core" else list(QUERIES)
             if args.queries == "all" else [q.strip() for q in args.queries.split(",")
                                            if q.strip()])
    unknown = [q for q in names if q not in QUERIES]
    if unknown:
        raise SystemExit(f"unknown or inexpressible queries {unknown}; known: {list(QUERIES)}, "
                         f"not expressible: {list(NOT_EXPRESSIBLE)}")
    from headrace.testing.spark import local_spark

    spark = local_spark("headrace-nexmark", master="local[2]",
                        shuffle_partitions=args.partitions,
                        extra={**spark_confs(args.partitions, changelog=True),
                               "spark.driver.memory": "4g"})
    cfg = GeneratorConfig(seed=SEED, rate=sizes["rate"])
    spark_ps = [int(x) for x in args.spark_partitions.split(",") if x.strip()]
    figures: dict = {"events": sizes["events"], "rate": sizes["rate"],
                     "batch_events": sizes["batch_events"], "partitions": args.partitions}
    notes: dict[str, str] = dict(NOT_EXPRESSIBLE)
    with scratch_dir("nexmark") as work:
        seed_root = work / "queue"
        t0 = time.perf_counter()
        produced = produce_events(str(seed_root), QUEUE, sizes["events"], config=cfg,
                                  batch_events=sizes["batch_events"])
        figures["produce_events_per_s"] = produced.events / (time.perf_counter() - t0)
        write_parquet(cfg, sizes["events"], sizes["batch_events"], work / "parquet")
        warm_up(spark, work, args.partitions)
        for name in names:
            print(f"-- {name}", flush=True)
            qwork = work / name
            if args.url:
                root = f"{args.url.rstrip('/')}/nexmark-{name}-{int(time.time())}"
                produce_events(root, QUEUE, sizes["events"], config=cfg,
                               batch_events=sizes["batch_events"])
            else:
                copy_queue(seed_root, qwork / "store")
                root = str(qwork / "store")
            try:
                h = run_headrace(spark, name, root, str(qwork / "ckpt"), args.partitions)
            except Exception as e:  # noqa: BLE001 - one query failing must not hide the others
                traceback.print_exc()
                notes[name] = f"headrace failed: {type(e).__name__}: {str(e).splitlines()[0]}"
                figures[f"{name}_equal_to_spark_batch"] = 0
                continue
            expected = run_spark_batch(spark, name, work / "parquet")
            equal, why = results_equal(h["result"], expected)
            print(f"   headrace vs Spark batch: {why}", flush=True)
            if not equal:
                notes[name] = f"differs from Spark batch: {why}"
            figures.update({
                f"{name}_equal_to_spark_batch": int(equal),
                f"{name}_rows": expected.num_rows,
                f"{name}_events_per_s_headrace": sizes["events"] / h["wall_s"],
                f"{name}_batches_headrace": h["batches"],
                f"{name}_batch_s_p50_headrace": h["batch_s_p50"],
                f"{name}_events_per_s_headrace_steady": sizes["batch_events"] / h["steady_batch_s"],
                f"{name}_state_puts_per_batch": h["state_puts_per_batch"],
                f"{name}_state_bytes_max": h["state_bytes_max"],
                f"{name}_state_bytes_mid": h["state_bytes_mid"],
                f"{name}_state_bytes_end": h["state_bytes_end"],
                f"{name}_state_stored_bytes_end": h["state_stored_bytes_end"],
                f"{name}_late_rows": h["late_rows"],
            })
            figures[f"{name}_driver_requests"] = h["driver_requests"]
            figures[f"{name}_task_requests"] = h["task_requests"]
            if QUERIES[name].windowed:
                figures[f"{name}_state_end_over_mid"] = (h["state_bytes_end"]
                                                         / max(h["state_bytes_mid"], 1))
            if args.no_spark_streaming:
                continue
            s = run_spark_streaming(spark, name, work / "parquet", qwork / "spark")
            figures[f"{name}_spark_streaming_supported"] = int(s["ok"])
            if s["ok"]:
                best = spark_best_p(spark, s, qwork / "spark-p", spark_ps)
                figures[f"{name}_spark_best_p"] = best["best_p"]
                figures[f"{name}_events_per_s_spark"] = sizes["events"] / min(
                    s["wall_s"], best["wall_s"])
                figures[f"{name}_events_per_s_spark_p{args.partitions}_first_run"] = (
                    sizes["events"] / s["wall_s"])
                figures[f"{name}_spark_state_memory_bytes_max"] = s["state_memory_bytes_max"]
                if s["steady_batch_s"]:
                    figures[f"{name}_events_per_s_spark_steady"] = (sizes["batch_events"]
                                                                    / s["steady_batch_s"])
                figures[f"{name}_spark_output_mode_append"] = int(s["mode"] == "append")
            else:
                notes[f"{name} (Spark streaming)"] = s["reason"]
            shutil.rmtree(qwork, ignore_errors=True)
    if args.merge:
        figures = merged(figures, args.quick)
    figures["queries_equal_to_spark_batch"] = sum(figures.get(f"{q}_equal_to_spark_batch", 0)
                                                  for q in CORE)
    figures["queries_run"] = ",".join(q for q in QUERIES
                                      if f"{q}_equal_to_spark_batch" in figures)
    counts = {what: sum(figures.get(f"{q}_{what}", 0) for q in QUERIES)
              for what in ("driver_requests", "task_requests")}
    report("nexmark", figures, args, counts)
    for what, why in notes.items():
        print(f"  note {what}: {why}")
    spark.stop()


if __name__ == "__main__":
    main()
