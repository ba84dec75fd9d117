"""The static plan: a pipeline of one queue table read by one operator, planned once.

Why: PySpark makes every DataFrame call a Python→JVM round trip, and the per-batch job (job.py)
builds a new plan in each micro-batch — ~236 round trips for a group-by, about 40% of its batch
function (docs/pipeline.md, "Where a steady batch's time goes"). Spark's own streaming query plans
in the JVM. Here the plan is built once, on the streaming DataFrame, before the query starts:

    entries → parse (decode.py) → one row per entry: SIDE (which table the first operator reads
    it as), SEQ, the entry if bad, the tables' columns + W → BUCKET → repartition → first
    operator (entries_task) → [BUCKET → repartition → next operator (chained_task)]*

and each batch's parameters — every operator's StageSpec (time, sinks, writer ids), the state's
TaskContextSpec (version read, run prefix) and the range of sequences to process — travel to the
tasks in the Spark local property ``headrace.batch``. Spark runs the shuffle map stages of a
``foreachBatch`` DataFrame before it calls the function, so the driver sets a batch's
parameters ahead: before the query starts and at the end of the batch before (``prepare``); the
tasks echo the batch's run prefix and ``check`` refuses a batch any task of which ran with other
parameters, before anything is committed. The driver's share of a batch is one collect and the
commit.

The first operator's task does what the per-batch job does in two branches: it keeps the
entries in the range (a restarted query may re-deliver entries already processed), counts them,
describes the bad ones (as decode.entries_task; no entry is dropped without a trace), and runs
the kernel over the rows its tables keep (tasks.run_stage_partition). Bad entries and entries of
other tables travel with the others (their bucket is the hash of NULL keys), so no second branch
reads the entries again. Each later operator's task runs its kernel over the data rows of the
one before and passes that stage's control rows on, so they all reach the last stage's collect
and nothing is persisted.

Shape (``static_shape``): one queue; a chain of operators, the first reading one table or two
different tables (a join), or one table through stateless steps (no watermark or window step:
behind them the entries check runs in ``checked_task`` and reports through an accumulator,
since a step may drop any row), each later one reading only the one before, each but the last
read by nothing else; sinks behind any of them; reservoir state, no event time, no dead-letter
shard, no ``read_stream``. The batch a crash interrupted runs the same plan over its queue range
before the query starts (or, with one operator, as direct.py's job). Every other pipeline, and every recovery replay or history batch, runs
the per-batch job. The driver's side is static_batch.py.
"""

from __future__ import annotations

import base64
import pickle

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.accumulators import AccumulatorParam

from headrace.pipeline.decode import ENTRY_COLUMNS
from headrace.pipeline.names import BUCKET, PREFIX, SIDE, W
from headrace.pipeline.plan import Map, Operator, SourceTable, consumers, spark_ddl
from headrace.pipeline.tasks import (
    CONTROL_SCHEMA,
    KIND,
    PAYLOAD,
    StageSpec,
    TaskContextSpec,
    control_rows,
    run_stage_partition,
    schema_from_bytes,
    stage_schema,
)

PROPERTY = "headrace.batch"
SEQ = f"{PREFIX}seq"
BAD = f"{PREFIX}bad_"  # + each of ENTRY_COLUMNS


def static_shape(p) -> list[Operator] | None:
    """The operators, in order, of a pipeline the static plan can run; else None."""
    if (len(p.queues) != 1 or p.streams or p.dead_letter_shard
            or p.state_backend != "reservoir"):
        return None
    ops = [n for n in p.nodes if isinstance(n, Operator)]
    if not ops or any(not isinstance(n, Operator | SourceTable | Map) for n in p.nodes):
        return None
    first = ops[0].sources
    maps = steps(ops[0])
    if maps:
        if (len(first) != 1 or any(m.declares_watermark or m.event_time or m.window
                                   for m in maps)
                or any(consumers(p.nodes, m) != [after] for m, after in
                       zip(maps, [*maps[1:], ops[0]], strict=True))
                or len([n for n in p.nodes if isinstance(n, Map)]) != len(maps)):
            return None
    elif (not 1 <= len(first) <= 2 or len({id(s) for s in first}) != len(first)
            or not all(isinstance(s, SourceTable) for s in first)):
        return None
    for before, op in zip(ops, ops[1:], strict=False):
        if op.sources != [before] or consumers(p.nodes, before) != [op]:
            return None
    if consumers(p.nodes, ops[-1]):
        return None
    if any(op.expiry is not None or op.emit_final for op in ops):
        return None
    return ops


def steps(first: Operator) -> list[Map]:
    """The stateless steps between the first operator and its table, table first (none when
    it reads tables directly)."""
    out, node = [], first.sources[0] if len(first.sources) == 1 else None
    while isinstance(node, Map):
        out.insert(0, node)
        node = node.source
    return out if isinstance(node, SourceTable) else []


