"""The batch a crash interrupted, as one stage of Python tasks: no Catalyst plan, no shuffle.

Why: a restart's first batch runs in a cold JVM, and on the static plan (static_plan.py) the driver
spends ~3.5 s planning it — the range read, the decoder's projection, the shuffle — before any
task starts; the restart is CPU-bound, so that planning is time lost (docs/pipeline.md,
"Spark's checkpoint"). The recorded queue range is small and known, so each task can read all
of it and keep its own buckets instead:

    driver: list the range's queue batches (the manifest) → an RDD of one number per task →
    task i of T: fetch every batch of the range, keep the columnar rows of the tables the
    operator reads, bucket them as Spark's plan would (sparkhash: ``pmod(xxhash64(key),
    buckets)``), keep the buckets b with b·T // buckets = i, run the operator
    (tasks.run_stage_partition; exec/direct_tasks.py) → the driver collects the control rows and
    commits as any static-plan batch (static_plan.commit: same parameters, same run-prefix
    check, same commit).

The job has one task per core, at most ``partitions`` (``splits_per_batch``); any task may
take any bucket, as on every restart. Reading the range in every task costs that many GETs per
queue batch, as the static plan's first stage pays, and no shuffle.

Shape: the static plan's, with a single operator reading its table(s) directly (no stateless
steps: they are Spark expressions), every key column of a type sparkhash hashes. The range
must hold columnar entries only (encoding/columnar.py): JSON is parsed by Spark's ``from_json``,
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

import pyarrow as pa

from headrace.pipeline.driver.batch import BatchDriver
from headrace.pipeline.driver.job import range_batches
from headrace.pipeline.driver.static_plan import steps
from headrace.pipeline.encoding import sparkhash
from headrace.pipeline.errors import NotDirect, PipelineError, RangeGone
from headrace.pipeline.exec.control import CONTROL_SCHEMA, control_rows
from headrace.pipeline.exec.direct_tasks import FALLBACK, direct_task
from headrace.pipeline.plan.nodes import Operator, SourceTable

log = logging.getLogger("headrace.pipeline")
_TRACEBACK = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


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


class DirectJob:
    """The direct job of one range, shaped as the static plan's DataFrame of control rows:
    ``toArrow()`` runs it (static_plan.commit calls it)."""

    def __init__(self, spark, task, tasks: int):
        self.spark, self.task, self.tasks = spark, task, tasks

    def toArrow(self) -> pa.Table:  # noqa: N802 - the DataFrame method commit calls
        rows = _run(self.spark, self.task, self.tasks)
        refused = [r[1].decode() for r in rows if r[0] == FALLBACK]
        if refused:
            raise NotDirect(refused[0])
        if not rows:
            raise PipelineError("the direct batch's tasks returned nothing")
        return pa.Table.from_batches([control_rows(rows, CONTROL_SCHEMA)])


def collect(d: BatchDriver, op: Operator, through: int) -> DirectJob:
    """The direct job over (after, ``through``] of the pipeline's queue with the parameters
    ``static_plan.prepare_next`` set; its ``toArrow()`` raises NotDirect if a task refused."""
    queue = d.queues[0]
    after = d.bindings.get(queue, -1)
    try:
        todo = range_batches(d.store, queue, after, through)
    except RangeGone as e:  # the static plan reports it as it always has
        raise NotDirect(str(e)) from e
    decoder = d.decoder()
    structs = [decoder.columns.names[decoder.sources.index(s)] for s in op.sources]
    # one task per core, at most ``partitions``: each reads the whole range, so more tasks
    # than cores would only read it more often
    tasks = d.splits_per_batch()
    task = direct_task(d.root, queue, todo, decoder.queue_columns(queue), structs,
                       [s.schema for s in op.sources], op.bucket_columns, d.buckets, tasks)
    return DirectJob(d.spark, task, tasks)


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
