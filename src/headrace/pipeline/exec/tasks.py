"""What runs inside a Spark task: one operator over the state buckets of one shuffle partition.

Input: Arrow record batches with the operator's input columns, ``W``, ``BUCKET`` and, for a
two-input operator, ``SIDE``. Output: rows of the stage schema (control.py) — ``KIND``,
``PAYLOAD``, then the operator's output columns and ``W``: data rows (the output delta, kept on
the executors for the next operator) and the few control rows the driver collects.

Specs travel to executors by pickling, so they hold only plain values (schemas as IPC). The
state, the reservoir's writer and the output parts are imported where a task first needs them
(exec/workers.py says why).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline import operators
from headrace.pipeline.encoding.ipc import schema_from_bytes, table_to_ipc
from headrace.pipeline.errors import NegativeMultiplicity, PipelineError
from headrace.pipeline.exec.control import CONTROL_SCHEMA, control_rows, stage_schema
from headrace.pipeline.exec.workers import open_reader, task_store
from headrace.pipeline.names import BUCKET, SIDE, W
from headrace.pipeline.operators.kernel import Expires, Kernel, RoutesKeys

INLINE_MAX = 256 * 1024  # an output part smaller than this goes to the driver, not to a PUT
STATE_FILE_BYTES = 16 << 20  # a task uploads its own state file past this; less goes inline
TASK_LEVEL_ROWS_PER_BUCKET = 4096  # below: one kernel call for all of a task's buckets


@dataclass
class StageSpec:
    """One operator's work in a micro-batch."""

    op: int
    kind: str
    inputs: list[bytes]  # input schemas (without W), IPC
    output: bytes  # output schema (without W), IPC
    params: dict = field(default_factory=dict)
    emit_rows: bool = False  # another operator consumes the output: keep it as data rows
    sinks: list[str] = field(default_factory=list)  # shards this operator's output goes to
    writer_ids: dict = field(default_factory=dict)  # shard -> the driver's registered writer
    time: int = 0  # the pipeline time of this micro-batch (the sinks' update time)
    persist_root: str = "persist"
    inline_max: int = INLINE_MAX
    # event time: (encoded group-key bound, emit) — drop groups below the bound from state
    # (windows the watermark closed); emit = append mode: only those final rows are output
    expire: tuple[bytes, bool] | None = None

    def kernel(self) -> Kernel:
        return operators.build(self.kind, [schema_from_bytes(b) for b in self.inputs],
                               self.params)


@dataclass
class TaskContextSpec:
    """Where state lives and which version this micro-batch reads."""

    url: str
    stream: str
    state_version: int | None
    run_prefix: str  # unique per micro-batch attempt; the task adds partition + attempt
    cache_dir: str | None = None
    write_state: bool = True
    write_outputs: bool = True
    # the local+backup backend: spines on executor disk, one backup snapshot per bucket
    backend: str = "reservoir"
    local_root: str | None = None
    pipeline: str = ""
    indexes: dict = field(default_factory=dict)  # bucket key -> snapshot index id to read
    checkpoint_id: str = ""


class _States:
    """Opens and finishes the state of (operator, side, bucket) for the configured backend."""

    def __init__(self, spec: StageSpec, ctx: TaskContextSpec, store, partition_id: int,
                 attempt: int):
        from headrace.reservoir import PageRunWriter, ReservoirOptions  # on first use

        self.spec, self.ctx, self.store = spec, ctx, store
        self.local = ctx.backend == "local+backup"
        self.reader = None if self.local else open_reader(ctx.url, ctx.stream,
                                                          ctx.state_version, ctx.cache_dir)
        self.writer = None if self.local or not ctx.write_state else PageRunWriter(
            store, stream=ctx.stream, run_id=f"{ctx.run_prefix}-p{partition_id}-a{attempt}",
            options=ReservoirOptions(max_file_size=STATE_FILE_BYTES))
        self.new_indexes: dict[str, str] = {}
        self.refused: list[dict] = []  # NegativeMultiplicity reports (control rows)

    def open(self, side: int, bucket: int):
        if not self.local:
            from headrace.pipeline.state import BucketLSM  # on first use

            return BucketLSM(self.reader, self.spec.op, side, bucket, shared_cache=True)
        from headrace.pipeline.state.local_backup import LocalBackupBucketState, bucket_key

        key = bucket_key(self.spec.op, side, bucket)
        return LocalBackupBucketState(self.ctx.local_root, self.store, self.ctx.pipeline,
                                      self.spec.op, side, bucket, self.ctx.indexes.get(key))

    def refuse(self, e: NegativeMultiplicity, opened: list) -> None:
        """The kernel refused this apply: record why, write none of its state (a reservoir
        state's changes stay in memory; a local one is closed uncommitted, and the next
        open restores the committed snapshot)."""
        self.refused.append({"op": self.spec.op, "keys": e.keys, "what": e.what})
        if self.local:
            for st in opened:
                st.close()

    def finish(self, st) -> None:
        if not self.local:
            if self.writer is not None:
                st.write(self.writer)
        elif self.ctx.write_state:
            index = st.commit(self.ctx.checkpoint_id)
            if index is not None:
                self.new_indexes[st.key] = index
        else:
            st.close()


