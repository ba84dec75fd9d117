"""The Spark job of one micro-batch: decode, then per operator bucket + shuffle + kernel.

Every operator's output stays on the executors (a persisted DataFrame the next operator reads);
one collect of the union of every stage's control rows (and of the bad-entry branch) runs the
whole graph as one Spark job. Only those control rows reach the driver.
"""

from __future__ import annotations

import json
import logging
import threading
from functools import lru_cache, reduce

import pyarrow as pa

from headrace.buffer import list_entries
from headrace.pipeline.encoding.columnar import columns_option
from headrace.pipeline.encoding.ipc import schema_to_bytes
from headrace.pipeline.encoding.types import spark_ddl
from headrace.pipeline.errors import RangeGone
from headrace.pipeline.exec.control import CONTROL_SCHEMA, stage_schema
from headrace.pipeline.exec.decode import ENTRY_DDL, Decoder, entries_task, widen
from headrace.pipeline.exec.queue_source import read_batches
from headrace.pipeline.exec.tasks import StageSpec, TaskContextSpec, run_stage_partition
from headrace.pipeline.exec.workers import open_reader, task_store
from headrace.pipeline.names import BUCKET, KIND, PAYLOAD, SIDE, W
from headrace.pipeline.plan import eventtime
from headrace.pipeline.plan.nodes import (
    Map,
    Node,
    Operator,
    SourceTable,
    Union,
    consumers,
)


def run_stages(spark, nodes: list[Node], entries_df, ctx: TaskContextSpec, *, t: int,
               partitions: int, buckets: int, sinks: dict[int, list[str]],
               writer_ids: dict[str, str], persist_root: str, inline_max: int,
               max_entry_bytes: int, dead_letter: str | None,
               watermark_us: int | None = None, decoder: Decoder | None = None,
               columns: dict | None = None) -> pa.Table | None:
    """Build and run the micro-batch's job; return the control rows (KIND, PAYLOAD).
    ``sinks``: id(operator node) -> the shards its output is written to in this run;
    ``columns``: the pipeline's cache of Columns that are the same every batch."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    sources = [n for n in nodes if isinstance(n, SourceTable)]
    decoder = decoder or Decoder(sources, max_entry_bytes)
    columns = {} if columns is None else columns
    # no repartition of the entries: the queue source (and range_df on recovery) already
    # reads each queue batch in one task per core (splits_per_batch), so a stateless path to
    # a sink runs spread over the cores in the decode's tasks, with no shuffle of raw entries
    # every table's branch and the bad-entry branch read the parsed entries: parse them once
    entries_df = decoder.parse(entries_df).persist(StorageLevel.MEMORY_AND_DISK)
    persisted = [entries_df]
    frames, checked = decoder.split(entries_df)
    # per input partition: its entry count and its bad entries, in the job's last stage
    control = [checked.mapInArrow(entries_task(
        {(s.queue, s.table): schema_to_bytes(s.schema) for s in decoder.sources},
        max_entry_bytes,
        dead_letter,
        writer_ids.get(dead_letter), ctx.url, persist_root, t, inline_max,
        decoder.missing_null),
        spark_ddl(CONTROL_SCHEMA))]
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
                frame = _frame(spark, frames, src)
                side = i if len(node.sources) == 2 else None
                key = (tuple(node.bucket_columns[i]), buckets, side)
                if key not in columns:  # Columns are plans: built once, reused every batch
                    columns[key] = {BUCKET: bucket_expr(node.bucket_columns[i], buckets)}
                    if side is not None:
                        columns[key][SIDE] = F.lit(side)
                inputs.append(frame.withColumns(columns[key]))
            frame = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), inputs)
            expire = None
            if node.expiry is not None:  # late rows dropped, closed groups expired
                frame, late, expire = eventtime.prepare(spark, node, frame, watermark_us,
                                                        buckets)
                if late is not None:
                    control.append(late)
            downstream = bool(consumers(nodes, node))
            spec = stage_spec(node, emit_rows=downstream, sinks=sinks.get(id(node), []), t=t,
                              persist_root=persist_root, writer_ids=writer_ids,
                              inline_max=inline_max, expire=expire)
            if node.state_sides:  # rows of one key meet their state in one task
                frame = frame.repartition(partitions, task_of_bucket(buckets, partitions))
            out = frame.mapInArrow(task_fn(spec, ctx), spark_ddl(
                stage_schema(node.schema) if downstream else CONTROL_SCHEMA))
            if not downstream:  # only control rows
                control.append(out)
                continue
            # the next operator reads the data rows from executor memory
            out = out.persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(out)
            frames[node.name] = out.filter(F.col(KIND).isNull()).select(
                *[F.col(f"`{c}`") for c in node.schema.names], F.col(W))
            control.append(out.filter(F.col(KIND).isNotNull()).select(KIND, PAYLOAD))
        return reduce(lambda a, b: a.union(b), control).toArrow()
    finally:
        for df in persisted:
            df.unpersist()


def stage_spec(node: Operator, *, emit_rows: bool, sinks: list[str], t: int, persist_root: str,
               writer_ids: dict[str, str], inline_max: int, expire=None) -> StageSpec:
    """What the tasks of ``node``'s stage need to know of micro-batch ``t``."""
    return StageSpec(op=node.op, kind=node.kind,
                     inputs=[schema_to_bytes(s.schema) for s in node.sources],
                     output=schema_to_bytes(node.schema), params=node.params,
                     emit_rows=emit_rows, sinks=sinks, time=t, persist_root=persist_root,
                     writer_ids=writer_ids, inline_max=inline_max, expire=expire)


