"""Nexmark q0–q8 in headrace vs Spark Structured Streaming (RocksDB), same events, same run.

Input: ``headrace.nexmark``'s generator (seed 14) writes N events into a headrace queue, one
queue batch per ``batch_events`` events — columnar entries, or one JSON entry per event with
``--entries json`` — and the same events (a second pass of the deterministic generator) as
Parquet files, one file per kind and batch.

Per query (``headrace.nexmark.queries``; the ones not expressible are in NOT_EXPRESSIBLE), three
streaming sides, each run once at every ``--partitions`` count (2, 4, 8 — quick mode 2, 4, so
it fits in 10 minutes on 2 cores: headrace's tasks per stage, Spark's shuffle partitions), fresh state and a fresh copy of the queue each run; the
fastest run of each side is its figure (``qN_*_best_p``) — the same runs and the same rule for
every side:

(A) headrace: a Pipeline over the queue, one queue batch per micro-batch, the query's Frame
    written to an output shard (update mode). ``qN_events_per_s_headrace`` = N / wall time of
    ``run(until_idle=True)`` (minus the benchmark's probes: after each batch the state stream
    ``qN.state/`` is listed and its latest checkpoint read).
(B) Spark **fair** (nexmark_spark.py): Spark reads a copy of the *same queue* through the
    ``headrace.queue`` source (one queue batch per micro-batch), decodes it with its own
    functions and writes a durable Parquet sink: ``qN_events_per_s_spark_fair``,
    ``qN_ratio_vs_spark_fair`` = headrace / Spark fair, ``min_ratio_vs_spark_fair``.
(C) Spark's **ceiling**: Spark reads the pre-split Parquet files into a ``noop`` sink:
    ``qN_events_per_s_spark_ceiling``, ``qN_ratio_vs_spark_ceiling``,
    ``min_ratio_vs_spark_ceiling``. Where Spark refuses a query (its unsupported-operation
    checks), ``qN_spark_streaming_supported`` is 0, neither Spark figure exists for it, and
    the reason is printed.
(D) the oracle: the query's SQL as Spark *batch* over all the Parquet files; every headrace
    run's final shard must equal it as a multiset of rows (``qN_equal_to_spark_batch``;
    ``queries_equal_to_spark_batch`` counts q0–q8, target 9). The fair run's output is checked
    the same way where Spark wrote it in append mode (``qN_spark_fair_equal_to_spark_batch``).

Per-batch figures (all sides the same rule, ``nexmark_spark.steady_batch_s``): ``..._steady``
= events per batch / (every trigger's seconds from the second batch with input on, no-data
triggers included, over those batches). Of the fastest headrace run:
``qN_driver_requests_per_batch`` = requests of the driver's CountingStore per queue batch
after the first (a no-data batch that expires windows counted with the batch before it; the
benchmark's probes excluded), ``max_driver_requests_per_batch`` over the queries;
``qN_state_bytes_end`` = bytes of the pages the state's latest checkpoint references,
``qN_state_stored_bytes_end`` = every byte under the state prefix, and where the query holds
state at the end ``qN_state_stored_over_live_end`` (``max_state_stored_over_live_end``);
``qN_state_puts_per_batch`` = new state objects per batch after the first.

Warm-up: before the measured queries, every side runs q0 and q3 over 20k separate events in
the same JVM and Python workers, so none pays code generation, JIT or the workers' start
inside a measured query.

Sizes: quick (``--quick``): 200k events at 1,000 events/s of event time (200 s: 20 tumbling
windows), 4 batches of 50k. Full: 10M events at 10,000 events/s, 40 batches of 250k.
Run: ``python benchmarks/nexmark.py [--quick] [--entries json] [--queries core|all|q0,q5]``
(``all`` adds q9–q22's expressible ones). Results: ``results/nexmark.json`` (JSON entries:
``nexmark_json.json``; quick mode under ``results/quick/``). The full mode takes hours on
2 cores; ``--merge`` runs it in parts: the queries run replace theirs in the mode's results
file and keep the others' (only when that file ran the same input; ``queries_run`` lists
what it holds).
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

from benchlib import RESULTS, report, scratch_dir, tree_cpu_s  # noqa: E402
from nexmark_spark import (  # noqa: E402
    QUEUE,
    ceiling_views,
    fair_views,
    read_sink,
    run_spark_batch,
    run_stream,
    steady_batch_s,
)
from spark_baseline import spark_confs  # noqa: E402

from headrace.nexmark import KINDS, SCHEMAS, Generator, GeneratorConfig  # noqa: E402
from headrace.nexmark.compare import results_equal  # noqa: E402
from headrace.nexmark.producer import produce_events  # noqa: E402
from headrace.nexmark.queries import CORE, NOT_EXPRESSIBLE, QUERIES  # noqa: E402

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
    p.add_argument("--entries", choices=("columnar", "json"), default="columnar",
                   help="the queue's entries, read by headrace and by Spark's fair run")
    p.add_argument("--partitions", default=None,
                   help="each side runs once at each count (headrace's tasks per stage, "
                        "Spark's shuffle partitions; default 2,4,8, quick 2,4); its fastest "
                        "run is its figure")
    p.add_argument("--no-spark-streaming", action="store_true",
                   help="skip (B) and (C); the batch oracle still runs")
    p.add_argument("--merge", action="store_true",
                   help="keep the other queries' figures of the mode's results file (same "
                        "input): a full run done in parts")
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


def copy_queue(seed_root: Path, root: Path) -> str:
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(seed_root, root, ignore=shutil.ignore_patterns(".hr*"))
    return str(root)


# --------------------------------------------------------------------------------- headrace

def _state_objects(p, name: str) -> dict[str, int]:
    return {m.key: m.size for m in p.store.list(f"{name}.state/")}


def _live_state_bytes(p, name: str, objects: dict[str, int]) -> int:
    """Bytes of the pages the state's latest checkpoint references (superseded pages that
    older checkpoints still hold are not state); 0 while nothing is stored."""
    from headrace.reservoir.verify import inspect_stream

    return inspect_stream(p.store, f"{name}.state")["page_bytes"] if objects else 0


def run_headrace(spark, name: str, root: str, ckpt: str, partitions: int) -> dict:
    from headrace.pipeline import Pipeline

    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    p = Pipeline(spark, root, name=name, partitions=partitions, checkpoint_dir=ckpt,
                 batches_per_trigger=1)
    out = QUERIES[name].build(p.read_queue(QUEUE, SCHEMAS))
    out.write_shard(f"{name}.out")
    per_batch: list[dict] = []
    seen = {"objs": _state_objects(p, name)}
    probes = {"s": 0.0, "requests": 0}

    def on_batch(info: dict) -> None:
        t = time.perf_counter()
        before = p.store.counts()["requests"]
        objs = _state_objects(p, name)
        per_batch.append({"seconds": info["seconds"], "input_rows": info.get("input_rows", 1),
                          "requests_at": before - probes["requests"],
                          "new_objects": sum(1 for k in objs if k not in seen["objs"]),
                          "stored": sum(objs.values()),
                          "live": _live_state_bytes(p, name, objs)})
        seen["objs"] = objs
        probes["requests"] += p.store.counts()["requests"] - before
        probes["s"] += time.perf_counter() - t

    p.on_batch = on_batch
    t0 = time.perf_counter()
    p.run(until_idle=True)
    wall = time.perf_counter() - t0 - probes["s"]  # the benchmark's probes are not the query's
    result = p.read_shard(f"{name}.out")
    live = [b["live"] for b in per_batch]
    steady = per_batch[1:] or per_batch
    return {"wall_s": wall, "partitions": partitions, "result": result,
            "batches": len(per_batch),
            "data_batches": sum(1 for b in per_batch if b["input_rows"] > 0),
            "steady_batch_s": steady_batch_s([(x["input_rows"], x["trigger_s"])
                                              for x in p.spark_progress]),
            "driver_requests_per_batch": _requests_per_batch(per_batch),
            "state_puts_per_batch": statistics.mean(b["new_objects"] for b in steady),
            "state_bytes_max": max(live), "state_bytes_mid": live[(len(live) - 1) // 2],
            "state_bytes_end": live[-1], "state_stored_bytes_end": per_batch[-1]["stored"],
            "late_rows": int(p.metrics.get("late_rows", 0)),
            "driver_requests": p.store.counts()["requests"] - probes["requests"],
            "task_requests": int(p.metrics.get("task_requests", 0))}


def _requests_per_batch(per_batch: list[dict]) -> float | None:
    """Driver requests per queue batch after the first: from the end of the first batch
    with input to the end of the last batch (no-data batches that follow a batch with input
    are counted with it), over the batches with input in that span."""
    data = [i for i, b in enumerate(per_batch) if b["input_rows"] > 0]
    if len(data) < 2:
        return None
    # the first batch's group ends where the second batch with input begins
    start = per_batch[data[1] - 1]["requests_at"]
    return (per_batch[-1]["requests_at"] - start) / (len(data) - 1)


# ------------------------------------------------------------------------------------ sides

# Spark starting a Python process that does not connect back in time (its accept timeout, on
# a loaded machine): the environment's failure, not the engine's; the run is made again, at
# most RETRIES times, and counted (``qN_runs_retried``)
STARTUP_TIMEOUT = "Python worker failed to connect back"
RETRIES = 2


def once_more(run, retried: list[str], what: str):
    """``run()``, again if Spark's Python process start timed out."""
    for attempt in range(RETRIES + 1):
        try:
            return run()
        except Exception as e:  # noqa: BLE001 - only the start timeout is retried
            if STARTUP_TIMEOUT not in str(e) or attempt == RETRIES:
                raise
            print(f"   {what}: {STARTUP_TIMEOUT}; run again", flush=True)
            retried.append(what)


