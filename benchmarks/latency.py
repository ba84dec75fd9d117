"""End-to-end latency at a steady input rate: headrace vs Spark Structured Streaming, same queue.

A child process (no Spark in it) produces events into a headrace queue at ``--rate`` events/s —
one queue batch every ``FLUSH_S`` seconds, columnar entries of a table ``ev(id long, sent_ms
long, payload string)`` (~100-byte events, a Nexmark bid's size) — and records when the
producer's ``flush`` returned, i.e. when the batch was durable: each event's *acknowledgement*.
A reader thread in the same child polls the query's output every ``POLL_S`` and records when
each id first becomes visible there. An event's latency = seen - acknowledged.

- headrace: a Pipeline passing every ``ev`` row through (``select``) to an output shard,
  ``start(processing_time="0 seconds")``; visible = the shard's upper passed the row's time
  (a reader of the shard sees it);
- Spark: Structured Streaming reads the same kind of queue (its own copy, produced the same
  way) through the ``headrace.queue`` source, selects the same columns from the source's
  struct column, and writes Spark's Parquet file sink, ``processingTime="0 seconds"``;
  visible = the file sink's log (``_spark_metadata``) lists a file holding the row (what a
  reader of the sink reads).

Each engine's query is started and warm (its first batch visible) before the steady input
begins; the first ``--warm`` seconds of steady input are not measured, the next ``--seconds``
are. Reports ``latency_p50_s``, ``latency_p99_s`` (headrace), ``latency_p50_s_spark``,
``latency_p99_s_spark``, the ratio of the p99s, and how many measured events were never seen
(``..._unseen``: 0 unless the engine fell behind for good).

Run: ``python benchmarks/latency.py [--quick] [--rate 5000]`` (quick: 5 s warm, 20 s measured
per engine, ~1.5 minutes in all). Results: ``results/latency.json`` (quick: ``results/quick/``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import report, scratch_dir, tree_cpu_s  # noqa: E402

QUEUE = "lat"
SHARD = "lat.out"
SCHEMA = "id long, sent_ms long, payload string"
FLUSH_S = 0.1  # one queue batch per 100 ms
POLL_S = 0.01
PAYLOAD = 80  # bytes of payload per event
HERE = Path(__file__).resolve()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 s warm, 20 s measured per engine")
    p.add_argument("--rate", type=int, default=5_000, help="events per second")
    p.add_argument("--warm", type=float, default=None, help="seconds of unmeasured input")
    p.add_argument("--seconds", type=float, default=None, help="seconds of measured input")
    p.add_argument("--engines", default="headrace,spark")
    return p.parse_args(argv)


# ------------------------------------------------------------------------ the child process

def _events(first: int, n: int) -> list[bytes]:
    import numpy as np
    import pyarrow as pa

    from headrace.pipeline.encoding import columnar

    ids = np.arange(first, first + n, dtype=np.int64)
    table = pa.table({"id": ids, "sent_ms": np.full(n, int(time.time() * 1000), np.int64),
                      "payload": pa.array(["x" * PAYLOAD] * n)})
    return columnar.encode("ev", table, SCHEMA)


class Seen:
    """When each id first became visible (filled by a reader thread)."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.lock = threading.Lock()

    def add(self, ids, t: float) -> None:
        with self.lock:
            for i in ids:
                self.at.setdefault(int(i), t)


def _headrace_reader(root: str, seen: Seen, stop: threading.Event) -> None:
    from headrace.persist import PersistClient
    from headrace.store import open_store

    client = PersistClient(open_store(root))
    done = 0
    while not stop.wait(POLL_S):
        try:
            state = client.state(SHARD)
        except Exception:  # noqa: BLE001 - the shard does not exist until the first batch
            continue
        upper = state.upper or 0
        if upper > done:
            rows = client.read_updates(state, done, upper)
            seen.add(rows["id"].to_numpy(), time.time())
            done = upper


