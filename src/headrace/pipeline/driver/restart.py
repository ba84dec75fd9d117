"""What a restart does before the streaming query starts (``Pipeline.recover``, trigger.run).

``recover``: the progress shard is the commit point, so after a crash every output shard is at
the progress time or one behind it; the ones behind get batch t-1's output again, recomputed
from the recorded queue range over state v(t-1) (``replay_batch``; a history batch's from its
recorded history range); the graph is reconciled with what has run (plan/evolve.py) and new
sinks' shards are linked empty up to now. Then a change of ``buckets`` re-buckets the state
(rescale.py) and new sinks with ``start="history"`` get their history batch (history.py).
``run_interrupted_batch``: the batch Spark planned but did not commit runs from the queue
before the query starts, on the static plan when the pipeline has its shape.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from headrace.pipeline.driver import direct_job, history, rescale, static_plan
from headrace.pipeline.driver.batch import BatchDriver
from headrace.pipeline.driver.sparklog import interrupted_batch, offset_log_ends
from headrace.pipeline.errors import GraphChanged, NotDirect, PipelineError
from headrace.pipeline.exec.outputs import OutputCollector
from headrace.pipeline.plan.eventtime import watermark_of
from headrace.pipeline.plan.evolve import reconcile
from headrace.pipeline.plan.progress import STATE_KEY, progress_at

log = logging.getLogger("headrace.pipeline")


def recover(d: BatchDriver) -> int:
    """Bring every output up to the progress shard; returns the time to continue at. The graph
    may have gained parts since (plan/evolve.py): new sinks' shards are brought to the current
    time by an empty link, and start from there, or from the queue's retained history
    (history.py). Stored state with another bucket count is re-bucketed after that, as an
    empty batch (rescale.py)."""
    rescale.recover_rescaled(d, lambda: recover_outputs(d))
    return history.run_history(d)


def recover_outputs(d: BatchDriver) -> int:
    """Bring every output shard up to the progress shard (replaying batch t-1 for the ones one
    behind, history batches included) and the new sinks' shards to now; returns the time."""
    upper = d.persist.upper(d.progress_shard) or 0
    d.time = upper
    d.bindings = progress_at(d.persist, d.progress_shard, upper - 1)
    try:
        evo = reconcile(d.bindings if upper else {}, d.nodes, d.sinks, buckets=d.buckets,
                        backend=d.state_backend, legacy_fingerprint=d.fingerprint,
                        pipeline=d.name)
    except GraphChanged as e:
        raise PipelineError(str(e)) from e
    d.graph = evo.graph
    d.evolution = evo
    if upper and evo.removed:
        log.warning("pipeline %r: removed since the last run (state and shards left as "
                    "they are): %s", d.name, ", ".join(evo.removed))
    if upper and (evo.new_ops or evo.new_sinks):
        log.info("pipeline %r: new parts start at t=%d: operators %s, sinks %s",
                 d.name, upper, evo.new_ops, evo.new_sinks)
    behind, fresh = [], []
    for shard, schema in d.outputs():
        su = d.persist.upper(shard) or 0
        if su == upper:
            continue
        if shard in evo.new_sinks and su == 0:
            fresh.append((shard, schema))
            continue
        if su != upper - 1 or shard in evo.new_sinks:
            raise PipelineError(f"shard {shard!r} is at {su}, progress at {upper}: "
                                "written by something else?")
        behind.append((shard, schema))
    if behind:
        replay_batch(d, upper - 1, behind)
    for shard, schema in fresh:  # from now: nothing before t; batch t links its output
        d.persist.open_writer(shard).link_parts([], 0, upper, schema)
    return d.time


