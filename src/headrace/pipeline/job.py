"""The Spark job of one micro-batch: decode, then per operator bucket + shuffle + kernel.

Every operator's output stays on the executors (a persisted DataFrame the next operator reads);
one collect of the union of every stage's control rows (and of the bad-entry branch) runs the
whole graph as one Spark job. Only those control rows reach the driver.
"""

from __future__ import annotations

import pickle
from functools import reduce

import pyarrow as pa

from headrace.pipeline import eventtime
from headrace.pipeline.decode import Decoder, bad_entries_task
from headrace.pipeline.names import BUCKET, SIDE, W
from headrace.pipeline.plan import Map, Node, Operator, SourceTable, Union, consumers, spark_ddl
from headrace.pipeline.tasks import (
    KIND,
    PAYLOAD,
    StageSpec,
    TaskContextSpec,
    run_stage_partition,
    schema_to_bytes,
    stage_schema,
)


class RangeGone(LookupError):
    """The queue no longer holds a range recovery needs."""


def run_stages(spark, nodes: list[Node], entries_df, ctx: TaskContextSpec, *, t: int,
               partitions: int, buckets: int, sinks: dict[int, list[str]],
               writer_ids: dict[str, str], persist_root: str, inline_max: int,
               max_entry_bytes: int, dead_letter: str | None,
               watermark_us: int | None = None, decoder: Decoder | None = None
               ) -> pa.Table | None:
    """Build and run the micro-batch's job; return the control rows (KIND, PAYLOAD).
    ``sinks``: id(operator node) -> the shards its output is written to in this run."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    sources = [n for n in nodes if isinstance(n, SourceTable)]
    decoder = decoder or Decoder(sources, max_entry_bytes)
    # a queue batch is one input partition: a stateless path to a sink runs in the decode's
    # tasks, so spread the entries over the stage's tasks for it; stateful operators shuffle
    # by key anyway, and the extra shuffle would cost more than parsing in one task
    if any(isinstance(n, Operator) and not n.state_sides for n in nodes):
        entries_df = entries_df.repartition(partitions)
    # every table's branch and the bad-entry branch read the parsed entries: parse them once
    entries_df = decoder.parse(entries_df).persist(StorageLevel.MEMORY_AND_DISK)
    persisted = [entries_df]
    frames, bad = decoder.split(entries_df)
    control = [bad.coalesce(1).mapInArrow(bad_entries_task(  # bad entries are rare: 1 task
        {(s.queue, s.table): schema_to_bytes(s.schema) for s in sources}, max_entry_bytes,
        dead_letter,
        writer_ids.get(dead_letter), ctx.url, persist_root, t, inline_max),
        f"`{KIND}` string, `{PAYLOAD}` binary"),
        entries_df.agg(F.count(F.lit(1)).alias("n")).select(
            F.lit("rows").alias(KIND), F.col("n").cast("string").cast("binary").alias(PAYLOAD))]
    try:
        for node in nodes:
            if isinstance(node, Map):  # stateless: Spark expressions on the delta
                frames[node.name] = node.apply(_frame(spark, frames, node.source))
                if node.declares_watermark:
                    control.append(eventtime.max_event_time(frames[node.name], node))
                continue
            if isinstance(node, Union):
                cols = [F.col(f"`{c}`") for c in node.schema.names] + [F.col(W)]
                frames[node.name] = reduce(lambda a, b: a.unionByName(b), [
                    _frame(spark, frames, s).select(*cols) for s in node.sources])
                continue
            if not isinstance(node, Operator):
                continue
            inputs = []
            for i, src in enumerate(node.sources):
                frame = _frame(spark, frames, src).withColumn(
                    BUCKET, bucket_expr(node.bucket_columns[i], buckets))
                if len(node.sources) == 2:
                    frame = frame.withColumn(SIDE, F.lit(i))
                inputs.append(frame)
            frame = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), inputs)
            expire = None
            if node.expiry is not None:  # late rows dropped, closed groups expired
                frame, late, expire = eventtime.prepare(spark, node, frame, watermark_us,
                                                        buckets)
                if late is not None:
                    control.append(late)
            downstream = bool(consumers(nodes, node))
            spec = StageSpec(op=node.op, kind=node.kind,
                             inputs=[schema_to_bytes(s.schema) for s in node.sources],
                             output=schema_to_bytes(node.schema), params=node.params,
                             emit_rows=downstream, sinks=sinks.get(id(node), []), time=t,
                             persist_root=persist_root, writer_ids=writer_ids,
                             inline_max=inline_max, expire=expire)
            if node.state_sides:  # rows of one key meet their state in one task
                frame = frame.repartition(partitions, BUCKET)
            out = frame.mapInArrow(
                task_fn(spec, ctx), spark_ddl(stage_schema(node.schema)))
            if downstream:  # the next operator reads the data rows from executor memory
                out = out.persist(StorageLevel.MEMORY_AND_DISK)
                persisted.append(out)
                frames[node.name] = out.filter(F.col(KIND).isNull()).select(
                    *[F.col(f"`{c}`") for c in node.schema.names], F.col(W))
            control.append(out.filter(F.col(KIND).isNotNull()).select(KIND, PAYLOAD))
        return reduce(lambda a, b: a.union(b), control).toArrow()
    finally:
        for df in persisted:
            df.unpersist()


def _frame(spark, frames: dict, node: Node):
    """The delta DataFrame of ``node`` (its columns + W) in this micro-batch."""
    frame = frames.get(node.name)
    if frame is None:  # a table with no rows in this batch
        frame = spark.createDataFrame([], spark_ddl(node.schema) + f", `{W}` long")
        frames[node.name] = frame
    return frame


def bucket_expr(columns: list[str], buckets: int):
    """The state bucket of a row: ``pmod(xxhash64(key), buckets)``; Spark's xxhash64 hashes
    -0.0 like 0.0 and every NaN alike, so SQL-equal keys meet. No key: bucket 0."""
    from pyspark.sql import functions as F

    if not columns:
        return F.lit(0)
    return F.pmod(F.xxhash64(*[F.col(f"`{c}`") for c in columns]), F.lit(buckets)).cast("int")


def task_fn(spec: StageSpec, ctx: TaskContextSpec):
    def fn(batches):
        from pyspark import TaskContext

        tc = TaskContext.get()
        pid = tc.partitionId() if tc else 0
        attempt = tc.attemptNumber() if tc else 0
        yield from run_stage_partition(batches, spec, ctx, pid, attempt)

    return fn


def range_df(spark, store, url: str, queue: str, after: int, through: int, partitions: int):
    """Queue entries (after, through] as a DataFrame of ENTRY_COLUMNS read by executors (the
    driver lists the manifest only)."""
    from pyspark.sql import functions as F

    from headrace.buffer import list_entries

    manifest = f"{queue}/manifest"
    if through <= after:
        return spark.createDataFrame([], ENTRY_DDL)
    entries = [e for e in list_entries(store, manifest, after) if e.sequence <= through]
    if not entries or entries[-1].sequence != through:
        raise RangeGone(f"queue {queue!r} no longer holds sequences ({after}, {through}] "
                        "needed to recover")
    # an Arrow table: Spark builds it in the JVM (a list of tuples would need Python workers to
    # unpickle it: on a cold restart that alone is a stage of ~2 s)
    meta = pa.table({"sequence": pa.array([e.sequence for e in entries], pa.int64()),
                     "location": pa.array([e.location for e in entries], pa.string()),
                     "metadata": pa.array([pickle.dumps(
                         [(m.start_index, m.ingestion_time_ms, m.payload) for m in e.metadata])
                         for e in entries], pa.binary())})
    df = spark.createDataFrame(meta)

    def read(batches):
        from headrace.spark.queue_source import read_batches

        for b in batches:
            todo = [(seq, loc, pickle.loads(md)) for seq, loc, md in
                    zip(*(b.column(i).to_pylist() for i in range(3)), strict=True)]
            for rb in read_batches(url, manifest, manifest.rpartition("/")[0], todo):
                yield rb.select(["sequence", "index", "entry"])

    return df.repartition(min(meta.num_rows, partitions)).mapInArrow(
        read, "sequence long, index int, entry binary").select(
        F.lit(queue).alias("queue"), "sequence", "index", "entry")


ENTRY_DDL = "queue string, sequence long, index int, entry binary"