def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["wall_s"])


def headrace_side(spark, name: str, seed_root: Path, qwork: Path, ps: list[int],
                  expected, url: str | None, produce,
                  retried: list[str]) -> tuple[list[dict], bool, str]:
    """Every headrace run of the query (one per P); (runs, all equal to the oracle, why not)."""
    runs, equal, why = [], True, "equal"
    for p in ps:
        def run(p=p):
            if url:
                root = f"{url.rstrip('/')}/nexmark-{name}-p{p}-{time.time_ns()}"
                produce(root)
            else:
                root = copy_queue(seed_root, qwork / f"store-p{p}")
            shutil.rmtree(qwork / f"ckpt-p{p}", ignore_errors=True)
            return run_headrace(spark, name, root, str(qwork / f"ckpt-p{p}"), p)

        h = once_more(run, retried, f"headrace P={p}")
        ok, w = results_equal(h.pop("result"), expected)
        print(f"   headrace P={p}: {h['wall_s']:.2f} s; vs Spark batch: {w}", flush=True)
        if not ok and equal:
            equal, why = False, w
        runs.append(h)
        shutil.rmtree(qwork / f"store-p{p}", ignore_errors=True)
    return runs, equal, why


def spark_side(spark, name: str, views, qwork: Path, ps: list[int], durable: bool,
               label: str, retried: list[str]) -> list[dict] | str:
    """Every run of one Spark side (one per P), or Spark's reason for refusing the query."""
    runs, found = [], None
    for p in ps:
        def run(p=p, found=found):
            shutil.rmtree(qwork / f"{label}-p{p}", ignore_errors=True)
            return run_stream(spark, name, lambda wm: views(wm, p), qwork / f"{label}-p{p}",
                              p, durable=durable, found=found)

        r = once_more(run, retried, f"Spark {label} P={p}")
        if not r["ok"]:
            return r["reason"]
        found = r["found"]
        print(f"   Spark {label} P={p}: {r['wall_s']:.2f} s ({r['found'][1]})", flush=True)
        runs.append(r)
    return runs


