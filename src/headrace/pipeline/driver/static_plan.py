"""The static plan: a pipeline of one queue table read by one operator, planned once.

Why: PySpark makes every DataFrame call a Python→JVM round trip, and the per-batch job (job.py)
builds a new plan in each micro-batch — ~236 round trips for a group-by, about 40% of its batch
function (docs/pipeline.md, "Where a steady batch's time goes"). Spark's own streaming query plans
in the JVM. Here the plan is built once, on the streaming DataFrame, before the query starts:

    entries → parse (exec/decode.py) → one row per entry: SIDE (which table the first operator
    reads it as), SEQ, the entry if bad, the tables' columns + W → BUCKET → repartition → first
    operator (entries_task) → [BUCKET → repartition → next operator (chained_task)]*

and each batch's parameters — every operator's StageSpec (time, sinks, writer ids), the state's
TaskContextSpec (version read, run prefix) and the range of sequences to process — travel to the
tasks in the Spark local property ``headrace.batch``. Spark runs the shuffle map stages of a
``foreachBatch`` DataFrame before it calls the function, so the driver sets a batch's
parameters ahead: before the query starts and at the end of the batch before (``prepare``); the
tasks echo the batch's run prefix and ``check`` refuses a batch any task of which ran with other
parameters, before anything is committed. The driver's share of a batch is one collect and the
commit.

What each task does is in exec/static_tasks.py.

Shape (``static_shape``): one queue; a chain of operators, the first reading one table or two
different tables (a join), or one table through stateless steps (no watermark or window step:
since a step may drop any row, the entries check runs before them as Spark expressions,
``checked_in_jvm``, so the rows cross into Python once, into the operator's task), each later
one reading only the one before, each but the last read by nothing else; sinks behind any of
them; reservoir state, no event time, no dead-letter shard, no ``read_stream``. The batch a crash interrupted runs the same plan over its queue range
before the query starts (or, with one operator, as direct_job.py's job). Every other pipeline,
and every recovery replay or history batch, runs the per-batch job (job.py).

The driver's side is here (the tasks are exec/static_tasks.py): the shape, the plan, each batch's parameters (set ahead) and its
commit. ``commit`` checks that what was prepared is this batch's (time, state version, queue
position), refreshes the writers' leases the tasks upload under, collects the control rows
(plus, behind stateless steps, what the entries checks counted aside), refuses them if any task
ran with other parameters (``check``), and commits through ``BatchDriver.commit_batch`` like any
batch.
"""

from __future__ import annotations

import base64
import pickle

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from headrace.pipeline.driver.batch import BatchDriver, PreparedBatch
from headrace.pipeline.driver.job import bucket_expr, stage_spec, task_of_bucket
from headrace.pipeline.driver.sparklog import offset_log_ends
from headrace.pipeline.encoding.types import spark_ddl
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.exec.control import CONTROL_SCHEMA, control_rows, stage_schema
from headrace.pipeline.exec.decode import EXAMPLES
from headrace.pipeline.exec.static_tasks import (
    BAD,
    PROPERTY,
    SEQ,
    chained_task,
    checked_task,
    entries_task,
    stepped_task,
)
from headrace.pipeline.exec.tasks import StageSpec, TaskContextSpec
from headrace.pipeline.names import BUCKET, KIND, PAYLOAD, PREFIX, SIDE, W
from headrace.pipeline.plan.nodes import Map, Node, Operator, SourceTable, consumers
from headrace.pipeline.plan.progress import STATE_KEY

BAD_MARK = "headrace: bad entry"  # what checked_in_jvm's tasks stop with