def _spark_reader(out: str, seen: Seen, stop: threading.Event) -> None:
    import pyarrow.parquet as pq

    log = Path(out) / "_spark_metadata"
    read_logs: set[str] = set()
    read_files: set[str] = set()
    while not stop.wait(POLL_S):
        if not log.is_dir():
            continue
        for f in sorted(log.iterdir()):
            if f.name.startswith(".") or f.name in read_logs or f.name.endswith(".tmp"):
                continue
            lines = f.read_text().splitlines()
            if not lines:  # being written: read it again next time
                continue
            read_logs.add(f.name)
            for line in lines[1:]:  # "v1", then one JSON object per file
                path = json.loads(line)["path"].removeprefix("file://")
                if path not in read_files:
                    read_files.add(path)
                    seen.add(pq.read_table(path, columns=["id"])["id"].to_numpy(), time.time())


def child(engine: str, root: str, out: str, rate: int, warm_s: float, measure_s: float) -> None:
    """Produce, read, measure; prints READY once the first batch is durable, then RESULT."""
    import numpy as np

    from headrace.buffer import Producer, ProducerConfig

    seen, stop = Seen(), threading.Event()
    reader = _headrace_reader if engine == "headrace" else _spark_reader
    cfg = ProducerConfig(url=root, data_path_prefix=QUEUE, manifest_path=f"{QUEUE}/manifest",
                         flush_interval_s=3600.0)
    per_flush = max(1, round(rate * FLUSH_S))
    acked: dict[int, float] = {}
    with Producer(cfg) as producer:
        producer.produce(_events(0, per_flush))
        producer.flush()
        print("READY", flush=True)
        threading.Thread(target=reader, args=(root if engine == "headrace" else out, seen,
                                              stop), daemon=True).start()
        deadline = time.time() + 600
        while 0 not in seen.at:  # the query runs and is warm
            if time.time() > deadline:
                raise SystemExit("the query never made its first batch visible")
            time.sleep(0.05)
        next_id, t_next = per_flush, time.time()
        first_measured = None
        end = time.time() + warm_s + measure_s
        while time.time() < end:
            t_next += FLUSH_S
            if first_measured is None and time.time() >= end - measure_s:
                first_measured = next_id
            producer.produce(_events(next_id, per_flush))
            producer.flush()
            acked[next_id] = time.time()  # the batch's events are durable from here
            next_id += per_flush
            time.sleep(max(0.0, t_next - time.time()))
    last = next_id
    deadline = time.time() + 120
    while time.time() < deadline and any(i not in seen.at for i in range(first_measured, last,
                                                                           per_flush)):
        time.sleep(0.1)
    stop.set()
    lat, unseen = [], 0
    for start, t_ack in acked.items():
        if start < first_measured:
            continue
        for i in range(start, start + per_flush):
            t = seen.at.get(i)
            if t is None:
                unseen += 1
            else:
                lat.append(t - t_ack)
    lat = np.array(lat)
    print("RESULT " + json.dumps({
        "events": int(len(lat) + unseen), "unseen": unseen,
        "p50_s": float(np.percentile(lat, 50)), "p90_s": float(np.percentile(lat, 90)),
        "p99_s": float(np.percentile(lat, 99)), "max_s": float(lat.max()),
        "mean_s": float(lat.mean()), "achieved_rate": (last - first_measured) / measure_s}),
        flush=True)


# ------------------------------------------------------------------------------ the driver

def _spawn(engine: str, root: str, out: str, args) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(HERE), "--child", engine, root, out,
                             str(args.rate), str(args.warm), str(args.seconds)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        raise RuntimeError(f"the producer child did not start: {line!r}")
    return proc


