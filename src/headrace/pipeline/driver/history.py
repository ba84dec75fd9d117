"""New parts that start from the queue's retained history (``write_shard(start="history")``).

A sink added to a pipeline that has run starts from now by default (plan/evolve.py). With
``start="history"`` it, and the new operators it reads, are first computed over the queue
batches the pipeline has consumed and its queues still hold. ``Pipeline(retain_batches=N)``
keeps the newest N consumed queue batches in each queue (the queue source does not dequeue
them); without it, or past it, there is no history to replay, and a warning says so.

The *history batch*, at time t = upper(progress), run by ``recover`` before the next
micro-batch:

1. the graph checks (plan/evolve.py, at reconcile): every operator with state that a history sink
   reads is new (one with state from before has no history of its own to start from), and any
   other new sink reading such an operator says ``start="now"`` or ``"history"``. A bucket
   change in the same restart is refused (rescale.py): restart once with the old count first;
2. per queue, the history range is (first held sequence - 1, last consumed sequence];
3. one Spark job runs only the history sinks' lineage — sources, stateless steps and the new
   operators, whose state starts empty — over that range, with no watermark: the history is
   one batch, so none of it is late; windows the current watermark closes are expired by the
   next batch;
4. the state is checkpointed (1 PUT) and progress commits t with the queue positions
   unchanged plus the markers ``__history:<queue>`` = the range's start (exclusive) and
   ``__history_sink:<shard>`` = 1;
5. the history sinks' shards link the output at t, every other shard an empty link.

A crash before 4 leaves the parts new: the restart redoes the history batch. A crash after 4
leaves some shard at t: ``recover`` finds the markers in the bindings of t and recomputes the
history sinks' output from the recorded range over state v(t-1), state not written
(restart.replay_batch); other shards get empty links. The range stays readable: nothing is
dequeued until a later micro-batch commits.
"""

from __future__ import annotations

import logging
import time

from headrace.buffer import list_entries
from headrace.pipeline.driver.batch import BatchDriver
from headrace.pipeline.plan.nodes import Node, Sink, upstream

log = logging.getLogger("headrace.pipeline")

HISTORY_KEY = "__history"  # :<queue> -> the history range's start (exclusive)
HISTORY_SINK_KEY = "__history_sink"  # :<shard> -> 1


def lineage(nodes: list[Node], sinks: list[Sink]) -> list[Node]:
    """The nodes the sinks read, transitively, in the pipeline's order."""
    wanted = {id(n) for s in sinks for n in upstream(s.node)}
    return [n for n in nodes if id(n) in wanted]


def history_sinks(sinks: list[Sink], new_sinks: list[str]) -> list[Sink]:
    return [s for s in sinks if s.start == "history" and s.shard in new_sinks]


def run_history(d: BatchDriver) -> int:
    """The history batch of the sinks added with ``start="history"`` (none: nothing to do);
    returns the time to continue at."""
    evo = d.evolution
    sinks = history_sinks(d.sinks, evo.new_sinks) if evo is not None else []
    if not sinks or not d.time:  # a pipeline's first run reads the queue from its start
        return d.time
    t0 = time.perf_counter()
    ranges = {}
    for q in d.queues:
        through = d.bindings.get(q, -1)
        held = [e.sequence for e in list_entries(d.store, f"{q}/manifest", None)
                if e.sequence <= through]
        ranges[q] = (held[0] - 1 if held else through, through)
        if through >= 0 and not held:
            log.warning("pipeline %r: queue %r holds none of the %d batches consumed so far: "
                        "the history of %s is empty (Pipeline(retain_batches=N) keeps the "
                        "newest N)", d.name, q, through + 1, [s.shard for s in sinks])
    entries = d.range_entries(ranges)
    marks = {**{f"{HISTORY_KEY}:{q}": after for q, (after, _) in ranges.items()},
             **{f"{HISTORY_SINK_KEY}:{s.shard}": 1 for s in sinks}}
    t = d.time
    d.commit_batch(entries, {q: through for q, (_, through) in ranges.items()},
                   watermark=None, nodes=lineage(d.nodes, sinks),
                   shards={s.shard for s in sinks}, marks=marks)
    d.metrics["history_batches"] += 1
    d.last_history = {"time": t, "shards": sorted(s.shard for s in sinks),
                      "queue_batches": sum(through - after for after, through in ranges.values()),
                      "ranges": {q: [after + 1, through] for q, (after, through) in
                                 ranges.items()},
                      "input_rows": d.last_batch["input_rows"],
                      "seconds": round(time.perf_counter() - t0, 3)}
    log.info("pipeline %r: history batch t=%d for %s: queue batches %s",
             d.name, t, d.last_history["shards"], d.last_history["ranges"])
    return d.time


def stored_history(bindings: dict[str, int]) -> tuple[dict[str, int], set[str]] | None:
    """({queue: range start}, history shards) when ``bindings`` are a history batch's."""
    queues = {k.split(":", 1)[1]: v for k, v in bindings.items()
              if k.startswith(f"{HISTORY_KEY}:")}
    shards = {k.split(":", 1)[1] for k in bindings if k.startswith(f"{HISTORY_SINK_KEY}:")}
    return (queues, shards) if shards else None