def warm_up(spark, work: Path, ps: list[int], entries: str, splits: int) -> None:
    """q0 and q3 over 20k events on every side (see the module docstring)."""
    cfg = GeneratorConfig(seed=SEED + 1, rate=1_000)
    seed, parquet = work / "warm" / "queue", work / "warm" / "parquet"
    produce_events(str(seed), QUEUE, 20_000, config=cfg, batch_events=10_000, entries=entries)
    write_parquet(cfg, 20_000, 10_000, parquet)
    t0 = time.perf_counter()
    retried: list[str] = []
    for name in ("q0", "q3"):
        w = work / "warm" / name
        runs = {
            "headrace": lambda name=name, w=w: run_headrace(
                spark, name, copy_queue(seed, w / "store"), str(w / f"ckpt-{time.time_ns()}"),
                ps[0]),
            "ceiling": lambda name=name, w=w: run_stream(
                spark, name, lambda wm: ceiling_views(spark, parquet, wm),
                w / f"ceiling-{time.time_ns()}", ps[0], durable=False),
            "fair": lambda name=name, w=w: run_stream(
                spark, name, lambda wm: fair_views(spark, copy_queue(seed, w / "fair-q"),
                                                   entries, wm, splits),
                w / f"fair-{time.time_ns()}", ps[0], durable=True),
        }
        run_spark_batch(spark, name, parquet)
        for what, run in runs.items():
            once_more(run, retried, f"warm-up {name} {what}")
    shutil.rmtree(work / "warm", ignore_errors=True)
    print(f"-- warm-up (q0, q3 over 20k events, every side): "
          f"{time.perf_counter() - t0:.1f} s", flush=True)


