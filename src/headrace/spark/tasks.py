"""What runs inside a Spark task: one operator over the buckets of one shuffle partition.

Input: Arrow record batches with the operator's input columns, ``__w`` (weight), ``__bucket``
and, for joins, ``__side``. Output: Arrow rows ``(kind, bucket, payload)`` where kind is

- ``"out"``: payload = the bucket's output delta as Arrow IPC;
- ``"run"``: payload = the pickled :class:`PageRun` of this task's state changes (full files
  already uploaded by the task, small leftovers inline for the driver to bundle);
- ``"indexes"``: (local+backup backend) JSON {bucket key: new backup snapshot index id};
- ``"metrics"``: payload = JSON object-store request counts of this task.

The spec travels to executors by pickling, so it holds only plain values (schemas as IPC).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.spark.kernels import AggregateKernel, DistinctKernel, JoinKernel, W
from headrace.spark.local_state import LocalBackupBucketState, bucket_key
from headrace.spark.state import BucketState, open_reader, task_store

TASK_OUTPUT_SCHEMA = pa.schema([("kind", pa.string()), ("bucket", pa.int32()),
                                ("payload", pa.binary())])
BUCKET = "__bucket"
SIDE = "__side"


def schema_to_bytes(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def schema_from_bytes(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def table_to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def table_from_ipc(data) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


@dataclass
class OperatorSpec:
    op: int
    kind: str  # "aggregate" | "join" | "distinct"
    inputs: list[bytes]  # input schemas (without __w), IPC-serialized
    params: dict = field(default_factory=dict)

    def kernel(self):
        schemas = [schema_from_bytes(b) for b in self.inputs]
        if self.kind == "aggregate":
            return AggregateKernel(schemas[0], self.params["by"], self.params["aggs"])
        if self.kind == "join":
            return JoinKernel(schemas[0], schemas[1], self.params["on"])
        if self.kind == "distinct":
            return DistinctKernel(schemas[0])
        raise ValueError(f"unknown operator kind {self.kind!r}")


@dataclass
class TaskContextSpec:
    """Where state lives and which version this micro-batch reads."""

    url: str
    stream: str
    state_version: int | None
    run_prefix: str  # unique per micro-batch attempt; the task adds partition + attempt
    cache_dir: str | None = None
    write_state: bool = True
    # the local+backup backend: spines on executor disk, one backup snapshot per bucket
    backend: str = "reservoir"
    local_root: str | None = None
    pipeline: str = ""
    indexes: dict = field(default_factory=dict)  # bucket key -> snapshot index id to read
    checkpoint_id: str = ""


def run_operator_partition(batches, spec: OperatorSpec, ctx: TaskContextSpec,
                           partition_id: int, attempt: int):
    """Apply ``spec``'s kernel to every bucket in these batches; yield TASK_OUTPUT batches."""
    from headrace.reservoir import PageRunWriter

    batches = list(batches)
    if not batches:
        return
    table = pa.Table.from_batches(batches)
    if table.num_rows == 0:
        return
    kernel = spec.kernel()
    schemas = [schema_from_bytes(b) for b in spec.inputs]
    store = task_store(ctx.url)
    before = store.counts()
    local = ctx.backend == "local+backup"
    reader = None if local else open_reader(ctx.url, ctx.stream, ctx.state_version,
                                            ctx.cache_dir)
    writer = None if local else PageRunWriter(
        store, stream=ctx.stream, run_id=f"{ctx.run_prefix}-p{partition_id}-a{attempt}")
    new_indexes: dict[str, str] = {}

    def open_state(side: int, bucket: int):
        if not local:
            return BucketState(reader, spec.op, side, bucket)
        key = bucket_key(spec.op, side, bucket)
        return LocalBackupBucketState(ctx.local_root, store, ctx.pipeline, spec.op, side,
                                      bucket, ctx.indexes.get(key))

    def finish_state(st) -> None:
        if not local:
            if ctx.write_state:
                st.write(writer)
        elif ctx.write_state:
            index = st.commit(ctx.checkpoint_id)
            if index is not None:
                new_indexes[st.key] = index
        else:
            st.close()
    kinds, buckets, payloads = [], [], []
    # a task usually holds several buckets: sort once, then take each bucket as a slice
    table = table.sort_by(BUCKET)
    ids = table[BUCKET].to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        bucket = int(ids[lo])
        rows = table.slice(lo, hi - lo)
        if spec.kind == "join":
            left = _side(rows, 0, schemas[0])
            right = _side(rows, 1, schemas[1])
            ls = open_state(0, bucket)
            rs = open_state(1, bucket)
            out = kernel.apply(left, right, ls, rs)
            states = [ls, rs]
        else:
            delta = rows.select(schemas[0].names + [W])
            st = open_state(0, bucket)
            out = kernel.apply(delta, st)
            states = [st]
        for st in states:
            finish_state(st)
        if out.num_rows:
            kinds.append("out")
            buckets.append(bucket)
            payloads.append(table_to_ipc(out))
    if ctx.write_state and not local:
        kinds.append("run")
        buckets.append(-1)
        payloads.append(pickle.dumps(writer.finish(), protocol=pickle.HIGHEST_PROTOCOL))
    if new_indexes:
        kinds.append("indexes")
        buckets.append(-1)
        payloads.append(json.dumps(new_indexes).encode())
    after = store.counts()
    kinds.append("metrics")
    buckets.append(-1)
    payloads.append(json.dumps({k: after[k] - before[k] for k in after}).encode())
    yield pa.RecordBatch.from_arrays(
        [pa.array(kinds, pa.string()), pa.array(buckets, pa.int32()),
         pa.array(payloads, pa.binary())], schema=TASK_OUTPUT_SCHEMA)


def _side(rows: pa.Table, side: int, schema: pa.Schema) -> pa.Table:
    part = rows.filter(pc.equal(rows[SIDE], side))
    return pa.Table.from_arrays([pc.cast(part[n], schema.field(n).type) for n in schema.names]
                                + [pc.cast(part[W], pa.int64())], names=schema.names + [W])