def _result(proc: subprocess.Popen, failure) -> dict:
    """The child's RESULT; ``failure()`` says what stopped the query (None while it runs):
    a dead query ends the wait at once instead of at the child's deadline."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 900
    while proc.poll() is None:
        why = failure()
        if why is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"the query stopped: {why}" if why else "no result in 900 s")
        time.sleep(0.5)
    reader.join(10)
    for line in lines:
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"the producer child gave no result (exit {proc.returncode})")


def run_headrace(spark, work: Path, args) -> dict:
    from headrace.pipeline import Pipeline

    root = str(work / "headrace")
    proc = _spawn("headrace", root, "", args)
    p = Pipeline(spark, root, name="lat", checkpoint_dir=str(work / "headrace-ckpt"))
    src = p.read_queue(QUEUE, {"ev": SCHEMA})
    src["ev"].select("id", "sent_ms", "payload").write_shard(SHARD)
    q = p.start(processing_time="0 seconds")
    try:
        return _result(proc, q.exception)
    finally:
        q.stop()
        q.await_termination(60)


def run_spark(spark, work: Path, args) -> dict:
    from pyspark.sql import functions as F

    from headrace.pipeline.encoding.columnar import columns_option, struct_columns
    from headrace.pipeline.encoding.types import parse_schema

    root, out = str(work / "spark"), str(work / "spark-out")
    proc = _spawn("spark", root, out, args)
    cols = struct_columns([("ev", "ev", parse_schema(SCHEMA, "ev"))])
    df = (spark.readStream.format("headrace.queue").option("url", root)
          .option("manifest_path", f"{QUEUE}/manifest").option("columns", columns_option(cols))
          .load().where(F.col("ev").isNotNull())
          .select(*[F.col(f"ev.{c}").alias(c) for c in ("id", "sent_ms", "payload")]))
    q = (df.writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", str(work / "spark-ckpt"))
         .trigger(processingTime="0 seconds").start())
    try:
        return _result(proc, lambda: None if q.isActive else (q.exception() or "stopped"))
    finally:
        q.stop()


def main(argv=None) -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        a = sys.argv[2:]
        child(a[0], a[1], a[2], int(a[3]), float(a[4]), float(a[5]))
        return
    args = parse(argv)
    args.warm = args.warm if args.warm is not None else (5.0 if args.quick else 10.0)
    args.seconds = args.seconds if args.seconds is not None else (20.0 if args.quick else 60.0)
    from headrace.testing.spark import local_spark

    t0 = time.perf_counter()
    spark = local_spark("headrace-latency", master="local[2]", shuffle_partitions=2,
                        extra={"spark.sql.adaptive.enabled": "false"})
    figures: dict = {"rate": args.rate, "flush_s": FLUSH_S, "warm_s": args.warm,
                     "measured_s": args.seconds}
    with scratch_dir("latency") as work:
        for engine in args.engines.split(","):
            run = run_headrace if engine == "headrace" else run_spark
            for attempt in range(3):  # Spark's Python process start may time out when loaded
                try:
                    r = run(spark, work / f"{engine}-{attempt}", args)
                    break
                except RuntimeError as e:
                    if "failed to connect back" not in str(e) or attempt == 2:
                        raise
                    print(f"-- {engine}: a Python process start timed out; run again",
                          flush=True)
                    figures[f"runs_retried_{engine}"] = attempt + 1
            tag = "" if engine == "headrace" else "_spark"
            print(f"-- {engine}: {json.dumps(r)}", flush=True)
            for k, v in r.items():
                figures[f"latency_{k}{tag}" if k.endswith("_s") else f"{k}{tag}"] = v
    if "latency_p99_s" in figures and "latency_p99_s_spark" in figures:
        figures["latency_p99_ratio_vs_spark"] = (figures["latency_p99_s"]
                                                 / figures["latency_p99_s_spark"])
    figures["wall_s_benchmark"] = time.perf_counter() - t0
    figures["cpu_s_benchmark"] = tree_cpu_s()
    spark.stop()
    report("latency", figures, args)


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    main()
