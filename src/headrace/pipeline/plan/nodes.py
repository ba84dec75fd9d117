"""The logical plan: sources, operators, sinks — checked when the pipeline is defined.

Nodes are plain data. Every node knows its output schema (Arrow, without the weight), so a bad
column, a type mismatch or a reserved name fails at definition time, never in a micro-batch.
``node_digests`` gives each operator and sink a digest of its definition and whole upstream
lineage, so a pipeline that has run can gain parts without disturbing the ones it has
(``evolve.py``); ``fingerprint`` is the older digest of the whole graph, still read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline import operators
from headrace.pipeline.encoding.types import check_names
from headrace.pipeline.names import W


@dataclass(eq=False)
class Node:
    name: str
    schema: pa.Schema  # output columns, without the weight

    @property
    def inputs(self) -> list[Node]:
        return []


@dataclass(eq=False)
class SourceTable(Node):
    queue: str = ""
    table: str = ""
    # only insertions ever arrive (read_stream's internal queue: the ingest writes weight 1);
    # a queue's entries may carry any weight. Not part of the digests: it follows the queue
    insert_only: bool = False
    # a JSON entry that omits one of the columns: "bad" (a bad entry) or "null" (the column is
    # NULL, as Spark's from_json reads it). Not part of the digests: it says which entries are
    # bad, not what a row means
    missing_fields: str = "bad"


MISSING_FIELDS = ("bad", "null")  # what a JSON entry that omits a column of its table is


def check_missing_fields(value, where: str) -> str:
    """``value`` if it is one of MISSING_FIELDS, else InvalidInput naming it."""
    if not isinstance(value, str) or value not in MISSING_FIELDS:
        raise InvalidInput(f"{where}: missing_fields must be 'bad' (an entry that omits a "
                           f"column is a bad entry) or 'null' (the column is NULL), "
                           f"got {value!r}")
    return value


@dataclass(eq=False)
class Operator(Node):
    op: int = 0  # index among the operators: part of every state page id
    kind: str = ""
    sources: list[Node] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    bucket_columns: list[list[str]] = field(default_factory=list)  # per input
    state_sides: int = 1
    # event time (aggregates, joins on it, interval joins): {"columns": [per input],
    # "offsets_us": [per input]} — an input row is late, and state keyed by it is final, once
    # column + offset <= watermark (a window's start + its size = its end); see eventtime.py
    expiry: dict | None = None
    emit_final: bool = False  # append mode: output each group once, when final
    times: dict = field(default_factory=dict)  # event-time output columns: {column: offset µs}

    @property
    def inputs(self) -> list[Node]:
        return self.sources

    def kernel(self):
        return operators.build(self.kind, [s.schema for s in self.sources], self.params)


def make_operator(op: int, kind: str, name: str, inputs: list[Node], params: dict) -> Operator:
    k = operators.build(kind, [i.schema for i in inputs], params)
    check_names(k.output_schema.names, f"operator {name!r}")
    return Operator(name=name, schema=k.output_schema, op=op, kind=kind, sources=inputs,
                    params=params,
                    bucket_columns=[k.bucket_columns(i) for i in range(len(inputs))],
                    state_sides=k.state_sides)


@dataclass(eq=False)
class Map(Node):
    """A stateless step — filter, projection, window expansion — run as Spark expressions on
    the delta. Weights pass through unchanged: every such step is linear over a Z-set (a row
    and its retraction map alike), so no state is needed. ``fn(df)`` takes and returns a
    DataFrame of the node's columns; ``text`` describes it for the fingerprint."""

    source: Node | None = None
    fn: object = None
    text: str = ""
    event_time: str | None = None  # with_watermark: the watermarked column
    delay_us: int | None = None
    declares_watermark: bool = False  # with_watermark itself: its max event time is tracked
    window: tuple[str, int] | None = None  # with_window: (time column, size µs)
    times: dict = field(default_factory=dict)  # event-time columns: {column: offset µs}

    @property
    def inputs(self) -> list[Node]:
        return [self.source]

    def apply(self, df):
        from pyspark.sql import functions as F

        out = self.fn(df)
        return out.select(*[F.col(f"`{c}`") for c in self.schema.names], F.col(W))