def run_stage_partition(batches, spec: StageSpec, ctx: TaskContextSpec, partition_id: int,
                        attempt: int):
    """Apply the operator to every bucket in these batches; yield stage-schema batches."""
    batches = list(batches)
    if not batches or sum(b.num_rows for b in batches) == 0:
        return
    table = pa.Table.from_batches(batches)
    kernel = spec.kernel()
    schemas = [schema_from_bytes(b) for b in spec.inputs]
    out_schema = schema_from_bytes(spec.output)
    store = task_store(ctx.url)
    before = store.counts()
    states = _States(spec, ctx, store, partition_id, attempt)
    if isinstance(kernel, RoutesKeys) and _task_level(spec, states, table):
        outs = [_apply_task(kernel, kernel, table, schemas, states)]
    else:
        outs = _apply_per_bucket(kernel, table, schemas, states, spec)
    outs = [o for o in outs if o.num_rows]
    out = (pa.concat_tables(outs) if outs
           else pa.schema([*out_schema, pa.field(W, pa.int64())]).empty_table())
    # a last operator's output goes to its sinks only: its stage yields control rows alone
    full = stage_schema(out_schema) if spec.emit_rows else CONTROL_SCHEMA
    if spec.emit_rows and out.num_rows:
        yield _data_rows(out, full)
    control: list[tuple[str, bytes]] = []
    if ctx.write_outputs:
        control += _outputs(out, spec, store)
    if states.writer is not None:
        control.append(("run", pickle.dumps(states.writer.finish(),
                                            protocol=pickle.HIGHEST_PROTOCOL)))
    if states.new_indexes:
        control.append(("indexes", json.dumps(states.new_indexes).encode()))
    control += [("negative", pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL))
                for r in states.refused]
    after = store.counts()
    control.append(("metrics", json.dumps({k: after[k] - before[k] for k in after}).encode()))
    yield control_rows(control, full)


def _task_level(spec: StageSpec, states: _States, table: pa.Table) -> bool:
    """Whether to run a kernel that names its state keys (RoutesKeys) once for all the task's
    buckets: with reservoir state, no event-time expiry (per bucket), and a delta small per
    bucket — the per-bucket fixed cost is what one call saves (measured, 1M keys: 62 vs 100 ms
    per task at 625 rows per bucket, equal at 3k, and per bucket wins at 30k, where one call's
    hashing and sorting of 250k keys costs more than 8 calls of 31k)."""
    if spec.expire is not None or states.local:
        return False
    buckets = len(np.unique(table[BUCKET].to_numpy()))
    return table.num_rows <= TASK_LEVEL_ROWS_PER_BUCKET * buckets


