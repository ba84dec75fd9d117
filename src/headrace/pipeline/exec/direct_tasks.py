"""The direct job's tasks (driver/direct_job.py runs the job): one stage of Python tasks over
the queue range of the batch a crash interrupted, no Catalyst plan, no shuffle.

Task i of T fetches every batch of the range, keeps the columnar rows of the tables the operator
reads, buckets them as Spark's plan would (sparkhash: ``pmod(xxhash64(key), buckets)``), keeps
the buckets b with b·T // buckets = i and runs the operator (tasks.run_stage_partition) with the
parameters the static plan's tasks read (static_tasks.batch_params). A task that meets an entry
only the decoder handles (JSON, one that does not decode, a weight of 0) writes nothing and says
so in a ``FALLBACK`` control row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.encoding import sparkhash
from headrace.pipeline.encoding.columnar import columns_option
from headrace.pipeline.errors import NotDirect
from headrace.pipeline.exec.queue_source import read_batches
from headrace.pipeline.exec.static_tasks import batch_params
from headrace.pipeline.exec.tasks import run_stage_partition
from headrace.pipeline.names import BUCKET, KIND, PAYLOAD, SIDE, W

FALLBACK = "fallback"  # a task's control row: this range needs the static plan


def direct_task(url: str, queue: str, todo: list, columns: pa.Schema, structs: list[str],
          schemas: list[pa.Schema], bucket_columns: list[list[str]], buckets: int,
          tasks: int):
    """Task ``index``: every queue batch of the range in; the control rows of its buckets'
    operator stage out (the entries counted by task 0)."""
    option = columns_option(columns)
    tables = list(columns.names)  # the struct columns read_batches adds, one per table
    manifest = f"{queue}/manifest"

    def fn(index, _numbers):
        tc, (specs, ctx, _, _) = batch_params()
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
