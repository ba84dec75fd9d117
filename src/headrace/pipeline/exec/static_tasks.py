"""The static plan's tasks (driver/static_plan.py builds the plan): each reads its batch's
parameters from the Spark local property ``headrace.batch``, which the driver sets ahead.

The first operator's task does what the per-batch job does in two branches: it keeps the
entries in the range (a restarted query may re-deliver entries already processed), counts them,
describes the bad ones (as decode.entries_task; no entry is dropped without a trace), and
runs the kernel over the rows its tables keep (tasks.run_stage_partition). Bad entries and entries of
other tables travel with the others (their bucket is the hash of NULL keys), so no second branch
reads the entries again. Each later operator's task runs its kernel over the data rows of the
one before and passes that stage's control rows on, so they all reach the last stage's collect
and nothing is persisted. Behind stateless steps the entries are checked before them in
the JVM (driver/static_plan.py ``checked_in_jvm``); ``checked_task`` checks them in Python when
a batch with a bad entry is run again to name it, reporting through an accumulator.
"""

from __future__ import annotations

import base64
import pickle

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from headrace.pipeline.encoding.ipc import schema_from_bytes
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.exec.control import control_rows
from headrace.pipeline.exec.decode import ENTRY_COLUMNS, bad_summary
from headrace.pipeline.exec.tasks import run_stage_partition
from headrace.pipeline.names import BUCKET, KIND, PAYLOAD, PREFIX, SIDE, W

PROPERTY = "headrace.batch"
SEQ = f"{PREFIX}seq"
BAD = f"{PREFIX}bad_"  # + each of ENTRY_COLUMNS


def batch_params():
    """(TaskContext, (specs, ctx, after, through)) of the running task's batch."""

    tc = TaskContext.get()
    raw = tc.getLocalProperty(PROPERTY) if tc else None
    if raw is None:
        raise PipelineError(f"static plan task without its {PROPERTY!r} local property: "
                            "the batch was run outside static_plan.commit")
    return tc, pickle.loads(base64.b64decode(raw))


def _table(batches) -> pa.Table | None:
    batches = list(batches)
    if not batches:
        return None
    # Spark may mark a column non-nullable in some batches: same types, so cast
    schema = pa.schema([f.with_nullable(True) for f in batches[0].schema])
    return pa.Table.from_batches([b.cast(schema) for b in batches], schema=schema)


def _check_entries(batches, after: int, through: int, queue: str,
                   tables: dict[str, pa.Schema], max_entry_bytes: int,
                   missing_null: frozenset):
    """(the rows the first operator's tables keep, entries counted, bad summary or None) of a
    partition's entries in the batch's range (after, through]; ``missing_null``: the (queue,
    table)s that read a missing field as NULL."""
    rows = _table(batches)
    if rows is None:
        return None, 0, None
    seq = rows[SEQ]
    rows = rows.filter(pc.and_(pc.greater(seq, after), pc.less_equal(seq, through)))
    summary = None
    bad = rows.filter(rows[BAD + "sequence"].is_valid())
    if bad.num_rows:
        summary, _ = bad_summary(pa.table({c: bad[BAD + c] for c in ENTRY_COLUMNS}),
                                 {queue: tables}, max_entry_bytes, missing_null)
    return rows.filter(rows[SIDE].is_valid()), rows.num_rows, summary


def entries_task(queue: str, tables: dict[str, pa.Schema], max_entry_bytes: int,
                 out: pa.Schema, missing_null: frozenset):
    """The first operator's task: the batch's entries of this partition in, its stage out."""

    def fn(batches):
        tc, (specs, ctx, after, through) = batch_params()
        kept, n, summary = _check_entries(batches, after, through, queue, tables,
                                          max_entry_bytes, missing_null)
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
                 table: pa.Schema, acc, missing_null: frozenset):
    """Before stateless steps: the batch's entries of this partition in; the rows the table
    keeps out (its columns + W); the count and the bad entries to ``acc``."""

    def fn(batches):
        _, (_, ctx, after, through) = batch_params()
        kept, n, summary = _check_entries(batches, after, through, queue, tables,
                                          max_entry_bytes, missing_null)
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
        tc, (specs, ctx, _, _) = batch_params()
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
        tc, (specs, ctx, _, _) = batch_params()
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