def _apply_task(kernel: Kernel, routes: RoutesKeys, table: pa.Table,
                schemas: list[pa.Schema], states: _States) -> pa.Table:
    """The kernel once over all of the task's buckets: per state side a TaskState routes each
    state key to the bucket its delta row names (``routes``: the kernel, as RoutesKeys;
    state/task.py)."""
    from headrace.pipeline.state.task import Router, TaskState  # on first use

    if len(schemas) == 2:
        sides = [table.filter(pc.equal(table[SIDE], i)) for i in range(2)]
        deltas = [_columns(rows, schemas[i]) for i, rows in enumerate(sides)]
    else:
        sides = [table]
        deltas = [_columns(table, schemas[0])]
    buckets = [np.asarray(rows[BUCKET].to_numpy(), np.int64) for rows in sides]
    ids = np.unique(np.concatenate(buckets)).tolist()
    router = None
    if len(ids) > 1:
        router = Router([(keys, buckets[i]) for i, keys in routes.route_keys(deltas)])
    opened = [TaskState({b: states.open(s, b) for b in ids}, router)
              for s in range(kernel.state_sides)]
    try:
        out = kernel.apply(deltas, opened)
    except NegativeMultiplicity as e:
        states.refuse(e, opened)
        return _no_rows(kernel)
    for st in opened:
        states.finish(st)
    return out


def _apply_per_bucket(kernel: Kernel, table: pa.Table, schemas: list[pa.Schema], states: _States,
                      spec: StageSpec) -> list[pa.Table]:
    """The kernel once per bucket (the local+backup backend, event-time expiry)."""
    expires = kernel if isinstance(kernel, Expires) else None
    if spec.expire is not None and expires is None:
        raise PipelineError(f"operator {spec.op} ({spec.kind}) has no event-time state to "
                            "expire")
    outs = []
    # a task holds several buckets: sort once, then take each bucket as a slice
    table = table.sort_by(BUCKET)
    ids = table[BUCKET].to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        bucket = int(ids[lo])
        rows = table.slice(lo, hi - lo)
        if spec.expire is not None:  # weight-0 rows only make every bucket expire its windows
            rows = rows.filter(pc.not_equal(rows[W], 0))
        if len(schemas) == 2:
            deltas = [_side(rows, i, schemas[i]) for i in range(2)]
        else:
            deltas = [_columns(rows, schemas[0])]
        opened = [states.open(s, bucket) for s in range(kernel.state_sides)]
        try:
            out = kernel.apply(deltas, opened) if rows.num_rows or spec.expire is None else None
        except NegativeMultiplicity as e:
            states.refuse(e, opened)
            continue
        if spec.expire is not None and expires is not None:
            below, emit = spec.expire
            final = expires.expire(opened, below, emit)
            out = final if emit or out is None else pa.concat_tables([out, final])
        for st in opened:
            states.finish(st)
        outs.append(out)
    return outs


def _no_rows(kernel: Kernel) -> pa.Table:
    return pa.schema([*kernel.output_schema, pa.field(W, pa.int64())]).empty_table()


def _outputs(out: pa.Table, spec: StageSpec, store) -> list[tuple[str, bytes]]:
    """Each sink's share of this task's output: uploaded as a part, or inline when small."""
    from headrace.pipeline.exec.outputs import DIFF, TIME, upload_task_part  # on first use

    if not spec.sinks or out.num_rows == 0:
        return []
    names = [n for n in out.column_names if n != W]
    part = pa.Table.from_arrays(
        [out[n] for n in names] + [pa.array(np.full(out.num_rows, spec.time, np.uint64)),
                                   pc.cast(out[W], pa.int64())],
        names=[*names, TIME, DIFF])
    control = []
    inline = part.nbytes <= spec.inline_max
    for shard in spec.sinks:
        if inline:
            control.append(("out", pickle.dumps((shard, table_to_ipc(part)))))
        else:
            meta = upload_task_part(store, shard, spec.writer_ids[shard], part,
                                    spec.persist_root)
            control.append(("part", pickle.dumps((shard, meta))))
    return control


def _data_rows(out: pa.Table, full: pa.Schema) -> pa.RecordBatch:
    n = out.num_rows
    arrays = [pa.nulls(n, pa.string()), pa.nulls(n, pa.binary())]
    for f in list(full)[2:]:
        col = out[f.name]
        arrays.append(col.combine_chunks().cast(f.type) if isinstance(col, pa.ChunkedArray)
                      else col.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=full)


def _columns(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([pc.cast(rows[n], schema.field(n).type) for n in schema.names]
                                + [pc.cast(rows[W], pa.int64())], names=[*schema.names, W])


def _side(rows: pa.Table, side: int, schema: pa.Schema) -> pa.Table:
    return _columns(rows.filter(pc.equal(rows[SIDE], side)), schema)