def build(p, ops: list[Operator], entries_df):
    """The static plan over a DataFrame of the queue's entries (the query's stream, or a range
    on recovery): a DataFrame of control rows per batch (the tasks wait for
    ``headrace.batch``)."""
    from pyspark.sql import functions as F

    from headrace.pipeline.job import bucket_expr, task_of_bucket

    decoder = p._decoder()
    first = ops[0]
    maps = steps(first)
    reads = [maps[0].source] if maps else first.sources
    rows = decoder.tagged(decoder.parse(entries_df), reads, SIDE, SEQ, BAD)
    # every table the queue's entries may name, to say what is wrong with a bad one
    tables = {n.table: n.schema for n in p.nodes if isinstance(n, SourceTable)}
    queue = reads[0].queue
    if maps:  # a step may drop any row: the entries are checked before, counted aside
        table = reads[0].schema
        rows = rows.mapInArrow(checked_task(queue, tables, p.max_entry_bytes, table,
                                            entries_accumulator(p)),
                               spark_ddl(table) + f", `{W}` long")
        for m in maps:
            rows = m.apply(rows)
        rows = rows.withColumn(BUCKET, bucket_expr(first.bucket_columns[0], p.buckets))
    else:
        buckets = [bucket_expr(first.bucket_columns[i], p.buckets)
                   for i in range(len(first.sources))]
        rows = rows.withColumn(BUCKET, buckets[0] if len(buckets) == 1 else
                               F.when(F.col(SIDE) == F.lit(1), buckets[1]).otherwise(buckets[0]))
    for i, op in enumerate(ops):
        if i:
            rows = rows.withColumn(BUCKET, bucket_expr(op.bucket_columns[0], p.buckets))
        if op.state_sides:  # rows of one key meet their state in one task
            rows = rows.repartition(p.partitions, task_of_bucket(p.buckets, p.partitions))
        out = stage_schema(op.schema) if i < len(ops) - 1 else CONTROL_SCHEMA
        if i:
            task = chained_task(i, out)
        elif maps:
            task = stepped_task(out)
        else:
            task = entries_task(queue, tables, p.max_entry_bytes, out)
        rows = rows.mapInArrow(task, spark_ddl(out))
    return rows


class EntriesParam(AccumulatorParam):
    """What the entries checks of a batch found, summed over its tasks (steps before the
    first operator may drop any row, so the count and the bad entries cannot travel with
    them). A retried map task adds twice: ``rows`` is then a metric only; a bad entry is
    never missed."""

    def zero(self, value):
        return {"rows": 0, "bad": 0, "examples": [], "prefixes": set()}

    def addInPlace(self, a, b):
        from headrace.pipeline.decode import _EXAMPLES

        a["rows"] += b["rows"]
        a["bad"] += b["bad"]
        a["examples"] = (a["examples"] + b["examples"])[:_EXAMPLES]
        a["prefixes"] |= b["prefixes"]
        return a


def entries_accumulator(p):
    if p._static_entries is None:
        p._static_entries = p.spark.sparkContext.accumulator(EntriesParam().zero(None),
                                                             EntriesParam())
    return p._static_entries


def entries_control(acc) -> list[tuple[str, bytes]]:
    """The control rows of what the batch's entries checks added to ``acc`` (then reset)."""
    got = acc.value
    acc.value = EntriesParam().zero(None)
    control = [("rows", str(got["rows"]).encode())]
    control += [("batch", x.encode()) for x in sorted(got["prefixes"])]
    if got["bad"]:
        control.append(("bad", pickle.dumps({"count": got["bad"],
                                             "examples": got["examples"]})))
    return control


def prepare(spark, specs: list[StageSpec], ctx: TaskContextSpec, after: int,
            through: int = 2**63 - 1) -> None:
    """Set the parameters of the next batch for its tasks, on this thread.

    Spark (4.x, adaptive execution on) runs the shuffle map stages of a ``foreachBatch``
    DataFrame before it calls the function (measured: a map stage's tasks read the property
    as it was when the previous call returned), so a batch's parameters are set *ahead*: before
    the query starts (its thread inherits this thread's properties) and at the end of each
    batch, for the next. The tasks echo ``ctx.run_prefix``: ``check`` refuses a batch any of
    whose tasks ran with other parameters, before anything is committed."""
    payload = pickle.dumps((specs, ctx, after, through), protocol=pickle.HIGHEST_PROTOCOL)
    spark.sparkContext.setLocalProperty(PROPERTY, base64.b64encode(payload).decode())


def clear(spark) -> None:
    spark.sparkContext.setLocalProperty(PROPERTY, None)


def check(rows: pa.Table | None, run_prefix: str) -> None:
    """Every task of the batch ran with the parameters of ``run_prefix`` (else raise)."""
    if rows is None:
        return
    seen = {p.decode() for k, p in zip(rows[KIND].to_pylist(), rows[PAYLOAD].to_pylist(),
                                       strict=True) if k == "batch"}
    if seen - {run_prefix}:
        raise RuntimeError(f"static plan: tasks ran with the parameters of {sorted(seen)}, "
                           f"not of this batch ({run_prefix}); nothing was committed")