# ------------------------------------------------------------------------------------- main

def results_path(quick: bool, entries: str) -> tuple[str, Path]:
    name = "nexmark" if entries == "columnar" else "nexmark_json"
    return name, (RESULTS / "quick" if quick else RESULTS) / f"{name}.json"


def merged(figures: dict, path: Path) -> dict:
    """``figures`` over the figures of ``path``, when that file ran the same input (events,
    rate, batch size, entries): the full mode's hours of queries can run in parts."""
    old = json.loads(path.read_text()) if path.exists() else {}
    same = all(old.get(k) == figures[k] for k in ("events", "rate", "batch_events", "entries"))
    if not same:
        print(f"  --merge: {path} ran other input; not merged", flush=True)
        return figures
    keep = {k: v for k, v in old.items() if k != "quick" and not k.startswith("store_")}
    return {**keep, **figures}


def summarise(figures: dict) -> None:
    """The figures over every query the results hold (after a merge too)."""
    def over(suffix: str, fn):
        vals = [figures[f"{q}_{suffix}"] for q in QUERIES if f"{q}_{suffix}" in figures]
        return fn(vals) if vals else None

    for key, suffix, fn in (("min_ratio_vs_spark_fair", "ratio_vs_spark_fair", min),
                            ("min_ratio_vs_spark_ceiling", "ratio_vs_spark_ceiling", min),
                            ("max_driver_requests_per_batch", "driver_requests_per_batch", max),
                            ("max_state_stored_over_live_end", "state_stored_over_live_end",
                             max)):
        v = over(suffix, fn)
        if v is not None:
            figures[key] = v
    figures["queries_equal_to_spark_batch"] = sum(figures.get(f"{q}_equal_to_spark_batch", 0)
                                                  for q in CORE)
    figures["queries_run"] = ",".join(q for q in QUERIES
                                      if f"{q}_equal_to_spark_batch" in figures)


def run_query(spark, name: str, args, sizes: dict, cfg, work: Path, ps: list[int],
              figures: dict, notes: dict, splits: int) -> None:
    print(f"-- {name}", flush=True)
    t_query = time.perf_counter()
    qwork, parquet, seed_root = work / name, work / "parquet", work / "queue"
    expected = run_spark_batch(spark, name, parquet)
    n = sizes["events"]

    def produce(root: str) -> None:
        produce_events(root, QUEUE, n, config=cfg, batch_events=sizes["batch_events"],
                       entries=args.entries)

    retried: list[str] = []
    runs, equal, why = headrace_side(spark, name, seed_root, qwork, ps, expected, args.url,
                                     produce, retried)
    if not equal:
        notes[name] = f"differs from Spark batch: {why}"
    h = best(runs)
    figures.update({
        f"{name}_equal_to_spark_batch": int(equal),
        f"{name}_rows": expected.num_rows,
        f"{name}_events_per_s_headrace": n / h["wall_s"],
        f"{name}_headrace_best_p": h["partitions"],
        f"{name}_batches_headrace": h["batches"],
        f"{name}_state_puts_per_batch": h["state_puts_per_batch"],
        f"{name}_state_bytes_max": h["state_bytes_max"],
        f"{name}_state_bytes_mid": h["state_bytes_mid"],
        f"{name}_state_bytes_end": h["state_bytes_end"],
        f"{name}_state_stored_bytes_end": h["state_stored_bytes_end"],
        f"{name}_late_rows": h["late_rows"],
        f"{name}_driver_requests": h["driver_requests"],
        f"{name}_task_requests": h["task_requests"],
    })
    if h["steady_batch_s"]:
        figures[f"{name}_events_per_s_headrace_steady"] = (sizes["batch_events"]
                                                           / h["steady_batch_s"])
    if h["driver_requests_per_batch"] is not None:
        figures[f"{name}_driver_requests_per_batch"] = h["driver_requests_per_batch"]
    if h["state_bytes_end"] > 0:
        figures[f"{name}_state_stored_over_live_end"] = (h["state_stored_bytes_end"]
                                                         / h["state_bytes_end"])
    if QUERIES[name].windowed:
        figures[f"{name}_state_end_over_mid"] = (h["state_bytes_end"]
                                                 / max(h["state_bytes_mid"], 1))
    if args.no_spark_streaming:
        return
    sides = {
        "ceiling": (lambda wm, p: ceiling_views(spark, parquet, wm), False),
        "fair": (lambda wm, p: fair_views(spark, copy_queue(seed_root, qwork / f"fair-q{p}"),
                                          args.entries, wm, splits), True),
    }
    for label, (views, durable) in sides.items():
        try:
            runs = spark_side(spark, name, views, qwork, ps, durable, label, retried)
        except Exception as e:  # noqa: BLE001 - reported; headrace's figures stand
            traceback.print_exc()
            notes[f"{name} (Spark {label})"] = (f"failed: {type(e).__name__}: "
                                                f"{str(e).splitlines()[0][:300]}")
            continue
        if isinstance(runs, str):
            figures[f"{name}_spark_streaming_supported"] = 0
            notes[f"{name} (Spark streaming)"] = runs
            break
        figures[f"{name}_spark_streaming_supported"] = 1
        s = best(runs)
        figures.update({
            f"{name}_events_per_s_spark_{label}": n / s["wall_s"],
            f"{name}_spark_{label}_best_p": s["partitions"],
            f"{name}_ratio_vs_spark_{label}": s["wall_s"] / h["wall_s"],
            f"{name}_spark_output_mode_append": int(s["found"][1] == "append"),
            f"{name}_spark_{label}_state_memory_bytes_max": s["state_memory_bytes_max"],
        })
        if s["steady_batch_s"]:
            figures[f"{name}_events_per_s_spark_{label}_steady"] = (sizes["batch_events"]
                                                                    / s["steady_batch_s"])
        if durable and s["found"][1] == "append":  # the file sink's rows: Spark decoded right
            ok, w = results_equal(read_sink(spark, s), expected)
            figures[f"{name}_spark_fair_equal_to_spark_batch"] = int(ok)
            if not ok:
                notes[f"{name} (Spark fair)"] = f"differs from Spark batch: {w}"
    figures[f"{name}_runs_retried"] = len(retried)
    shutil.rmtree(qwork, ignore_errors=True)
    print(f"   {name}: {time.perf_counter() - t_query:.1f} s", flush=True)