def replay_batch(d: BatchDriver, t: int, behind: list[tuple[str, pa.Schema]]) -> None:
    """Recompute the output of committed batch ``t`` for the shards ``behind`` (at t) from its
    recorded queue range over state v(t-1), state not written, and link it. A history batch
    (history.py) replays only its history sinks' lineage, from its history range and with no
    watermark; its other shards get empty links."""
    prev = progress_at(d.persist, d.progress_shard, t - 1)
    stored = history.stored_history(d.bindings)
    if stored is not None:
        afters, shards = stored
        log.info("recovering outputs of history batch %d for %s", t, [s for s, _ in behind])
        wanted = {s for s, _ in behind} & shards
        ranges = {q: (afters.get(q, d.bindings.get(q, -1)), d.bindings.get(q, -1))
                  for q in d.queues}
        nodes = history.lineage(d.nodes, [s for s in d.sinks if s.shard in shards])
        watermark = None
    else:
        log.info("recovering outputs of batch %d for %s", t, [s for s, _ in behind])
        wanted = {s for s, _ in behind}
        # an empty range: a no-data batch
        ranges = {q: (prev.get(q, -1), d.bindings.get(q, -1)) for q in d.queues}
        nodes, watermark = None, watermark_of(d.nodes, prev)
    outputs = OutputCollector()
    if wanted:
        outputs = d.run_stages(d.range_entries(ranges), prev.get(STATE_KEY), t=t,
                               write_state=False, shards=wanted, watermark=watermark,
                               nodes=nodes).outputs
    d.link_outputs(outputs, t, behind)
    d.metrics["replayed_batches"] += 1


def interrupted_ends(d: BatchDriver) -> dict[str, int] | None:
    """The queue ends of the batch a crash interrupted — in Spark's offset log, not in its
    commit log — when it holds entries our progress has not processed; else None."""
    planned = interrupted_batch(d.checkpoint_dir)
    if planned is None:
        return None
    ends = offset_log_ends(d.checkpoint_dir, d.queues, planned)
    afters = {q: d.bindings.get(q, -1) for q in d.queues}
    if ends is None or all(ends[q] <= afters[q] for q in d.queues):
        return None
    return ends


def runs_direct(d: BatchDriver) -> bool:
    """Whether ``run_interrupted_batch`` will try the direct job (direct_job.py), which starts
    the Python workers itself: a warm-up job beside it would only compete for the cores."""
    return (d.static_plan and direct_job.shape(static_plan.shape_of(d)) is not None
            and interrupted_ends(d) is not None)


def run_interrupted_batch(d: BatchDriver, *, checked: bool = False) -> None:
    """Run the batch a crash interrupted now, over the queue range Spark's offset log names
    (read by executors), instead of after the streaming query's start-up: a restart then does
    not wait for Spark to plan its sources first (measured: ~8 of a 19 s recovery). Spark
    re-runs the batch next, with the same offsets, and ``process_range`` finds it processed.
    On the static plan's shape it runs as the direct job when it can (direct_job.py), else as
    the static plan over the range. A batch that stopped on a bad entry (the static plan checks
    entries in the JVM before stateless steps, static_plan.checked_in_jvm) runs ``checked``:
    with the entries checked in Python, which raises the error naming each bad entry."""
    ends = interrupted_ends(d)
    if ends is None:
        return
    afters = {q: d.bindings.get(q, -1) for q in d.queues}
    log.info("running the interrupted batch (through %s) before Spark starts", ends)
    ops = static_plan.shape_of(d) if d.static_plan else None
    q = d.queues[0]
    through = max(ends[q], afters[q])
    op = None if checked else direct_job.shape(ops)
    if op is not None:
        static_plan.prepare_next(d, through=through)
        try:
            static_plan.commit(d, direct_job.collect(d, op, through), ends)
            d.metrics["direct_batches"] += 1
            return
        except NotDirect as e:
            log.info("the interrupted batch runs on the static plan: %s", e)
    try:
        entries = d.range_entries({q: (afters[q], max(ends[q], afters[q])) for q in d.queues},
                                  static_plan.source_counter(d, ops, checked=checked))
    except PipelineError as e:  # Spark's own re-run will meet the same queue
        log.warning("not running the interrupted batch early: %s", e)
        return
    if ops is not None:  # the same tasks as the query's batches, over the range
        static_plan.prepare_next(d, through=through)
        try:
            static_plan.commit(d, static_plan.build(d, ops, entries, checked=checked), ends)
        except Exception as e:
            if checked or static_plan.BAD_MARK not in str(e):
                raise
            run_interrupted_batch(d, checked=True)
        finally:
            d.static_entries = None  # the checked plan's: the query's batches count in the source
    else:
        d.process_range(entries, ends)
