"""Spark's sides of the Nexmark benchmark (nexmark.py): the batch oracle, the ceiling, the fair run.

- **batch oracle**: the query's SQL as Spark batch over Parquet files of all the events.
- **ceiling**: Structured Streaming over the same events as pre-split Parquet files (one file
  per kind and queue batch, ``maxFilesPerTrigger`` 1, column pruning) into a ``noop`` sink:
  what Spark does when it needs no queue, no decode and no output.
- **fair**: Structured Streaming over a copy of the *same queue* headrace reads, through the
  ``headrace.queue`` source (one queue batch per micro-batch, ``max_batches_per_trigger`` 1,
  the queue batch split over as many tasks as headrace splits it), decoded with Spark's own
  functions — the typed struct columns the source makes of columnar entries, ``from_json`` of
  JSON entries — into a durable sink: Spark's Parquet file sink where the query runs in append
  mode, else ``foreachBatch`` writing each micro-batch's rows as Parquet (a replayed batch
  rewrites its own folder). One source per query (a second reader of the queue would fence the
  first): each table is that stream filtered to its rows.

Both streaming sides use RocksDB state with changelog checkpointing (the session's settings),
a ``WATERMARK_DELAY`` watermark on ``dateTime`` where the query runs with one, output mode
append where Spark accepts it, else update; a query Spark refuses in every combination is
reported with Spark's reason.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from headrace.nexmark import KINDS, SCHEMAS
from headrace.nexmark.queries import QUERIES, WATERMARK_DELAY

QUEUE = "nexmark"
MODES = [(True, "append"), (True, "update"), (False, "append"), (False, "update")]


# ------------------------------------------------------------------------------- oracle

def run_spark_batch(spark, name: str, folder: Path):
    for kind in KINDS:
        spark.read.schema(SCHEMAS[kind]).parquet(str(folder / kind)).createOrReplaceTempView(kind)
    return spark.sql(QUERIES[name].sql).toArrow()


# ------------------------------------------------------------------------------ sources

def ceiling_views(spark, folder: Path, watermark: bool) -> None:
    for kind in KINDS:
        df = (spark.readStream.schema(SCHEMAS[kind]).option("maxFilesPerTrigger", 1)
              .parquet(str(folder / kind)))
        _view(df, kind, watermark)


def fair_views(spark, root: str, entries: str, watermark: bool, splits: int) -> None:
    """Temp views ``person``/``auction``/``bid`` over one ``headrace.queue`` stream of the queue
    at ``root``, decoded by Spark: columnar entries arrive as the typed struct columns of the
    source's ``columns`` option; JSON entries are parsed with ``from_json``."""
    from pyspark.sql import functions as F

    from headrace.pipeline.encoding.columnar import columns_option, struct_columns
    from headrace.pipeline.encoding.types import parse_schema

    schemas = {k: parse_schema(SCHEMAS[k], k) for k in KINDS}
    reader = (spark.readStream.format("headrace.queue").option("url", root)
              .option("manifest_path", f"{QUEUE}/manifest")
              .option("max_batches_per_trigger", "1").option("splits_per_batch", str(splits)))
    if entries == "columnar":
        reader = reader.option("columns", columns_option(
            struct_columns([(k, k, schemas[k]) for k in KINDS])))
    raw = reader.load()
    for kind in KINDS:
        names = schemas[kind].names
        if entries == "columnar":
            df = raw.where(F.col(kind).isNotNull()).select(
                *[F.col(f"{kind}.{c}").alias(c) for c in names])
        else:
            parsed = F.from_json(F.col("entry").cast("string"),
                                 SCHEMAS[kind] + ", `table` string")
            df = (raw.select(parsed.alias("e")).where(F.col("e.table") == F.lit(kind))
                  .select(*[F.col(f"e.{c}").alias(c) for c in names]))
        _view(df, kind, watermark)


