"""What a restart does before the streaming query starts (``Pipeline.run``, ``recover``).

``recover_outputs``: the progress shard is the commit point, so after a crash every output
shard is at the progress time or one behind it; the ones behind get batch t-1's output again,
recomputed from the recorded queue range over state v(t-1) (history.py for a history batch);
the graph is reconciled with what has run (evolve.py) and new sinks' shards are linked empty up
to now. ``run_interrupted_batch``: the batch Spark planned but did not commit runs from the
queue before the query starts, on the static plan when the pipeline has its shape.
"""

from __future__ import annotations

import logging
from functools import reduce

from headrace.pipeline import direct
from headrace.pipeline.eventtime import watermark_of
from headrace.pipeline.evolve import GraphChanged, reconcile
from headrace.pipeline.history import replay as replay_history
from headrace.pipeline.history import stored_history
from headrace.pipeline.progress import STATE_KEY, progress_at
from headrace.pipeline.sparklog import interrupted_batch, offset_log_ends
from headrace.pipeline.static import build, static_shape
from headrace.pipeline.static_batch import commit, prepare_next

log = logging.getLogger("headrace.pipeline")


def recover_outputs(p) -> int:
    """Bring every output shard up to the progress shard (replaying batch t-1 for the ones one
    behind, history batches included) and the new sinks' shards to now; returns the time."""
    from headrace.pipeline.runner import PipelineError

    upper = p.persist.upper(p.progress_shard) or 0
    p.time = upper
    p.bindings = progress_at(p.persist, p.progress_shard, upper - 1)
    try:
        evo = reconcile(p.bindings if upper else {}, p.nodes, p.sinks, buckets=p.buckets,
                        backend=p.state_backend, legacy_fingerprint=p.fingerprint,
                        pipeline=p.name)
    except GraphChanged as e:
        raise PipelineError(str(e)) from e
    p._graph = evo.graph
    p._evolution = evo
    if upper and evo.removed:
        log.warning("pipeline %r: removed since the last run (state and shards left as "
                    "they are): %s", p.name, ", ".join(evo.removed))
    if upper and (evo.new_ops or evo.new_sinks):
        log.info("pipeline %r: new parts start at t=%d: operators %s, sinks %s",
                 p.name, upper, evo.new_ops, evo.new_sinks)
    behind, fresh = [], []
    for shard, schema in p._outputs():
        su = p.persist.upper(shard) or 0
        if su == upper:
            continue
        if shard in evo.new_sinks and su == 0:
            fresh.append((shard, schema))
            continue
        if su != upper - 1 or shard in evo.new_sinks:
            raise PipelineError(f"shard {shard!r} is at {su}, progress at {upper}: "
                                "written by something else?")
        behind.append((shard, schema))
    history = stored_history(p.bindings) if behind else None
    if history is not None:  # batch t-1 was a history batch
        log.info("recovering outputs of history batch %d for %s", upper - 1,
                 [s for s, _ in behind])
        replay_history(p, upper - 1, history, behind)
        p.metrics["replayed_batches"] += 1
    elif behind:
        t = upper - 1
        prev = progress_at(p.persist, p.progress_shard, t - 1)
        log.info("recovering outputs of batch %d for %s", t, [s for s, _ in behind])
        entries = reduce(lambda a, b: a.unionByName(b), [
            p._range_df(q, prev.get(q, -1), p.bindings.get(q, -1))
            for q in p.queues])  # an empty range: a no-data batch
        result = p._run_stages(entries, prev.get(STATE_KEY), t=t, write_state=False,
                               shards={s for s, _ in behind},
                               watermark=watermark_of(p.nodes, prev))
        p._link_outputs(result["outputs"], t, behind)
        p.metrics["replayed_batches"] += 1
    for shard, schema in fresh:  # from now: nothing before t; batch t links its output
        p.persist.open_writer(shard).link_parts([], 0, upper, schema)
    return p.time


def interrupted_ends(p) -> dict[str, int] | None:
    """The queue ends of the batch a crash interrupted — in Spark's offset log, not in its
    commit log — when it holds entries our progress has not processed; else None."""
    planned = interrupted_batch(p.checkpoint_dir)
    if planned is None:
        return None
    ends = offset_log_ends(p.checkpoint_dir, p.queues, planned)
    afters = {q: p.bindings.get(q, -1) for q in p.queues}
    if ends is None or all(ends[q] <= afters[q] for q in p.queues):
        return None
    return ends


def runs_direct(p) -> bool:
    """Whether ``run_interrupted_batch`` will try the direct job (direct.py), which starts the
    Python workers itself: a warm-up job beside it would only compete for the cores."""
    return (p.static_plan and direct.shape(static_shape(p)) is not None
            and interrupted_ends(p) is not None)


def run_interrupted_batch(p) -> None:
    """Run the batch a crash interrupted now, over the queue range Spark's offset log names
    (read by executors), instead of after the streaming query's start-up: a restart then does
    not wait for Spark to plan its sources first (measured: ~8 of a 19 s recovery). Spark
    re-runs the batch next, with the same offsets, and ``_process_range`` finds it processed.
    On the static plan's shape it runs as the direct job when it can (direct.py), else as the
    static plan over the range."""
    from headrace.pipeline.runner import PipelineError

    ends = interrupted_ends(p)
    if ends is None:
        return
    afters = {q: p.bindings.get(q, -1) for q in p.queues}
    log.info("running the interrupted batch (through %s) before Spark starts", ends)
    ops = static_shape(p) if p.static_plan else None
    q = p.queues[0]
    through = max(ends[q], afters[q])
    op = direct.shape(ops)
    if op is not None:
        prepare_next(p, through=through)
        try:
            commit(p, direct.collect(p, op, through), ends)
            p.metrics["direct_batches"] += 1
            return
        except direct.NotDirect as e:
            log.info("the interrupted batch runs on the static plan: %s", e)
    try:
        entries = reduce(lambda a, b: a.unionByName(b), [
            p._range_df(q, afters[q], max(ends[q], afters[q])) for q in p.queues])
    except PipelineError as e:  # Spark's own re-run will meet the same queue
        log.warning("not running the interrupted batch early: %s", e)
        return
    if ops is not None:  # the same tasks as the query's batches, over the range
        prepare_next(p, through=through)
        commit(p, build(p, ops, entries), ends)
    else:
        p._process_range(entries, ends)