# ---- the shape ---------------------------------------------------------------------------
def static_shape(nodes: list[Node], queues: list[str], *, streams: bool, dead_letter: bool,
                 backend: str) -> list[Operator] | None:
    """The operators, in order, of a pipeline the static plan can run; else None."""
    if len(queues) != 1 or streams or dead_letter or backend != "reservoir":
        return None
    ops = [n for n in nodes if isinstance(n, Operator)]
    if not ops or any(not isinstance(n, Operator | SourceTable | Map) for n in nodes):
        return None
    first = ops[0].sources
    maps = steps(ops[0])
    if maps:
        if (len(first) != 1 or any(m.declares_watermark or m.event_time or m.window
                                   for m in maps)
                or any(consumers(nodes, m) != [after] for m, after in
                       zip(maps, [*maps[1:], ops[0]], strict=True))
                or len([n for n in nodes if isinstance(n, Map)]) != len(maps)):
            return None
    elif (not 1 <= len(first) <= 2 or len({id(s) for s in first}) != len(first)
            or not all(isinstance(s, SourceTable) for s in first)):
        return None
    for before, op in zip(ops, ops[1:], strict=False):
        if op.sources != [before] or consumers(nodes, before) != [op]:
            return None
    if consumers(nodes, ops[-1]):
        return None
    if any(op.expiry is not None or op.emit_final for op in ops):
        return None
    return ops


def shape_of(d: BatchDriver) -> list[Operator] | None:
    """``static_shape`` of the driver's pipeline."""
    return static_shape(d.nodes, d.queues, streams=bool(d.streams),
                        dead_letter=d.dead_letter_shard is not None, backend=d.state_backend)


def steps(first: Operator) -> list[Map]:
    """The stateless steps between the first operator and its table, table first (none when
    it reads tables directly)."""
    out, node = [], first.sources[0] if len(first.sources) == 1 else None
    while isinstance(node, Map):
        out.insert(0, node)
        node = node.source
    return out if isinstance(node, SourceTable) else []


# ---- the plan ----------------------------------------------------------------------------
def build(d: BatchDriver, ops: list[Operator], entries_df, *, checked: bool = False):
    """The static plan over a DataFrame of the queue's entries (the query's stream, or a range
    on recovery): a DataFrame of control rows per batch (the tasks wait for
    ``headrace.batch``). ``checked``: behind stateless steps, the entries are checked in
    Python (``checked_task``), which names every bad entry: the run of a batch that stopped
    on one."""
    from pyspark.sql import functions as F

    decoder = d.decoder()
    first = ops[0]
    maps = steps(first)
    reads = [maps[0].source] if maps else first.sources
    rows = decoder.tagged(decoder.parse(entries_df), reads, SIDE, SEQ, BAD)
    # every table the queue's entries may name, to say what is wrong with a bad one
    tables = {n.table: n.schema for n in d.nodes if isinstance(n, SourceTable)}
    queue = reads[0].queue
    if maps and checked:  # a batch that stopped on a bad entry, run again to name it
        table = reads[0].schema
        rows = rows.mapInArrow(checked_task(queue, tables, d.max_entry_bytes, table,
                                            entries_accumulator(d), decoder.missing_null),
                               spark_ddl(table) + f", `{W}` long")
    elif maps:  # a step may drop any row: the entries are checked before it, in the JVM
        rows = checked_in_jvm(rows, reads[0].schema, d.bindings.get(queue, -1))
    if maps:
        for m in maps:
            rows = m.apply(rows)
        rows = rows.withColumn(BUCKET, bucket_expr(first.bucket_columns[0], d.buckets))
    else:
        buckets = [bucket_expr(first.bucket_columns[i], d.buckets)
                   for i in range(len(first.sources))]
        rows = rows.withColumn(BUCKET, buckets[0] if len(buckets) == 1 else
                               F.when(F.col(SIDE) == F.lit(1), buckets[1]).otherwise(buckets[0]))
    for i, op in enumerate(ops):
        if i:
            rows = rows.withColumn(BUCKET, bucket_expr(op.bucket_columns[0], d.buckets))
        if op.state_sides:  # rows of one key meet their state in one task
            rows = rows.repartition(d.partitions, task_of_bucket(d.buckets, d.partitions))
        out = stage_schema(op.schema) if i < len(ops) - 1 else CONTROL_SCHEMA
        if i:
            task = chained_task(i, out)
        elif maps:
            task = stepped_task(out)
        else:
            task = entries_task(queue, tables, d.max_entry_bytes, out, decoder.missing_null)
        rows = rows.mapInArrow(task, spark_ddl(out))
    return rows


