"""The driver's side of the static plan (static.py): each batch's parameters, set ahead, and
its commit.

Spark runs the shuffle map stages of a ``foreachBatch`` DataFrame before it calls the
function, so ``prepare_next`` sets a batch's parameters before the query starts (the query's
thread inherits them) and at the end of the batch before. ``commit`` checks that what was
prepared is this batch's (time, state version, queue position), refreshes the writers' leases
the tasks upload under, collects the control rows (plus, behind stateless steps, what the
entries checks counted aside), refuses them if any task ran with other parameters
(static.check), and commits through ``Pipeline._commit_batch`` like any batch.
"""

from __future__ import annotations

import pyarrow as pa

from headrace.pipeline.progress import STATE_KEY
from headrace.pipeline.sparklog import offset_log_ends
from headrace.pipeline.static import (
    check,
    entries_control,
    prepare,
    static_shape,
)
from headrace.pipeline.tasks import CONTROL_SCHEMA, control_rows


def process(p, df, batch_id: int) -> None:
    """The query's ``foreachBatch``: ``df`` is the static plan's control rows."""
    from headrace.pipeline.runner import PipelineError

    ends = offset_log_ends(p.checkpoint_dir, p.queues, batch_id)
    if ends is None:
        raise PipelineError(f"Spark offset log of batch {batch_id} unreadable; the static "
                            "plan needs it (Pipeline(static_plan=False) probes the batch)")
    commit(p, df, ends)


def commit(p, df, ends: dict[str, int | None]) -> None:
    """Commit the entries through ``ends`` with ``df``, whose tasks read the parameters
    ``prepare_next`` set; then set the next batch's."""
    from headrace.pipeline.runner import PipelineError

    q = p.queues[0]
    after = p.bindings.get(q, -1)
    through = max(after, ends[q] if ends.get(q) is not None else -1)
    if through != after:
        prepared = p._static_next
        if prepared is None or prepared[:3] != (p.time, p.bindings.get(STATE_KEY), after):
            raise PipelineError(f"pipeline {p.name!r}: the static plan's parameters were "
                                f"prepared for {prepared and prepared[:3]}, not for (t, state, "
                                f"after) = ({p.time}, {p.bindings.get(STATE_KEY)}, {after}); "
                                "restart it")
        for shard, wid in prepared[4].items():  # refresh the leases the tasks upload under
            if p.persist.open_writer(shard).register() != wid:
                raise PipelineError(f"shard {shard!r}: its writer changed since the batch was "
                                    "prepared; restart the pipeline")

        def run(t: int, version: int | None, shards: set[str]) -> pa.Table:
            rows = df.toArrow()
            if p._static_entries is not None:  # created by build() behind stateless steps
                rows = pa.concat_tables([rows, pa.Table.from_batches([control_rows(
                    entries_control(p._static_entries), CONTROL_SCHEMA)])])
            check(rows, prepared[3])
            return rows

        p._commit_batch(df, {q: through}, watermark=None, collect=run)
        p.metrics["static_batches"] += 1
    prepare_next(p)  # a skipped batch's map stages may have run: a fresh run prefix


def prepare_next(p, through: int = 2**63 - 1) -> None:
    """Set the next batch's parameters for the static plan's tasks (static.prepare)."""
    from headrace.pipeline.job import stage_spec

    ops = static_shape(p)
    t, version = p.time, p.bindings.get(STATE_KEY)
    after = p.bindings.get(p.queues[0], -1)
    shards = {s for s, _ in p._outputs()}
    writer_ids = {s: p.persist.open_writer(s).register() for s in sorted(shards)}
    specs = [stage_spec(op, emit_rows=i < len(ops) - 1, t=t, persist_root=p.persist.root,
                        writer_ids=writer_ids, inline_max=p.output_inline_max,
                        sinks=[s.shard for s in p.sinks if s.node is op])
             for i, op in enumerate(ops)]
    ctx = p._task_context(version, t, True)
    if p._static_entries is not None:  # what a skipped batch's checks added: not ours
        entries_control(p._static_entries)
    prepare(p.spark, specs, ctx, after, through)
    p._static_next = (t, version, after, ctx.run_prefix, writer_ids)
