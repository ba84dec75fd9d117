"""The logical plan a Pipeline builds: sources, stateful operators, sinks.

Nodes are plain data; ``Pipeline`` turns them into Spark work per micro-batch. Every node knows
its output schema (Arrow, without the weight column) so operators can be checked when the
pipeline is defined, not when the first batch arrives.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.spark.kernels import DIFF, AggregateKernel, DistinctKernel, JoinKernel

_DDL_TYPES = {"long": pa.int64(), "bigint": pa.int64(), "int": pa.int32(),
              "integer": pa.int32(), "double": pa.float64(), "string": pa.string(),
              "boolean": pa.bool_()}


def parse_schema(spec: str | pa.Schema) -> pa.Schema:
    """'a long, b string' or an Arrow schema -> Arrow schema (the types operators support)."""
    if isinstance(spec, pa.Schema):
        return spec
    fields = []
    for part in spec.split(","):
        bits = part.split()
        if len(bits) != 2 or bits[1].lower() not in _DDL_TYPES:
            raise InvalidInput(f"bad column spec {part.strip()!r}: want 'name type' with type "
                               f"one of {sorted(_DDL_TYPES)}")
        fields.append(pa.field(bits[0], _DDL_TYPES[bits[1].lower()]))
    return pa.schema(fields)


def spark_ddl(schema: pa.Schema) -> str:
    names = {pa.int64(): "long", pa.int32(): "int", pa.float64(): "double",
             pa.string(): "string", pa.bool_(): "boolean"}
    return ", ".join(f"`{f.name}` {names[f.type]}" for f in schema)


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


@dataclass(eq=False)
class Operator(Node):
    op: int = 0
    kind: str = ""
    sources: list[Node] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    key_columns: list[list[str]] = field(default_factory=list)  # per input: the bucketing key

    @property
    def inputs(self) -> list[Node]:
        return self.sources


def make_operator(op: int, kind: str, name: str, inputs: list[Node], params: dict) -> Operator:
    if kind == "aggregate":
        k = AggregateKernel(inputs[0].schema, params["by"], params["aggs"])
        keys = [list(params["by"])]
    elif kind == "join":
        k = JoinKernel(inputs[0].schema, inputs[1].schema, params["on"])
        keys = [list(params["on"]), list(params["on"])]
    elif kind == "distinct":
        k = DistinctKernel(inputs[0].schema)
        keys = [list(inputs[0].schema.names)]
    else:
        raise InvalidInput(f"unknown operator kind {kind!r}")
    out = pa.schema([f for f in k.output_schema if f.name != DIFF])
    return Operator(name=name, schema=out, op=op, kind=kind, sources=inputs, params=params,
                    key_columns=keys)


@dataclass(eq=False)
class Sink:
    node: Node
    shard: str


def fingerprint(nodes: list[Node], sinks: list[Sink], partitions: int, backend: str) -> str:
    """A digest of the operator graph; state written by another graph is refused."""
    desc = []
    for n in nodes:
        item = {"name": n.name, "schema": str(n.schema), "type": type(n).__name__}
        if isinstance(n, Operator):
            item.update(op=n.op, kind=n.kind, params=n.params,
                        inputs=[i.name for i in n.inputs])
        if isinstance(n, SourceTable):
            item.update(queue=n.queue, table=n.table)
        desc.append(item)
    desc.append({"sinks": [(s.node.name, s.shard) for s in sinks], "partitions": partitions,
                 "backend": backend})
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:16]
