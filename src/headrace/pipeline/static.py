"""The static plan: a pipeline of one queue table read by one operator, planned once.

Why: PySpark makes every DataFrame call a Python→JVM round trip, and the per-batch job (job.py)
builds a new plan in each micro-batch — ~236 round trips for a group-by, about 40% of its batch
function (docs/pipeline.md, "Where a steady batch's time goes"). Spark's own streaming query plans
in the JVM. Here the plan is built once, on the streaming DataFrame, before the query starts:

    entries → parse (decode.py) → one row per entry: KEEP, SEQ, the entry if bad, the table's
    columns + W → BUCKET → repartition by BUCKET (a stateful operator) → mapInArrow(batch_task)

and each batch's parameters — the operator's StageSpec (time, sinks, writer ids), the state's
TaskContextSpec (version read, run prefix) and the range (after, through] of sequences to
process — travel to the tasks in the Spark local property ``headrace.batch``, which the driver
sets inside ``foreachBatch`` right before the batch's one collect (Spark runs the batch's job on
that thread, so its tasks see the value; checked: every batch's tasks read their own batch's).
The driver's share of a batch is then that property, one collect, and the commit.

``batch_task`` does in one task what the per-batch job does in two branches: it keeps the
entries in the range (a restarted query may re-deliver entries already processed), counts them,
describes the bad ones (as decode.entries_task; no entry is dropped without a trace), and runs
the operator over the kept rows (tasks.run_stage_partition). Bad entries and entries of no
table are routed with the others (their bucket is the hash of NULL keys), so no second branch
reads the entries again.

Shape (``static_shape``): one queue, one table, one operator reading it directly (a stateless
step in between would need its own handling of bad entries), every sink behind that operator;
reservoir state, no event time, no dead-letter shard, no ``read_stream``. The batch a crash
interrupted runs the same plan over its queue range before the query starts. Every other
pipeline, and every recovery replay or history batch, runs the per-batch job.
"""

from __future__ import annotations

import base64
import pickle

import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.decode import ENTRY_COLUMNS
from headrace.pipeline.names import BUCKET, PREFIX, W
from headrace.pipeline.plan import Operator, SourceTable, spark_ddl
from headrace.pipeline.tasks import (
    CONTROL_SCHEMA,
    StageSpec,
    TaskContextSpec,
    control_rows,
    run_stage_partition,
    schema_from_bytes,
)

PROPERTY = "headrace.batch"
KEEP = f"{PREFIX}keep"
SEQ = f"{PREFIX}seq"
BAD = f"{PREFIX}bad_"  # + each of ENTRY_COLUMNS


def static_shape(p) -> Operator | None:
    """The operator of a pipeline the static plan can run, else None."""
    if (len(p.queues) != 1 or p.streams or p.dead_letter_shard
            or p.state_backend != "reservoir"):
        return None
    sources = [n for n in p.nodes if isinstance(n, SourceTable)]
    ops = [n for n in p.nodes if isinstance(n, Operator)]
    if len(sources) != 1 or len(ops) != 1 or len(p.nodes) != 2:
        return None
    op = ops[0]
    if op.sources != [sources[0]] or op.expiry is not None or op.emit_final:
        return None
    if any(s.node is not op for s in p.sinks):
        return None
    return op


def build(p, op: Operator, entries_df):
    """The static plan over the streaming DataFrame of the queue's entries: a DataFrame of
    control rows per batch (the tasks wait for ``headrace.batch``)."""
    from headrace.pipeline.job import bucket_expr

    decoder = p._decoder()
    rows = decoder.single_table(decoder.parse(entries_df), KEEP, SEQ, BAD)
    rows = rows.withColumn(BUCKET, bucket_expr(op.bucket_columns[0], p.buckets))
    if op.state_sides:  # rows of one key meet their state in one task
        rows = rows.repartition(p.partitions, BUCKET)
    source = op.sources[0]
    return rows.mapInArrow(batch_task(source.queue, source.table, p.max_entry_bytes),
                           spark_ddl(CONTROL_SCHEMA))


def collect(spark, df, spec: StageSpec, ctx: TaskContextSpec, after: int,
            through: int) -> pa.Table:
    """Run the batch: set its parameters for the tasks, collect the control rows."""
    sc = spark.sparkContext
    payload = pickle.dumps((spec, ctx, after, through), protocol=pickle.HIGHEST_PROTOCOL)
    sc.setLocalProperty(PROPERTY, base64.b64encode(payload).decode())
    try:
        return df.toArrow()
    finally:
        sc.setLocalProperty(PROPERTY, None)


def batch_task(queue: str, table: str, max_entry_bytes: int):
    def fn(batches):
        from pyspark import TaskContext

        from headrace.pipeline.decode import bad_summary

        tc = TaskContext.get()
        raw = tc.getLocalProperty(PROPERTY) if tc else None
        if raw is None:
            raise RuntimeError(f"static plan task without its {PROPERTY!r} local property: "
                               "the batch was run outside Pipeline._process_static")
        spec, ctx, after, through = pickle.loads(base64.b64decode(raw))
        batches = list(batches)
        if batches:
            # Spark may mark a column non-nullable in some batches: same types, so cast
            schema = pa.schema([f.with_nullable(True) for f in batches[0].schema])
            rows = pa.Table.from_batches([b.cast(schema) for b in batches], schema=schema)
            seq = rows[SEQ]
            rows = rows.filter(pc.and_(pc.greater(seq, after), pc.less_equal(seq, through)))
        else:
            rows = None
        n = 0 if rows is None else rows.num_rows
        control = [("rows", str(n).encode())]
        if n:
            bad = rows.filter(rows[BAD + "sequence"].is_valid())
            if bad.num_rows:
                entries = pa.table({c: bad[BAD + c] for c in ENTRY_COLUMNS})
                schemas = {queue: {table: schema_from_bytes(spec.inputs[0])}}
                summary, _ = bad_summary(entries, schemas, max_entry_bytes)
                control.append(("bad", pickle.dumps(summary)))
            names = [*schema_from_bytes(spec.inputs[0]).names, W, BUCKET]
            kept = rows.filter(rows[KEEP]).select(names)
            if kept.num_rows:
                pid, attempt = (tc.partitionId(), tc.attemptNumber())
                yield from run_stage_partition(kept.to_batches(), spec, ctx, pid, attempt)
        yield control_rows(control, CONTROL_SCHEMA)

    return fn
