"""Evolving a pipeline that has run: which parts of its graph are kept, new or removed.

The progress bindings hold a digest per operator and per sink of its definition and whole
upstream lineage (``plan.node_digests``). On restart the current graph is matched against them:

* a part whose digest is stored is *kept*: an operator keeps its state (pages are keyed by its
  ordinal), a sink continues its shard;
* a stored part missing from the graph is *removed*: its state and shard stay as they are, and
  it is remembered as retired so that its ordinal or shard is never reused over stale data;
* a current part whose digest is not stored is *new* and starts *from now* (time t): an
  operator with empty state, a sink whose shard is first brought to upper t by an empty link;
* an operator whose ordinal is stored with another digest has changed (or a part was inserted
  before it): refused, since its state was computed by another definition.

A layout that differs only in ``buckets`` (same state backend, reservoir) is not refused: the
evolution names the stored bucket count (``rescale_from``) and the driver re-buckets the state
once before the next batch (driver/rescale.py). A new sink written with ``start="history"``
(and the new operators it reads) starts from the queue's retained history instead
(driver/history.py). See docs/pipeline.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.pipeline.errors import GraphChanged
from headrace.pipeline.plan.nodes import (
    Map,
    Node,
    Operator,
    Sink,
    SourceTable,
    layout_digest,
    node_digests,
    upstream,
)
from headrace.pipeline.plan.progress import GRAPH_KEY, WM_KEY, StoredGraph, stored_graph

SINK_STARTS = (None, "now", "history")


@dataclass
class Evolution:
    graph: StoredGraph  # the graph rows every batch from now on commits
    new_ops: list[str] = field(default_factory=list)
    new_sinks: list[str] = field(default_factory=list)  # shards
    removed: list[str] = field(default_factory=list)  # "operator 'x'" / "sink 'shard'"
    rescale_from: int | None = None  # the stored state's buckets, when only they differ


STATE_BACKENDS = ("reservoir", "local+backup")


def stored_layout(layout: int) -> tuple[int, str] | None:
    """(buckets, state backend) of a stored layout digest, the digest being all progress
    holds: searched from 1 bucket up, so the usual counts are found in microseconds (a digest
    of no layout costs the whole range, ~1 s, once, on a refused restart)."""
    for buckets in range(1, 65536):
        for backend in STATE_BACKENDS:
            if layout_digest(buckets, backend) == layout:
                return buckets, backend
    return None


def reconcile(stored: dict[str, int], nodes: list[Node], sinks: list[Sink], *, buckets: int,
              backend: str, legacy_fingerprint: str, pipeline: str) -> Evolution:
    """Match the current graph against the bindings of the last committed batch ({} when
    none was committed); raises GraphChanged naming the part that cannot continue."""
    ops, outs = node_digests(nodes, sinks)
    current = StoredGraph(ops=ops, sinks=outs, layout=layout_digest(buckets, backend))
    if not stored:
        return Evolution(current, new_ops=[n for n, _ in ops.values()], new_sinks=list(outs))
    old = stored_graph(stored)
    if old.layout is None:  # written before per-part digests: only the same graph continues
        if f"{GRAPH_KEY}:{legacy_fingerprint}" not in stored:
            raise GraphChanged(f"pipeline {pipeline!r}: stored progress was written by a "
                               "different operator graph; use a new name or root")
        return Evolution(current)
    was = None
    if old.layout != current.layout:
        found = stored_layout(old.layout)
        if found is None or found[1] != backend:
            then = "unknown" if found is None else repr(found[1])
            raise GraphChanged(f"pipeline {pipeline!r}: stored progress was written by a "
                               "different operator graph: its state layout differs (its "
                               f"state_backend is not {backend!r}: {then}); use the old "
                               "state_backend, or a new name or root")
        was = found[0]
        if backend != "reservoir":
            raise GraphChanged(f"pipeline {pipeline!r}: its state has {was} buckets, "
                               f"buckets={buckets} now: re-bucketing the state needs "
                               f"state_backend='reservoir' (not {backend!r}); use "
                               f"buckets={was}, or a new name or root")
    evo = Evolution(current, rescale_from=was)
    by_op = {n.op: n for n in nodes if isinstance(n, Operator)}
    was = {name: op for op, (name, _) in old.ops.items()}
    for op, (name, _) in sorted(ops.items()):
        if was.get(name, op) != op:
            raise GraphChanged(
                f"pipeline {pipeline!r}: operator {name!r} was operator #{was[name]} and is "
                f"now #{op}: a part was inserted (or removed) before it, and its state is "
                "keyed by its place; add new parts after the existing ones")
    kept: list[Node] = []
    for op, (name, digest) in sorted(ops.items()):
        if op in old.ops and old.ops[op][1] == digest:
            kept.append(by_op[op])
        elif op in old.ops:
            raise GraphChanged(
                f"pipeline {pipeline!r}: operator {name!r} (operator #{op}) does not match the "
                f"stored operator {old.ops[op][0]!r} #{op}: its definition or something "
                "upstream of it changed, or a part was inserted or removed before it; existing "
                "parts must stay as they were — add new parts after them (or use a new name "
                "or root)")
        elif op in old.retired_ops:
            raise GraphChanged(
                f"pipeline {pipeline!r}: operator {name!r} (operator #{op}) would take the "
                f"state of operator {old.retired_ops[op][0]!r}, removed earlier, which is "
                "stale; use a new name or root")
        else:
            evo.new_ops.append(name)
    for shard, digest in outs.items():
        if old.sinks.get(shard) == digest:
            kept += [s.node for s in sinks if s.shard == shard]
        elif shard in old.sinks:
            raise GraphChanged(f"pipeline {pipeline!r}: the sink of shard {shard!r} changed "
                               "(its mode, something upstream of it, or a part was inserted "
                               "before it); the shard holds the old definition's output: add "
                               "new parts after the existing ones, or write to a new shard")
        elif shard in old.retired_sinks:
            raise GraphChanged(f"pipeline {pipeline!r}: shard {shard!r} was written by a sink "
                               "removed earlier and misses the batches since: write to a new "
                               "shard")
        else:
            evo.new_sinks.append(shard)
    current.retired_ops = {**old.retired_ops,
                           **{op: v for op, v in old.ops.items() if op not in ops}}
    current.retired_sinks = {**old.retired_sinks,
                             **{s: d for s, d in old.sinks.items() if s not in outs}}
    evo.removed = ([f"operator {old.ops[op][0]!r}" for op in sorted(old.ops) if op not in ops]
                   + [f"sink {s!r}" for s in sorted(old.sinks) if s not in outs])
    _check_new_parts(stored, nodes, sinks, kept, evo, pipeline)
    return evo


def _check_new_parts(stored: dict[str, int], nodes: list[Node], sinks: list[Sink],
                     kept: list[Node], evo: Evolution, pipeline: str) -> None:
    """New parts start from now: refuse those that cannot be right from there."""
    old_nodes = {id(n) for k in kept for n in upstream(k)}
    stateful = {id(n) for n in nodes if id(n) in old_nodes and isinstance(n, Operator)
                and n.state_sides}

    def old_state_behind(node: Node) -> Operator | None:
        return next((n for n in upstream(node) if n is not node and id(n) in stateful), None)

    new_ops = set(evo.new_ops)
    for n in nodes:
        if isinstance(n, Operator) and n.name in new_ops and n.state_sides:
            old = old_state_behind(n)
            if old is not None:
                raise GraphChanged(
                    f"pipeline {pipeline!r}: new operator {n.name!r} reads {old.name!r}, which "
                    "has state from before: it would see only that operator's changes from now "
                    "(retractions of rows it never saw); seeding it with the current result is "
                    "not built — build it over sources and stateless steps, or use a new name "
                    "or root")
    for s in sinks:
        if s.shard in evo.new_sinks and s.start != "now":
            old = old_state_behind(s.node) or (s.node if id(s.node) in stateful else None)
            if old is not None and s.start == "history":
                raise GraphChanged(
                    f"pipeline {pipeline!r}: new sink {s.shard!r} (start='history') reads "
                    f"{old.name!r}, which has state from before: the history is replayed "
                    "through new parts only; build the sink over sources, stateless steps and "
                    "new operators, or use start='now'")
            if old is not None:
                raise GraphChanged(
                    f"pipeline {pipeline!r}: new sink {s.shard!r} reads {old.name!r}, which "
                    "has state from before: the shard would get only its changes from now, "
                    "not its current result; write_shard(..., start='now') accepts that")
    # new operators a history sink reads start with the history in their state: a new sink
    # from now that reads them would get retractions of rows it never saw, unless it says so
    seeded = {id(n): n for s in sinks if s.shard in evo.new_sinks and s.start == "history"
              for n in upstream(s.node) if isinstance(n, Operator) and n.state_sides}
    for s in sinks:
        if s.shard in evo.new_sinks and s.start is None:
            hit = next((n for n in upstream(s.node) if id(n) in seeded), None)
            if hit is not None:
                raise GraphChanged(
                    f"pipeline {pipeline!r}: new sink {s.shard!r} reads {hit.name!r}, which "
                    "starts from the queue's history (another sink has start='history'): "
                    "write it with start='history' too, or start='now' to get only its "
                    "changes from now")
    bound = {q for q in stored if not q.startswith("__")}
    read = {n.queue for n in nodes if isinstance(n, SourceTable)}
    added = sorted(read - bound - {n.queue for n in nodes
                                   if isinstance(n, SourceTable) and id(n) in old_nodes})
    if added:
        raise GraphChanged(f"pipeline {pipeline!r}: new parts read queue(s) {added}, which it "
                           "did not read before; adding a queue to a pipeline that has run is "
                           "not built (Spark's checkpoint fixes the sources): use a new name "
                           "or root")
    gone = sorted(bound - read)
    if gone:
        raise GraphChanged(f"pipeline {pipeline!r}: queue(s) {gone} are no longer read; "
                           "removing a queue from a pipeline that has run is not built "
                           "(Spark's checkpoint fixes the sources)")
    marks = {n.name: n for n in nodes if isinstance(n, Map) and n.declares_watermark}
    seen = {k.split(":", 1)[1] for k in stored if k.startswith(f"{WM_KEY}:")}
    moved = sorted(seen - set(marks))
    if moved:
        raise GraphChanged(f"pipeline {pipeline!r}: the with_watermark step(s) {moved} are no "
                           "longer where they were (a step was added before them, or they "
                           "were removed): add new parts after the existing ones")
    fresh = [name for name, n in marks.items() if id(n) not in old_nodes]
    if fresh and seen:
        raise GraphChanged(f"pipeline {pipeline!r}: new with_watermark step(s) {fresh} would "
                           "hold back or lower the watermark of the existing parts; new parts "
                           "may use the existing watermarked columns instead")