def warm_workers(spark, ctx: TaskContextSpec, on_requests=None):
    """Start a job in the background that starts the Python workers, imports the kernels and
    opens the state reader of ``ctx.state_version`` in each, while the driver plans the
    micro-batch: on a restart that start-up is seconds, and the batch's tasks would pay it
    first. ``on_requests(dict)`` gets the object-store requests the job made. Returns the
    thread (nothing depends on it; a failure is only logged)."""
    n = spark.sparkContext.defaultParallelism
    url, stream, version, cache_dir = ctx.url, ctx.stream, ctx.state_version, ctx.cache_dir
    reservoir = ctx.backend == "reservoir"

    def warm(batches):
        from headrace.pipeline.exec import tasks  # noqa: F401 - the kernels' imports, here

        for _ in batches:
            pass
        store = task_store(url)
        before = store.counts()
        if reservoir:
            open_reader(url, stream, version, cache_dir)
        after = store.counts()
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps(
            {k: after[k] - before[k] for k in after})])], names=["requests"])

    def run():
        try:
            # a DataFrame job, though an RDD job would skip Catalyst's planning: SQL's Python
            # tasks do not reuse the workers an RDD job starts (other environment variables,
            # so another worker pool: checked by worker pids)
            rows = spark.range(0, n, 1, n).mapInArrow(warm, "requests string").collect()
            if on_requests is not None:
                for r in rows:
                    on_requests(json.loads(r[0]))
        except Exception as e:  # noqa: BLE001 - an optimisation only
            logging.getLogger("headrace.pipeline").debug("worker warm-up failed: %s", e)

    thread = threading.Thread(target=run, name="headrace-warm-workers", daemon=True)
    thread.start()
    return thread


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


def task_of_bucket(buckets: int, partitions: int):
    """The shuffle key that sends bucket b to task ``b * partitions // buckets`` (each task a
    contiguous range of buckets, their counts differing by at most one).

    Why: ``repartition(n, BUCKET)`` places a bucket by Spark's Murmur3 hash of its number, and
    32 buckets over 2 tasks came out 12 and 20 — the stage waited for the task with 20 (0.62
    against 0.46 s at 1M keys). Spark hash-partitions whatever key it gets, so each bucket
    gets a key value whose hash lands it where it belongs (``spark_murmur3_int``; a Spark
    test checks it against Spark's own ``hash``)."""
    from pyspark.sql import functions as F

    if partitions <= 1 or buckets <= 1:
        return F.col(BUCKET)
    # one expression from SQL text: one Python->JVM call, where 32 literals cost 35 (the
    # per-batch job builds it every batch)
    keys = ", ".join(map(str, _bucket_shuffle_keys(buckets, partitions)))
    return F.expr(f"element_at(array({keys}), `{BUCKET}` + 1)")