def main(argv=None) -> None:
    args = parse(argv)
    t_start = time.perf_counter()
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
    if args.partitions is None:
        args.partitions = "2,4" if args.quick else "2,4,8"
    ps = [int(x) for x in args.partitions.split(",") if x.strip()]
    from headrace.testing.spark import local_spark

    spark = local_spark("headrace-nexmark", master="local[2]", shuffle_partitions=ps[0],
                        extra={**spark_confs(ps[0], changelog=True),
                               "spark.driver.memory": "4g"})
    # the fair run splits a queue batch over as many tasks as headrace does (one per core)
    splits = spark.sparkContext.defaultParallelism
    cfg = GeneratorConfig(seed=SEED, rate=sizes["rate"])
    figures: dict = {"events": sizes["events"], "rate": sizes["rate"],
                     "batch_events": sizes["batch_events"], "entries": args.entries,
                     "partitions_tried": args.partitions}
    notes: dict[str, str] = dict(NOT_EXPRESSIBLE)
    with scratch_dir("nexmark") as work:
        t0 = time.perf_counter()
        produced = produce_events(str(work / "queue"), QUEUE, sizes["events"], config=cfg,
                                  batch_events=sizes["batch_events"], entries=args.entries)
        figures["produce_events_per_s"] = produced.events / (time.perf_counter() - t0)
        write_parquet(cfg, sizes["events"], sizes["batch_events"], work / "parquet")
        warm_up(spark, work, ps, args.entries, splits)
        for name in names:
            try:
                run_query(spark, name, args, sizes, cfg, work, ps, figures, notes, splits)
            except Exception as e:  # noqa: BLE001 - one query failing must not hide the others
                traceback.print_exc()
                notes[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                figures[f"{name}_equal_to_spark_batch"] = 0
    name, path = results_path(args.quick, args.entries)
    if args.merge:
        figures = merged(figures, path)
    summarise(figures)
    figures["wall_s_benchmark"] = time.perf_counter() - t_start
    figures["cpu_s_benchmark"] = tree_cpu_s()  # this run's own cost on a shared machine
    counts = {what: sum(figures.get(f"{q}_{what}", 0) for q in QUERIES)
              for what in ("driver_requests", "task_requests")}
    report(name, figures, args, counts)
    for what, why in notes.items():
        print(f"  note {what}: {why}")
    spark.stop()


if __name__ == "__main__":
    main()