def _view(df, kind: str, watermark: bool) -> None:
    if watermark:
        df = df.withWatermark("dateTime", WATERMARK_DELAY)
    df.createOrReplaceTempView(kind)


# -------------------------------------------------------------------------------- runs

def _start(df, mode: str, ckpt: Path, sink: Path | None):
    """Start the query: ``sink`` None -> noop; append -> Parquet file sink; update ->
    foreachBatch Parquet writes, one folder per batch id."""
    w = df.writeStream.outputMode(mode).option("checkpointLocation", str(ckpt))
    if sink is None:
        w = w.format("noop")
    elif mode == "append":
        w = w.format("parquet").option("path", str(sink))
    else:
        out = str(sink)

        def write(batch_df, batch_id: int) -> None:
            batch_df.write.mode("overwrite").parquet(f"{out}/batch={batch_id}")

        w = w.foreachBatch(write)
    return w.trigger(availableNow=True).start()


def run_stream(spark, name: str, views, work: Path, partitions: int, *, durable: bool,
               found: tuple[bool, str] | None = None) -> dict:
    """One timed run of query ``name`` at ``partitions`` shuffle partitions; ``views(watermark)``
    (re)creates the source views (a fresh source per run). ``found``: the (watermark, mode)
    an earlier run of this query started with; else each is tried in MODES order and Spark's
    refusals are returned when none starts."""
    from pyspark.errors import AnalysisException, StreamingQueryException

    # PySpark logs each refusal with its JVM stack before raising it; the refusal is returned
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    refusals = []
    try:
        for i, (watermark, mode) in enumerate([found] if found else MODES):
            views(watermark)
            tag = f"{mode}-{int(watermark)}-{i}"
            sink = work / f"out-{tag}" if durable else None
            try:
                df = spark.sql(QUERIES[name].sql)
                t0 = time.perf_counter()
                q = _start(df, mode, work / f"ckpt-{tag}", sink)
                q.awaitTermination()
            except (AnalysisException, StreamingQueryException) as e:
                if found or not isinstance(e, AnalysisException) and \
                        "Python worker failed to connect back" in str(e):
                    raise  # a failure to run, not Spark refusing the query
                refusals.append(f"{mode}{'' if watermark else ', no watermark'}: "
                                f"{' '.join(str(e).split())[:300]}")
                continue
            wall = time.perf_counter() - t0
            progress = list(q.recentProgress)
            return {"ok": True, "found": (watermark, mode), "wall_s": wall,
                    "partitions": partitions, "sink": sink,
                    "steady_batch_s": steady_batch_s(
                        [(p["numInputRows"], p["durationMs"]["triggerExecution"] / 1000)
                         for p in progress]),
                    "batches": sum(1 for p in progress if p["numInputRows"] > 0),
                    "triggers": len(progress),
                    "state_memory_bytes_max": max(
                        (sum(o.get("memoryUsedBytes", 0) for o in p.get("stateOperators", []))
                         for p in progress), default=0),
                    "durations_ms": [dict(p["durationMs"]) for p in progress]}
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    return {"ok": False, "reason": " | ".join(refusals)}


def steady_batch_s(triggers: list[tuple[int, float]]) -> float | None:
    """Seconds per batch with input, from the second one on: every trigger's time from the
    second batch with input to the end — no-data triggers (Spark's, which expire windows)
    included — over those batches. The same rule for both engines: headrace expires windows
    inside the trigger of the batch that moved the watermark, Spark in a trigger of its own."""
    firsts = [i for i, (rows, _) in enumerate(triggers) if rows > 0]
    if len(firsts) < 2:
        return None
    tail = triggers[firsts[1]:]
    return sum(s for _, s in tail) / sum(1 for rows, _ in tail if rows > 0)


def read_sink(spark, run: dict):
    """The rows a durable fair run wrote (append mode: what the file sink committed)."""
    return spark.read.parquet(str(run["sink"])).toArrow()
