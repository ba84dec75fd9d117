"""The batch a crash interrupted, as one stage of Python tasks: no Catalyst plan, no shuffle.

Why: a restart's first batch runs in a cold JVM, and on the static plan (static.py) the driver
spends ~3.5 s planning it — the range read, the decoder's projection, the shuffle — before any
task starts; the restart is CPU-bound, so that planning is time lost (docs/pipeline.md,
"Spark's checkpoint"). The recorded queue range is small and known, so each task can read all
of it and keep its own buckets instead:

    driver: list the range's queue batches (the manifest) → an RDD of one number per task →
    task i of T: fetch every batch of the range, keep the columnar rows of the tables the
    operator reads, bucket them as Spark's plan would (sparkhash: ``pmod(xxhash64(key),
    buckets)``), keep the buckets b with b·T // buckets = i, run the operator
    (tasks.run_stage_partition) → the driver collects the control rows and commits as any static-plan batch
    (static_batch.commit: same parameters, same run-prefix check, same commit).

The job has one task per core, at most ``partitions`` (``splits_per_batch``); any task may
take any bucket, as on every restart. Reading the range in every task costs that many GETs per
queue batch, as the static plan's first stage pays, and no shuffle.

Shape: the static plan's, with a single operator reading its table(s) directly (no stateless
steps: they are Spark expressions), every key column of a type sparkhash hashes. The range
must hold columnar entries only (pipeline/columnar.py): JSON is parsed by Spark's ``from_json``,
whose semantics this path does not reproduce. A task that meets any other entry (JSON, one that
does not decode, a weight of 0 — all of them handled by the decoder's checks) writes nothing and
says so; the driver then runs the static plan over the range as before. ``HEADRACE_DIRECT_RESTART=0``
turns the path off (for A/B measurements). The RDD's Python workers are the SQL tasks' (same
environment: ``SPARK_SIMPLIFIED_TRACEBACK`` set as SQL sets it), so the query's first batches
find them started.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline import sparkhash
from headrace.pipeline.names import BUCKET, SIDE, W
from headrace.pipeline.plan import Operator, SourceTable
from headrace.pipeline.static import steps
from headrace.pipeline.tasks import CONTROL_SCHEMA, KIND, PAYLOAD, control_rows

log = logging.getLogger("headrace.pipeline")
FALLBACK = "fallback"  # a task's control row: this range needs the static plan
_TRACEBACK = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


class NotDirect(Exception):
    """The range holds entries only the static plan reads (the reason is the message)."""


def shape(ops: list[Operator] | None) -> Operator | None:
    """The operator when the static plan's ``ops`` can run directly; else None."""
    if os.environ.get("HEADRACE_DIRECT_RESTART", "1") == "0" or not ops or len(ops) != 1:
        return None
    op = ops[0]
    if steps(op) or not all(isinstance(s, SourceTable) for s in op.sources):
        return None
    types: dict[str, pa.DataType] = {}
    for i, src in enumerate(op.sources):
        if any(types.setdefault(f.name, f.type) != f.type for f in src.schema):
            return None  # the static plan coalesces a shared name's two types; not here
        if not all(sparkhash.supported(src.schema.field(c).type)
                   for c in op.bucket_columns[i]):
            return None
    return op


def collect(p, op: Operator, through: int):
    """An object whose ``toArrow()`` runs the direct job over (after, ``through``] of the
    pipeline's queue with the parameters ``static_batch.prepare_next`` set, and returns its
    control rows (static_batch.commit calls it); raises NotDirect if a task refused."""
    from headrace.pipeline.job import RangeGone, range_batches
    from headrace.pipeline.runner import PipelineError

    queue = p.queues[0]
    after = p.bindings.get(queue, -1)
    try:
        todo = range_batches(p.store, queue, after, through)
    except RangeGone as e:  # the static plan reports it as it always has
        raise NotDirect(str(e)) from e
    decoder = p._decoder()
    structs = [decoder.columns.names[decoder.sources.index(s)] for s in op.sources]
    # one task per core, at most ``partitions``: each reads the whole range, so more tasks
    # than cores would only read it more often
    tasks = p._splits_per_batch()
    task = _task(p.root, queue, todo, decoder.queue_columns(queue), structs,
                 [s.schema for s in op.sources], op.bucket_columns, p.buckets, tasks)

    class Job:
        def toArrow(self) -> pa.Table:  # noqa: N802 - the DataFrame method commit calls
            rows = _run(p.spark, task, tasks)
            refused = [r[1].decode() for r in rows if r[0] == FALLBACK]
            if refused:
                raise NotDirect(refused[0])
            if not rows:
                raise PipelineError("the direct batch's tasks returned nothing")
            return pa.Table.from_batches([control_rows(rows, CONTROL_SCHEMA)])

    return Job()