@dataclass(eq=False)
class Union(Node):
    """UNION ALL of inputs with the same columns: the Z-sets add up."""

    sources: list[Node] = field(default_factory=list)
    times: dict = field(default_factory=dict)  # time columns of every input (largest offset)

    @property
    def inputs(self) -> list[Node]:
        return self.sources


@dataclass(eq=False)
class Sink:
    node: Node
    shard: str
    mode: str = "update"
    start: str | None = None  # a sink added to a pipeline that has run: "now" (evolve.py)


def consumers(nodes: list[Node], node: Node) -> list[Node]:
    """The nodes that read ``node``'s output."""
    return [n for n in nodes if any(i is node for i in n.inputs)]


def fingerprint(nodes: list[Node], sinks: list[Sink], buckets: int, backend: str) -> str:
    """A digest of the operator graph and state layout; state of another graph is refused.
    The number of Spark tasks is not part of it: it may change on any restart."""
    desc = []
    for n in nodes:
        item = {"name": n.name, "schema": str(n.schema), "type": type(n).__name__,
                "inputs": [i.name for i in n.inputs]}
        if isinstance(n, Operator):
            item.update(op=n.op, kind=n.kind, params=n.params)
        if isinstance(n, SourceTable):
            item.update(queue=n.queue, table=n.table)
        if isinstance(n, Map):
            item.update(text=n.text)
        if isinstance(n, Operator) and (n.expiry or n.emit_final):
            item.update(expiry=n.expiry, emit_final=n.emit_final)
        desc.append(item)
    desc.append({"sinks": [(s.node.name, s.shard, s.mode) for s in sinks], "partitions": buckets,
                 "backend": backend})
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _digest(obj) -> int:
    """63 bits of sha256: fits the progress shard's int64 ``address`` column."""
    raw = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(raw[:8], "big") >> 1


def _definition(n: Node) -> dict:
    """What a node computes, without its inputs. A Map's auto name is left out (its text and
    schema say what it does); an operator's name and ordinal ``op`` are in (its state pages
    are keyed by ``op``: the same kernel at another ordinal would read other state)."""
    item = {"type": type(n).__name__, "schema": str(n.schema)}
    if isinstance(n, SourceTable):
        item.update(queue=n.queue, table=n.table)
    elif isinstance(n, Map):
        item.update(text=n.text, event_time=n.event_time, delay_us=n.delay_us,
                    window=n.window)
    elif isinstance(n, Operator):
        item.update(op=n.op, name=n.name, kind=n.kind, params=n.params, expiry=n.expiry,
                    emit_final=n.emit_final)
    return item


def node_digests(nodes: list[Node], sinks: list[Sink]) -> tuple[dict[int, tuple[str, int]],
                                                                 dict[str, int]]:
    """({op: (name, digest)} of the operators with state, {shard: digest}): each digest covers
    the part's own definition and its whole upstream lineage, so adding nodes elsewhere leaves
    it as it is and changing anything it reads from changes it. A stateless operator (a
    sink's pass-through stage) is covered by its sink's digest."""
    memo: dict[int, int] = {}

    def digest(n: Node) -> int:
        if id(n) not in memo:
            memo[id(n)] = _digest({**_definition(n), "inputs": [digest(i) for i in n.inputs]})
        return memo[id(n)]

    ops = {n.op: (n.name, digest(n)) for n in nodes if isinstance(n, Operator) and n.state_sides}
    out = {s.shard: _digest({"shard": s.shard, "mode": s.mode, "node": digest(s.node)})
           for s in sinks}
    return ops, out


def layout_digest(buckets: int, backend: str) -> int:
    """The state layout: state written under another one cannot be read."""
    return _digest({"buckets": buckets, "backend": backend})


def upstream(node: Node) -> list[Node]:
    """``node`` and every node it reads from, transitively."""
    seen: dict[int, Node] = {}
    todo = [node]
    while todo:
        n = todo.pop()
        if id(n) not in seen:
            seen[id(n)] = n
            todo += n.inputs
    return list(seen.values())
