"""The logical plan: sources, operators, sinks — checked when the pipeline is defined.

Nodes are plain data. Every node knows its output schema (Arrow, without the weight), so a bad
column, a type mismatch or a reserved name fails at definition time, never in a micro-batch.
``fingerprint`` digests the graph: state written by another graph is refused at recovery.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline import operators
from headrace.pipeline.names import PREFIX

_DDL_TYPES = {"long": pa.int64(), "bigint": pa.int64(), "int": pa.int32(),
              "integer": pa.int32(), "double": pa.float64(), "string": pa.string(),
              "boolean": pa.bool_()}
_SPARK_NAMES = {pa.int64(): "long", pa.int32(): "int", pa.float64(): "double",
                pa.string(): "string", pa.bool_(): "boolean", pa.binary(): "binary"}


def check_names(names: list[str], where: str) -> None:
    """User column names: any name works except the engine's reserved prefix."""
    for n in names:
        if n.startswith(PREFIX):
            raise InvalidInput(f"{where}: column {n!r} uses the reserved prefix {PREFIX!r}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidInput(f"{where}: duplicate column names {dup}")


def parse_schema(spec: str | pa.Schema, where: str = "schema") -> pa.Schema:
    """'a long, b string' or an Arrow schema -> Arrow schema (the types operators support)."""
    if isinstance(spec, pa.Schema):
        schema = spec
    else:
        fields = []
        for part in spec.split(","):
            bits = part.split()
            if len(bits) != 2 or bits[1].lower() not in _DDL_TYPES:
                raise InvalidInput(f"bad column spec {part.strip()!r}: want 'name type' with "
                                   f"type one of {sorted(_DDL_TYPES)}")
            fields.append(pa.field(bits[0].strip("`"), _DDL_TYPES[bits[1].lower()]))
        schema = pa.schema(fields)
    check_names(schema.names, where)
    return schema


def spark_ddl(schema: pa.Schema) -> str:
    bad = [f for f in schema if f.type not in _SPARK_NAMES]
    if bad:
        raise InvalidInput(f"columns {[f.name for f in bad]} have types the pipeline does not "
                           f"carry yet: {[str(f.type) for f in bad]}")
    return ", ".join(f"`{f.name}` {_SPARK_NAMES[f.type]}" for f in schema)


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
    op: int = 0  # index among the operators: part of every state page id
    kind: str = ""
    sources: list[Node] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    bucket_columns: list[list[str]] = field(default_factory=list)  # per input
    state_sides: int = 1

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
class Sink:
    node: Node
    shard: str


def consumers(nodes: list[Node], node: Node) -> list[Operator]:
    return [n for n in nodes if isinstance(n, Operator) and node in n.sources]


def fingerprint(nodes: list[Node], sinks: list[Sink], buckets: int, backend: str) -> str:
    """A digest of the operator graph and state layout; state of another graph is refused.
    The number of Spark tasks is not part of it: it may change on any restart."""
    desc = []
    for n in nodes:
        item = {"name": n.name, "schema": str(n.schema), "type": type(n).__name__}
        if isinstance(n, Operator):
            item.update(op=n.op, kind=n.kind, params=n.params,
                        inputs=[i.name for i in n.inputs])
        if isinstance(n, SourceTable):
            item.update(queue=n.queue, table=n.table)
        desc.append(item)
    desc.append({"sinks": [(s.node.name, s.shard) for s in sinks], "partitions": buckets,
                 "backend": backend})
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:16]