def checked_in_jvm(rows, table: pa.Schema, after: int):
    """The entries check before stateless steps, as Spark expressions: rows stay in the JVM.

    Entries at or before ``after`` (what the pipeline held when the plan was built: a restarted
    query may re-deliver them) are dropped; the queue source counts the rows it reads
    (``rows_accumulator``); other tables' rows are dropped; a bad entry stops the task with
    BAD_MARK before any step can drop it: the query stops, and the batch runs again with the
    Python check, which names every bad entry (restart.run_interrupted_batch, checked; bad
    entries are the exception, not the bulk). Out: the table's columns + W."""
    from pyspark.sql import functions as F

    bad = F.col(f"`{BAD}sequence`")
    where = F.concat(F.lit(f"{BAD_MARK}: queue sequence "), bad.cast("string"),
                     F.lit(" entry "), F.col(f"`{BAD}index`").cast("string"),
                     F.lit(" (task "), F.spark_partition_id().cast("string"), F.lit(")"))
    # the check is a column of its own projection, which Spark evaluates once per row: a
    # filter on decode's columns would be pushed below decode's projections with their
    # expressions inlined, decoding every row twice (measured: Nexmark q1 0.6x slower). The
    # task's partition id in the message makes the projection nondeterministic, which keeps
    # the filter above it; a step's filter then joins ours, after it (Spark keeps the order)
    keep = f"{PREFIX}keep"
    rows = rows.withColumn(keep, F.when(bad.isNotNull(), F.raise_error(where)).otherwise(
        F.col(f"`{SIDE}`").isNotNull() & (F.col(f"`{SEQ}`") > F.lit(after))))
    rows = rows.filter(F.col(f"`{keep}`"))
    return rows.select(*[F.col(f"`{c}`") for c in table.names], F.col(W))


def counts_in_source(ops: list[Operator]) -> bool:
    """Whether the queue source counts the batch's rows (``rows_accumulator``): behind
    stateless steps, where no Python stage sees every entry."""
    return bool(steps(ops[0]))


def source_counter(d: BatchDriver, ops: list[Operator] | None, *, checked: bool = False):
    """The accumulator the queue source counts rows into for a plan of ``ops`` (None: the
    plan counts them itself, or is not the static plan)."""
    if ops is None or checked or not counts_in_source(ops):
        return None
    return rows_accumulator(d)


def rows_accumulator(d: BatchDriver):
    """The accumulator the queue source adds the rows it reads to (its option)."""
    if d.static_rows is None:
        d.static_rows = d.spark.sparkContext.accumulator(0)
    return d.static_rows


def counted_rows(d: BatchDriver) -> int:
    """The rows the source counted since the last call (then reset)."""
    acc = rows_accumulator(d)
    n, acc.value = acc.value, 0
    return int(n)


class EntriesParam(AccumulatorParam):
    """What the entries checks of a batch found, summed over its tasks (steps before the
    first operator may drop any row, so the count and the bad entries cannot travel with
    them). A retried map task adds twice: ``rows`` is then a metric only; a bad entry is
    never missed."""

    def zero(self, value):
        return {"rows": 0, "bad": 0, "examples": [], "prefixes": set()}

    def addInPlace(self, a, b):  # noqa: N802 - pyspark's name
        a["rows"] += b["rows"]
        a["bad"] += b["bad"]
        a["examples"] = (a["examples"] + b["examples"])[:EXAMPLES]
        a["prefixes"] |= b["prefixes"]
        return a