def _run(spark, task, tasks: int) -> list[tuple[str, bytes]]:
    """The RDD job, its Python workers started in the pool SQL's tasks use."""
    sc = spark.sparkContext
    env = sc.environment
    added = (spark.conf.get(_TRACEBACK, "true").lower() == "true"
             and "SPARK_SIMPLIFIED_TRACEBACK" not in env)
    if added:
        env["SPARK_SIMPLIFIED_TRACEBACK"] = "1"
    try:
        return sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
            task).collect()
    finally:
        if added:
            env.pop("SPARK_SIMPLIFIED_TRACEBACK", None)


def _task(url: str, queue: str, todo: list, columns: pa.Schema, structs: list[str],
          schemas: list[pa.Schema], bucket_columns: list[list[str]], buckets: int,
          tasks: int):
    """Task ``index``: every queue batch of the range in; the control rows of its buckets'
    operator stage out (the entries counted by task 0)."""
    from headrace.pipeline.columnar import columns_option

    option = columns_option(columns)
    tables = list(columns.names)  # the struct columns read_batches adds, one per table
    manifest = f"{queue}/manifest"

    def fn(index, _numbers):
        from headrace.pipeline.static import _batch
        from headrace.pipeline.tasks import run_stage_partition
        from headrace.spark.queue_source import read_batches

        tc, (specs, ctx, _, _) = _batch()
        pieces = list(read_batches(url, manifest, queue, todo, (0, 1), option))
        rows = pa.Table.from_batches(pieces) if pieces else None
        try:
            kept = _rows(rows, tables, structs, schemas, bucket_columns, buckets, tasks,
                         index)
        except NotDirect as e:
            yield FALLBACK, str(e).encode()
            return
        n = rows.num_rows if rows is not None and index == 0 else 0
        yield "rows", str(n).encode()
        yield "batch", ctx.run_prefix.encode()
        if kept is None or not kept.num_rows:
            return
        for rb in run_stage_partition(kept.to_batches(), specs[0], ctx, tc.partitionId(),
                                      tc.attemptNumber()):
            yield from zip(rb.column(KIND).to_pylist(), rb.column(PAYLOAD).to_pylist(),
                           strict=True)

    return fn


def _rows(rows: pa.Table | None, tables: list[str], structs: list[str],
          schemas: list[pa.Schema], bucket_columns: list[list[str]], buckets: int, tasks: int,
          index: int) -> pa.Table | None:
    """The rows of task ``index``'s buckets as the static plan's first stage gives them to
    the operator: SIDE, the tables' columns, W, BUCKET (``tables``: every struct column of
    the queue; ``structs``: the operator's, per side). NotDirect on any entry only the
    decoder handles."""
    if rows is None or not rows.num_rows:
        return None
    if rows["entry"].null_count != rows.num_rows:
        raise NotDirect("the range holds JSON entries (or columnar ones that do not decode)")
    valid = {}  # struct column -> its rows (filtered: offset 0, so .field() is exact)
    for name in tables:
        col = rows[name].combine_chunks()
        valid[name] = col.filter(col.is_valid())
        # every table's rows, read or not: a weight of 0 is a bad entry
        if pc.any(pc.equal(valid[name].field(W), 0)).as_py():
            raise NotDirect(f"rows of weight 0 (bad entries) in {name}")
    sides = []
    for side, (name, schema, keys) in enumerate(zip(structs, schemas, bucket_columns,
                                                    strict=True)):
        mine = valid[name]
        if not len(mine):
            continue
        n = len(mine)
        bucket = sparkhash.buckets([mine.field(c) for c in keys], n, buckets)
        take = np.flatnonzero(bucket.astype(np.int64) * tasks // buckets == index)
        if not len(take):
            continue
        picked = pa.Table.from_arrays(
            [mine.field(c) for c in schema.names] + [pc.fill_null(mine.field(W), 1)],
            names=[*schema.names, W]).take(take)
        sides.append(picked.append_column(BUCKET, pa.array(bucket[take], pa.int32()))
                     .add_column(0, SIDE, pa.array(np.full(len(take), side, np.int32))))
    if not sides:
        return None
    return pa.concat_tables(sides, promote_options="default")