@lru_cache(maxsize=16)
def _bucket_shuffle_keys(buckets: int, partitions: int) -> tuple[int, ...]:
    """Per bucket b, a key value (distinct per bucket) that Spark's hash partitioning sends to
    task ``b * partitions // buckets``: ~partitions tries per bucket, once per shape."""
    keys = []
    for b in range(buckets):
        want, v = b * partitions // buckets, b
        while spark_murmur3_int(v) % partitions != want:
            v += buckets
        keys.append(v)
    return tuple(keys)


def spark_murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of one int column (Murmur3_x86_32.hashInt, seed 42), as the signed
    int HashPartitioning takes ``pmod`` of."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 = ((h1 ^ (h1 >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    h1 = ((h1 ^ (h1 >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def task_fn(spec: StageSpec, ctx: TaskContextSpec):
    def fn(batches):
        from pyspark import TaskContext

        tc = TaskContext.get()
        pid = tc.partitionId() if tc else 0
        attempt = tc.attemptNumber() if tc else 0
        yield from run_stage_partition(batches, spec, ctx, pid, attempt)

    return fn


def range_batches(store, queue: str, after: int, through: int) -> list[tuple]:
    """The queue batches holding sequences (after, through], as the (sequence, location,
    metadata items) that ``queue_source.read_batches`` reads (the driver lists the manifest
    only); RangeGone if the queue no longer holds them all."""
    entries = [e for e in list_entries(store, f"{queue}/manifest", after)
               if e.sequence <= through]
    if not entries or entries[-1].sequence != through:
        raise RangeGone(f"queue {queue!r} no longer holds sequences ({after}, {through}] "
                        "needed to recover")
    return [(e.sequence, e.location, [(m.start_index, m.ingestion_time_ms, m.payload)
                                      for m in e.metadata]) for e in entries]


def range_df(spark, store, url: str, queue: str, after: int, through: int, partitions: int,
             splits: int = 1, decoder: Decoder | None = None, counted=None):
    """Queue entries (after, through] as a DataFrame of ENTRY_COLUMNS (then ``decoder``'s
    struct columns: columnar entries arrive as their rows) read by executors (the driver lists
    the manifest only); ``counted``: an accumulator the rows read are added to."""
    manifest = f"{queue}/manifest"
    ddl = decoder.entries_ddl() if decoder is not None else ENTRY_DDL
    if through <= after:
        return spark.createDataFrame([], ddl)
    # the few (sequence, location, metadata) travel in the task function; spark.range only
    # numbers them (a DataFrame built from driver data costs a stage and, on a cold restart, a
    # Python worker's start-up of its own). Each batch is read by ``splits`` tasks, as the
    # queue source does (splits_per_batch): task i keeps share i % splits of batch i // splits.
    todo = range_batches(store, queue, after, through)
    k = max(1, splits)
    mine = decoder.queue_columns(queue) if decoder is not None else pa.schema([])
    option = columns_option(mine) if len(mine) else None
    structs = decoder.columns if decoder is not None else pa.schema([])

    def read(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                for rb in read_batches(url, manifest, manifest.rpartition("/")[0],
                                       [todo[i // k]], (i % k, k), option, counted):
                    yield widen(rb.append_column("queue", pa.repeat(
                        pa.scalar(queue, pa.string()), rb.num_rows)), structs)

    n = len(todo) * k
    return spark.range(0, n, 1, min(n, max(partitions, k))).mapInArrow(read, ddl)