def entries_accumulator(d: BatchDriver):
    if d.static_entries is None:
        d.static_entries = d.spark.sparkContext.accumulator(EntriesParam().zero(None),
                                                            EntriesParam())
    return d.static_entries


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


# ---- a batch's parameters, set ahead -----------------------------------------------------
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
        raise PipelineError(f"static plan: tasks ran with the parameters of {sorted(seen)}, "
                            f"not of this batch ({run_prefix}); nothing was committed")


def prepare_next(d: BatchDriver, through: int = 2**63 - 1) -> None:
    """Set the next batch's parameters for the static plan's tasks (``prepare``)."""
    ops = shape_of(d)
    t, version = d.time, d.bindings.get(STATE_KEY)
    after = d.bindings.get(d.queues[0], -1)
    shards = {s for s, _ in d.outputs()}
    writer_ids = {s: d.persist.open_writer(s).register() for s in sorted(shards)}
    specs = [stage_spec(op, emit_rows=i < len(ops) - 1, t=t, persist_root=d.persist.root,
                        writer_ids=writer_ids, inline_max=d.output_inline_max,
                        sinks=[s.shard for s in d.sinks if s.node is op])
             for i, op in enumerate(ops)]
    ctx = d.task_context(version, t, True)
    if d.static_entries is not None:  # what a skipped batch's checks added: not ours
        entries_control(d.static_entries)
    if d.static_rows is not None:
        counted_rows(d)
    prepare(d.spark, specs, ctx, after, through)
    d.static_next = PreparedBatch(time=t, state_version=version, after=after,
                                  run_prefix=ctx.run_prefix, writer_ids=writer_ids)


# ---- a batch's commit --------------------------------------------------------------------
def process(d: BatchDriver, df, batch_id: int) -> None:
    """The query's ``foreachBatch``: ``df`` is the static plan's control rows."""
    ends = offset_log_ends(d.checkpoint_dir, d.queues, batch_id)
    if ends is None:
        raise PipelineError(f"Spark offset log of batch {batch_id} unreadable; the static "
                            "plan needs it (Pipeline(static_plan=False) probes the batch)")
    commit(d, df, ends)


def commit(d: BatchDriver, df, ends: dict[str, int | None]) -> None:
    """Commit the entries through ``ends`` with ``df``, whose tasks read the parameters
    ``prepare_next`` set; then set the next batch's."""
    q = d.queues[0]
    after = d.bindings.get(q, -1)
    through = max(after, ends[q] if ends.get(q) is not None else -1)
    ops = shape_of(d)
    if through != after:
        prepared = d.static_next
        here = (d.time, d.bindings.get(STATE_KEY), after)
        if prepared is None or prepared.position() != here:
            raise PipelineError(f"pipeline {d.name!r}: the static plan's parameters were "
                                f"prepared for {prepared and prepared.position()}, not for "
                                f"(t, state, after) = {here}; restart it")
        for shard, wid in prepared.writer_ids.items():  # refresh the tasks' upload leases
            if d.persist.open_writer(shard).register() != wid:
                raise PipelineError(f"shard {shard!r}: its writer changed since the batch was "
                                    "prepared; restart the pipeline")

        def run(t: int, version: int | None, shards: set[str]) -> pa.Table:
            rows = df.toArrow()
            if d.static_entries is not None:  # the checked plan (build(checked=True))
                rows = pa.concat_tables([rows, pa.Table.from_batches([control_rows(
                    entries_control(d.static_entries), CONTROL_SCHEMA)])])
            elif counts_in_source(ops):
                rows = pa.concat_tables([rows, pa.Table.from_batches([control_rows(
                    [("rows", str(counted_rows(d)).encode())], CONTROL_SCHEMA)])])
            check(rows, prepared.run_prefix)
            return rows

        d.commit_batch(df, {q: through}, watermark=None, collect=run)
        d.metrics["static_batches"] += 1
    prepare_next(d)  # a skipped batch's map stages may have run: a fresh run prefix
