"""Pipeline: a PySpark streaming job over headrace's queue, state and shards, exactly once.

Per micro-batch (``_process``), with t = the pipeline's own time (batches processed so far):

1. the batch's queue entries with sequence > the last processed one are decoded per table;
2. each operator runs as one Spark stage: rows are bucketed by key (``pmod(xxhash64(key), P)``),
   each task applies the operator's kernel to its buckets' spines read as of state version
   v(t-1), uploads full reservoir files itself and returns small leftovers to the driver;
3. the driver absorbs every task's leftovers and checkpoints the state: one bundle PUT when the
   changes are small, whatever the number of partitions -> v(t);
4. the progress shard (the remap of seed 004) records, at time t, the last queue sequence
   consumed and v(t) — this is the commit point of the batch;
5. each output shard gets the batch's output at time t with compare_and_append(t, t+1); one
   that is already past t (a replay) is left alone.

Restart (``recover``): t = upper(progress). A sink whose upper is t-1 missed step 5 of batch
t-1: its output is recomputed from the recorded input range and state v(t-2) and appended; the
state is not rewritten (v(t-1) is already committed). Queue entries are acknowledged only after
step 5, so the range is still readable. Everything restarts from the object store alone: Spark's
own checkpoint folder may be deleted (overlapping entries are filtered by sequence).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from headrace.errors import HeadraceError, InvalidInput
from headrace.persist import PersistClient, UpperMismatch
from headrace.spark.kernels import DIFF, W
from headrace.spark.plan import (
    Node,
    Operator,
    Sink,
    SourceTable,
    fingerprint,
    make_operator,
    parse_schema,
    spark_ddl,
)
from headrace.spark.tasks import (
    BUCKET,
    SIDE,
    OperatorSpec,
    TaskContextSpec,
    run_operator_partition,
    schema_to_bytes,
    table_from_ipc,
)
from headrace.store import CountingStore, open_store

log = logging.getLogger("headrace.spark.pipeline")
STATE_KEY = "__state_version"
GRAPH_KEY = "__graph"
TASK_OUTPUT_DDL = "kind string, bucket int, payload binary"  # = tasks.TASK_OUTPUT_SCHEMA


class PipelineError(HeadraceError):
    """The pipeline cannot continue safely (e.g. its stored progress is inconsistent)."""


class Pipeline:
    """Build with read_queue / aggregate / join / distinct / write_shard, then run()."""

    def __init__(self, spark, root: str, *, name: str = "pipeline", partitions: int = 4,
                 state_backend: str = "reservoir", checkpoint_dir: str | None = None,
                 cache_dir: str | None = None, store=None,
                 batches_per_trigger: int | None = None, tasks: int | None = None,
                 local_root: str | None = None):
        if partitions < 1 or partitions > 65535:
            raise ValueError("partitions must be in [1, 65535]")
        if state_backend not in ("reservoir", "local+backup"):
            raise InvalidInput(f"state_backend must be 'reservoir' or 'local+backup', "
                               f"got {state_backend!r}")
        self.state_backend = state_backend
        self.spark = spark
        self.root = root
        self.name = name
        self.partitions = partitions
        # the driver's store; tasks open ``root`` themselves (``store`` is for fault injection)
        self.store = CountingStore(store if store is not None else open_store(root))
        self.batches_per_trigger = batches_per_trigger
        # ``partitions`` buckets lay out the state; ``tasks`` Spark tasks process them (each
        # task takes several buckets), so the state layout does not dictate per-task overhead
        self.tasks = min(partitions, tasks or 2 * spark.sparkContext.defaultParallelism)
        self.persist = PersistClient(self.store)
        self.stream = f"{name}.state"
        self.progress_shard = f"{name}.progress"
        digest = hashlib.sha256(f"{root}|{name}".encode()).hexdigest()[:12]  # stable per run
        self.checkpoint_dir = checkpoint_dir or os.path.join(
            tempfile.gettempdir(), f"headrace-spark-{name}-{digest}")
        self.cache_dir = cache_dir
        # local+backup: spine directories on executor disk under local_root
        self.local_root = local_root or os.path.join(tempfile.gettempdir(), "headrace-local")
        self.nodes: list[Node] = []
        self.sinks: list[Sink] = []
        self.queue: str | None = None
        self.time = 0
        self.bindings: dict[str, int] = {}
        self.metrics: dict[str, float] = defaultdict(float)
        self._storage = None
        self.on_batch = None  # optional callback(dict) after each committed batch

    # ---- building ----------------------------------------------------------------------
    def read_queue(self, queue: str, tables: dict[str, str | pa.Schema]) -> dict[str, Node]:
        """Entries of ``queue`` are JSON objects ``{"table": T, "w": ±n, <columns>}``."""
        if self.queue not in (None, queue):
            raise InvalidInput("a pipeline reads one queue (its tables may be many)")
        self.queue = queue
        out = {}
        for table, spec in tables.items():
            node = SourceTable(name=f"{queue}.{table}", schema=parse_schema(spec), queue=queue,
                               table=table)
            self.nodes.append(node)
            out[table] = node
        return out

    def _add(self, kind: str, name: str, inputs: list[Node], params: dict) -> Node:
        if any(n.name == name for n in self.nodes):
            raise InvalidInput(f"an operator named {name!r} already exists")
        for i in inputs:
            if i not in self.nodes:
                raise InvalidInput(f"input {i.name!r} does not belong to this pipeline")
        op = sum(1 for n in self.nodes if isinstance(n, Operator))
        node = make_operator(op, kind, name, inputs, params)
        self.nodes.append(node)
        return node

    def aggregate(self, input: Node, by: list[str], aggs: dict[str, str], name: str) -> Node:
        return self._add("aggregate", name, [input], {"by": list(by), "aggs": dict(aggs)})

    def join(self, left: Node, right: Node, on: list[str], name: str) -> Node:
        return self._add("join", name, [left, right], {"on": list(on)})

    def distinct(self, input: Node, name: str) -> Node:
        return self._add("distinct", name, [input], {})

    def write_shard(self, node: Node, shard: str) -> None:
        self.sinks.append(Sink(node, shard))

    @property
    def fingerprint(self) -> str:
        """Operator graph, partitions and backend: state of another layout is refused."""
        return fingerprint(self.nodes, self.sinks, self.partitions, self.state_backend)

    # ---- state and progress ------------------------------------------------------------
    def storage(self):
        if self._storage is None:
            from headrace.reservoir import ReservoirStorage

            self._storage = ReservoirStorage.open(self.store, stream=self.stream)
        return self._storage

    def _progress_at(self, t: int) -> dict[str, int]:
        if t < 0:
            return {}
        snap = self.persist.read_only(self.progress_shard).snapshot(t)
        return {r["source"]: r["address"] for r in snap.select(["source", "address"]).to_pylist()}

    def _manifest_key(self, version: int) -> str:
        return f"{self.name}.localstate/{version:020d}.json"

    def _state_indexes(self, version: int | None) -> dict[str, str]:
        """local+backup: the bucket -> snapshot index ids that make up state ``version``."""
        if version is None or self.state_backend != "local+backup":
            return {}
        key = self._manifest_key(version)
        try:
            obj = json.loads(self.store.get(key).data)
        except ValueError as e:
            raise PipelineError(f"state manifest {key!r} is not valid JSON: {e}") from e
        if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in obj.items()):
            raise PipelineError(f"state manifest {key!r} is not a map of index ids")
        return obj

    def recover(self) -> int:
        """Bring every output up to the progress shard; returns the time to continue at."""
        upper = self.persist.upper(self.progress_shard) or 0
        self.time = upper
        self.bindings = self._progress_at(upper - 1)
        graph = self.bindings.get(f"{GRAPH_KEY}:{self.fingerprint}")
        if upper and graph is None:
            raise PipelineError(f"pipeline {self.name!r}: stored progress was written by a "
                                "different operator graph; use a new name or root")
        behind = []
        for sink in self.sinks:
            su = self.persist.upper(sink.shard) or 0
            if su == upper:
                continue
            if su != upper - 1:
                raise PipelineError(f"shard {sink.shard!r} is at {su}, progress at {upper}: "
                                    "written by something else?")
            behind.append(sink)
        if behind:
            t = upper - 1
            prev = self._progress_at(t - 1)
            log.info("recovering outputs of batch %d for %s", t, [s.shard for s in behind])
            entries = self._read_range(prev.get(self.queue, -1), self.bindings[self.queue])
            df = self.spark.createDataFrame(entries) if entries.num_rows else None
            outputs = self._run_operators(df, prev.get(STATE_KEY), write_state=False,
                                          run_prefix=f"replay{t}-{uuid.uuid4().hex[:8]}",
                                          t=t)[0]
            self._append_outputs(outputs, t, behind)
            self.metrics["replayed_batches"] += 1
        return self.time

    def _read_range(self, after: int, through: int) -> pa.Table:
        from headrace.buffer import read_entries

        batches = read_entries(self.store, f"{self.queue}/manifest", after_sequence=after,
                               max_batches=None)
        seqs, idx, entries = [], [], []
        for b in batches:
            if b.sequence > through:
                break
            seqs += [b.sequence] * len(b.entries)
            idx += list(range(len(b.entries)))
            entries += list(b.entries)
        if seqs and seqs[-1] != through:
            raise PipelineError(f"queue {self.queue!r} no longer holds sequences "
                                f"({after}, {through}] needed to recover")
        return pa.table({"sequence": pa.array(seqs, pa.int64()),
                         "index": pa.array(idx, pa.int32()),
                         "entry": pa.array(entries, pa.binary())})

    # ---- one micro-batch ---------------------------------------------------------------
    def process_entries(self, entries: pa.Table) -> None:
        """Run one micro-batch over queue entries given as Arrow (sequence, index, entry),
        outside a streaming query (backfills, tests); the same protocol as a streamed batch."""
        if self.queue is None:
            raise InvalidInput("process_entries needs read_queue(...) first")
        self._process(self.spark.createDataFrame(entries), -1)

    def _process(self, df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        t0 = time.perf_counter()
        after = self.bindings.get(self.queue, -1)
        df = df.filter(F.col("sequence") > F.lit(after)).select("sequence", "index", "entry")
        df = df.persist()
        try:
            end = df.agg(F.max("sequence")).collect()[0][0]
            if end is None:
                return  # everything in this Spark batch was processed before a restart
            t = self.time
            prev_version = self.bindings.get(STATE_KEY)
            outputs, runs, indexes = self._run_operators(
                df, prev_version, write_state=True, run_prefix=f"t{t}-{uuid.uuid4().hex[:8]}",
                t=t)
        finally:
            df.unpersist()
        if self.state_backend == "local+backup":
            # the state of time t = the previous buckets' snapshots + the ones changed now;
            # a crashed earlier attempt of t may have left a manifest: not committed, replace it
            manifest = {**self._state_indexes(prev_version), **indexes}
            self.store.put(self._manifest_key(t), json.dumps(manifest, sort_keys=True).encode())
            version = t
        else:
            storage = self.storage()
            storage.absorb(runs)
            version = storage.checkpoint()
        new = {self.queue: int(end), STATE_KEY: int(version),
               f"{GRAPH_KEY}:{self.fingerprint}": 0}
        self._commit_progress(t, new)
        if indexes:  # recorded durably: make the new snapshots permanent, drop what they replace
            from headrace.spark.local_state import finalize

            finalize(self.store, self.name, indexes)
        self._append_outputs(outputs, t, self.sinks)
        self.time = t + 1
        self.bindings = new
        self.metrics["batches"] += 1
        seconds = time.perf_counter() - t0
        self.metrics["batch_seconds"] += seconds
        if self.on_batch is not None:
            self.on_batch({"time": t, "through_sequence": int(end), "state_version": int(version),
                           "seconds": round(seconds, 3)})
        log.info("batch t=%d (spark %d): through sequence %d, state v%d", t, batch_id, end,
                 version)

    def _commit_progress(self, t: int, new: dict[str, int]) -> None:
        old = self.bindings
        rows = [(k, v, -1) for k, v in old.items()] + [(k, v, 1) for k, v in new.items()]
        upd = pa.table({"source": pa.array([r[0] for r in rows], pa.string()),
                        "address": pa.array([r[1] for r in rows], pa.int64()),
                        "time": pa.array([t] * len(rows), pa.uint64()),
                        "diff": pa.array([r[2] for r in rows], pa.int64())})
        self.persist.open_writer(self.progress_shard).compare_and_append(upd, t, t + 1)

    def _append_outputs(self, outputs: dict[str, pa.Table], t: int,
                        sinks: Iterable[Sink]) -> None:
        for sink in sinks:
            out = outputs.get(sink.node.name)
            if out is None:
                out = pa.schema(list(sink.node.schema) + [pa.field(DIFF, pa.int64())]) \
                    .empty_table()
            upd = out.append_column("time", pa.array(np.full(out.num_rows, t, np.uint64)))
            upd = upd.select([*sink.node.schema.names, "time", DIFF])
            try:
                self.persist.open_writer(sink.shard).compare_and_append(upd, t, t + 1)
            except UpperMismatch as e:
                if e.current is not None and e.current > t:
                    continue  # already written before a crash: exactly once
                raise

    # ---- running operators as Spark stages ---------------------------------------------
    def _decode_sources(self, entries_df) -> dict[str, object]:
        from pyspark.sql import functions as F

        out = {}
        for node in self.nodes:
            if not isinstance(node, SourceTable):
                continue
            ddl = spark_ddl(node.schema) + ", `table` string, `w` long"
            parsed = entries_df.select(F.from_json(F.col("entry").cast("string"), ddl).alias("r"))
            rows = parsed.filter(F.col("r.table") == F.lit(node.table))
            out[node.name] = rows.select(
                *[F.col(f"r.`{c}`").alias(c) for c in node.schema.names],
                F.coalesce(F.col("r.w"), F.lit(1)).cast("long").alias(W))
        return out

    def _run_operators(self, entries_df, state_version: int | None, *, write_state: bool,
                       run_prefix: str, t: int) -> tuple[dict[str, pa.Table], list, dict]:
        from pyspark.sql import functions as F

        frames = self._decode_sources(entries_df) if entries_df is not None else {}
        outputs: dict[str, pa.Table] = {}
        runs: list = []
        indexes: dict[str, str] = {}
        ctx = TaskContextSpec(url=self.root, stream=self.stream,
                              state_version=state_version, run_prefix=run_prefix,
                              cache_dir=self.cache_dir, write_state=write_state,
                              backend=self.state_backend, local_root=self.local_root,
                              pipeline=self.name, indexes=self._state_indexes(state_version),
                              checkpoint_id=f"t{t}")
        for node in self.nodes:
            if not isinstance(node, Operator):
                continue
            inputs = []
            for i, src in enumerate(node.sources):
                frame = frames.get(src.name)
                if frame is None:
                    frame = self.spark.createDataFrame([], spark_ddl(src.schema) + f", {W} long")
                key = node.key_columns[i]
                frame = frame.withColumn(BUCKET, F.pmod(F.xxhash64(*key), F.lit(self.partitions))
                                         .cast("int"))
                if node.kind == "join":
                    frame = frame.withColumn(SIDE, F.lit(i))
                inputs.append(frame)
            frame = inputs[0]
            if len(inputs) == 2:
                frame = frame.unionByName(inputs[1], allowMissingColumns=True)
            spec = OperatorSpec(op=node.op, kind=node.kind,
                                inputs=[schema_to_bytes(s.schema) for s in node.sources],
                                params=node.params)
            result = frame.repartition(self.tasks, BUCKET).mapInArrow(
                _task_fn(spec, ctx), TASK_OUTPUT_DDL).toArrow()
            out_parts = []
            for kind, payload in zip(result["kind"].to_pylist(), result["payload"].to_pylist(),
                                     strict=True):
                if kind == "out":
                    out_parts.append(table_from_ipc(payload))
                elif kind == "run":
                    runs.append(pickle.loads(payload))
                elif kind == "indexes":
                    indexes.update(json.loads(payload))
                elif kind == "metrics":
                    for k, v in json.loads(payload).items():
                        self.metrics[f"task_{k}"] += v
            out = (pa.concat_tables(out_parts) if out_parts else
                   pa.schema(list(node.schema) + [pa.field(DIFF, pa.int64())]).empty_table())
            outputs[node.name] = out
            if out.num_rows:
                frames[node.name] = self.spark.createDataFrame(
                    out.rename_columns([*node.schema.names, W]))
        return outputs, runs, indexes

    # ---- running ----------------------------------------------------------------------
    def run(self, *, until_idle: bool = True, max_runs: int | None = None,
            processing_time: str | None = None, timeout_s: float | None = None) -> int:
        """Recover, then process the queue. until_idle: repeat availableNow runs until one finds
        nothing new; otherwise a processingTime trigger until ``timeout_s``. Returns batches."""
        if self.queue is None or not self.sinks:
            raise InvalidInput("a pipeline needs read_queue(...) and at least one write_shard")
        from headrace.spark.queue_source import register

        register(self.spark)
        self.recover()
        start_batches = self.metrics["batches"]
        runs = 0
        while True:
            before = self.metrics["batches"]
            reader = (self.spark.readStream.format("headrace.queue")
                      .option("url", self.root)
                      .option("manifest_path", f"{self.queue}/manifest"))
            if self.batches_per_trigger:
                reader = reader.option("max_batches_per_trigger", str(self.batches_per_trigger))
            reader = reader.load()
            writer = (reader.writeStream.foreachBatch(self._process)
                      .option("checkpointLocation", self.checkpoint_dir))
            try:
                if until_idle:
                    query = writer.trigger(availableNow=True).start()
                    query.awaitTermination()
                else:
                    query = writer.trigger(processingTime=processing_time or "1 second").start()
                    query.awaitTermination(timeout_s)
                    query.stop()
            except Exception as e:  # the query died: what failed inside a batch is in its text
                raise PipelineError(f"pipeline {self.name!r} stopped at t={self.time}: "
                                    f"{_first_error_line(e)}") from e
            runs += 1
            if not until_idle or self.metrics["batches"] == before:
                break
            if max_runs is not None and runs >= max_runs:
                break
        return int(self.metrics["batches"] - start_batches)

    def read_shard(self, shard: str, as_of: int | None = None) -> pa.Table:
        """The consolidated contents of an output shard (latest complete time by default)."""
        upper = self.persist.upper(shard) or 0
        if upper == 0:
            raise InvalidInput(f"shard {shard!r} has no complete time yet")
        return self.persist.read_only(shard).snapshot(upper - 1 if as_of is None else as_of)


def _first_error_line(e: Exception) -> str:
    """The innermost Python error of a failed streaming query (Spark wraps it several times)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error:" in ln or "Exception:" in ln or "Fault:" in ln]
    return (errors[-1] if errors else (lines[0] if lines else repr(e)))[:500]


def _task_fn(spec: OperatorSpec, ctx: TaskContextSpec):
    def fn(batches):
        from pyspark import TaskContext

        tc = TaskContext.get()
        pid = tc.partitionId() if tc else 0
        attempt = tc.attemptNumber() if tc else 0
        yield from run_operator_partition(batches, spec, ctx, pid, attempt)

    return fn