def _batch():
    """(TaskContext, (specs, ctx, after, through)) of the running task's batch."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    raw = tc.getLocalProperty(PROPERTY) if tc else None
    if raw is None:
        raise RuntimeError(f"static plan task without its {PROPERTY!r} local property: the "
                           "batch was run outside static_batch.commit")
    return tc, pickle.loads(base64.b64decode(raw))


def _table(batches) -> pa.Table | None:
    batches = list(batches)
    if not batches:
        return None
    # Spark may mark a column non-nullable in some batches: same types, so cast
    schema = pa.schema([f.with_nullable(True) for f in batches[0].schema])
    return pa.Table.from_batches([b.cast(schema) for b in batches], schema=schema)


def _check_entries(batches, after: int, through: int, queue: str,
                   tables: dict[str, pa.Schema], max_entry_bytes: int):
    """(the rows the first operator's tables keep, entries counted, bad summary or None) of a
    partition's entries in the batch's range (after, through]."""
    from headrace.pipeline.decode import bad_summary

    rows = _table(batches)
    if rows is None:
        return None, 0, None
    seq = rows[SEQ]
    rows = rows.filter(pc.and_(pc.greater(seq, after), pc.less_equal(seq, through)))
    summary = None
    bad = rows.filter(rows[BAD + "sequence"].is_valid())
    if bad.num_rows:
        summary, _ = bad_summary(pa.table({c: bad[BAD + c] for c in ENTRY_COLUMNS}),
                                 {queue: tables}, max_entry_bytes)
    return rows.filter(rows[SIDE].is_valid()), rows.num_rows, summary


def entries_task(queue: str, tables: dict[str, pa.Schema], max_entry_bytes: int,
                 out: pa.Schema):
    """The first operator's task: the batch's entries of this partition in, its stage out."""

    def fn(batches):
        tc, (specs, ctx, after, through) = _batch()
        kept, n, summary = _check_entries(batches, after, through, queue, tables,
                                          max_entry_bytes)
        control = [("rows", str(n).encode()), ("batch", ctx.run_prefix.encode())]
        if summary is not None:
            control.append(("bad", pickle.dumps(summary)))
        if kept is not None and kept.num_rows:
            names = [c for c in kept.column_names if c != SEQ and not c.startswith(BAD)]
            yield from run_stage_partition(kept.select(names).to_batches(), specs[0], ctx,
                                           tc.partitionId(), tc.attemptNumber())
        yield control_rows(control, out)

    return fn


def checked_task(queue: str, tables: dict[str, pa.Schema], max_entry_bytes: int,
                 table: pa.Schema, acc):
    """Before stateless steps: the batch's entries of this partition in; the rows the table
    keeps out (its columns + W); the count and the bad entries to ``acc``."""

    def fn(batches):
        _, (_, ctx, after, through) = _batch()
        kept, n, summary = _check_entries(batches, after, through, queue, tables,
                                          max_entry_bytes)
        if kept is not None and kept.num_rows:
            yield from kept.select([*table.names, W]).cast(
                pa.schema([*table, pa.field(W, pa.int64())])).to_batches()
        acc.add({"rows": n, "bad": summary["count"] if summary else 0,
                 "examples": summary["examples"] if summary else [],
                 "prefixes": {ctx.run_prefix}})

    return fn


def stepped_task(out: pa.Schema):
    """The first operator behind stateless steps: their rows in, its stage out."""

    def fn(batches):
        tc, (specs, ctx, _, _) = _batch()
        yield control_rows([("batch", ctx.run_prefix.encode())], out)
        rows = _table(batches)
        if rows is not None and rows.num_rows:
            names = [*schema_from_bytes(specs[0].inputs[0]).names, W, BUCKET]
            yield from run_stage_partition(rows.select(names).to_batches(), specs[0], ctx,
                                           tc.partitionId(), tc.attemptNumber())

    return fn


def chained_task(i: int, out: pa.Schema):
    """Operator ``i`` (> 0): the data rows of operator i - 1 in, its stage out; the control
    rows of the stages before pass through to the collect."""

    def fn(batches):
        tc, (specs, ctx, _, _) = _batch()
        rows = _table(batches)
        yield control_rows([("batch", ctx.run_prefix.encode())], out)
        if rows is None:
            return
        kind = rows[KIND]
        data = rows.filter(kind.is_null())
        if data.num_rows:
            names = [*schema_from_bytes(specs[i].inputs[0]).names, W, BUCKET]
            yield from run_stage_partition(data.select(names).to_batches(), specs[i], ctx,
                                           tc.partitionId(), tc.attemptNumber())
        passed = rows.filter(kind.is_valid())
        if passed.num_rows:
            yield control_rows(list(zip(passed[KIND].to_pylist(), passed[PAYLOAD].to_pylist(),
                                        strict=True)), out)

    return fn
