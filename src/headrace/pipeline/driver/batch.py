"""The batch driver: what one micro-batch does on the driver, shared by every way a batch runs.

A :class:`BatchDriver` holds a pipeline's settings, its graph and its committed position, and
the steps of a batch that the streaming query (trigger.py), a restart (restart.py), a history
batch (history.py), a rescale (rescale.py) and the static plan (static_plan.py) share.
:class:`~headrace.pipeline.api.pipeline.Pipeline` builds one; nothing else reaches into it.

One micro-batch (``process_range`` -> ``commit_batch``), at pipeline time t (batches committed
so far):

1. the batch's end sequence comes from Spark's offset log (written before the batch runs), so
   no Spark job probes the input;
2. one Spark job runs every operator: per operator a stage that buckets rows by key
   (``pmod(xxhash64(key), buckets)``), shuffles them to ``partitions`` tasks and runs the
   kernel on each bucket's state as of version v(t-1). Operator outputs stay on the executors
   (a persisted DataFrame feeds the next operator); tasks upload full state files and output
   parts themselves and return only *control rows* — page runs, part descriptors, metrics —
   which is all the driver collects;
3. the driver absorbs the tasks' page runs and checkpoints the state: one bundle PUT -> v(t);
4. the progress shard records, at time t, the last queue sequence consumed and v(t): the commit
   point of the batch;
5. each output shard links the batch's parts at time t with one compare-and-set; one already
   past t (a replay) is left alone.

State buckets (key groups) are fixed when the pipeline is created; ``partitions`` — how many
Spark tasks run a stage — may change on any restart (a task takes a range of buckets), so a
pipeline rescales without moving state.

Restart (restart.py): t = upper(progress). A sink whose upper is t-1 missed step 5 of batch
t-1: its output is recomputed from the recorded input range (read by executors) and state
v(t-2), then linked; the state is not rewritten. Parts added to the graph since the last run
start from t (plan/evolve.py): a new sink's shard is first brought to upper t by an empty link.
Queue entries are acknowledged only after the batch completes, so the range is still readable.
Spark's own checkpoint may be deleted: entries at or below the recorded sequence are filtered
out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import reduce

import pyarrow as pa

from headrace.codec import new_ulid
from headrace.errors import AlreadyExists, InvalidInput, NotFound
from headrace.persist import PersistClient
from headrace.pipeline.driver.absorb import BatchControl, absorb
from headrace.pipeline.driver.job import range_df, run_stages
from headrace.pipeline.driver.negative import settle as settle_negative
from headrace.pipeline.driver.sparklog import offset_log_ends
from headrace.pipeline.driver.streams import StreamSet
from headrace.pipeline.encoding import columnar
from headrace.pipeline.errors import BadEntry, PipelineError, RangeGone
from headrace.pipeline.exec.decode import DEAD_LETTER_SCHEMA, ENTRY_COLUMNS, Decoder, widen
from headrace.pipeline.exec.outputs import OutputCollector
from headrace.pipeline.exec.tasks import TaskContextSpec
from headrace.pipeline.plan.eventtime import event_time_bindings, expiring, watermark_of
from headrace.pipeline.plan.evolve import Evolution, reconcile
from headrace.pipeline.plan.nodes import Node, Operator, Sink, SourceTable, fingerprint
from headrace.pipeline.plan.progress import GRAPH_KEY, STATE_KEY, StoredGraph, commit_progress
from headrace.pipeline.state.commit import STATE_OPTIONS, checkpoint_runs
from headrace.pipeline.state.local_backup import finalize
from headrace.reservoir import ReservoirStorage
from headrace.store import CREATE

log = logging.getLogger("headrace.pipeline")


def store_identity(store, name: str) -> str:
    """A random id created once per (store, pipeline): tells two stores at one root apart."""
    key = f"{name}.identity"
    try:
        return store.get(key).data.decode()
    except NotFound:
        ident = new_ulid()
        try:
            store.put(key, ident.encode(), CREATE)
            return ident
        except AlreadyExists:
            return store.get(key).data.decode()


@dataclass(frozen=True)
class PreparedBatch:
    """The parameters a static-plan batch's tasks read (static_plan.py), set ahead of it: the
    position they were set for, the run prefix the tasks echo, the writers they upload under."""

    time: int
    state_version: int | None
    after: int  # the last queue sequence before the batch
    run_prefix: str
    writer_ids: dict[str, str]

    def position(self) -> tuple[int, int | None, int]:
        return self.time, self.state_version, self.after


class BatchDriver:
    """A pipeline's settings, graph and committed position, and the steps of a micro-batch.

    Settings are validated by :class:`~headrace.pipeline.api.pipeline.Pipeline`. The graph
    (``nodes``, ``sinks``, ``queues``, ``streams``) is the builder's, shared. ``time``: batches
    committed; ``bindings``: what the progress shard holds at ``time - 1`` (queue positions,
    state version, event time, the graph's rows)."""

    def __init__(self, spark, *, root: str, name: str, partitions: int, buckets: int,
                 state_backend: str, checkpoint_dir: str | None, cache_dir: str | None, store,
                 batches_per_trigger: int | None, local_root: str | None, on_bad_entry: str,
                 max_entry_bytes: int, output_inline_max: int, retain_batches: int,
                 static_plan: bool):
        self.spark = spark
        self.root = root
        self.name = name
        self.buckets = buckets  # key groups: fixed by the stored state (rescale.py changes it)
        self.partitions = partitions  # Spark tasks per stage: may change on any restart
        self.state_backend = state_backend
        self.on_bad_entry = on_bad_entry
        self.max_entry_bytes = max_entry_bytes
        self.output_inline_max = output_inline_max  # output bytes a task may hand the driver
        self.dead_letter_shard = f"{name}.dead_letter" if on_bad_entry == "dead_letter" else None
        # the driver's store; tasks open ``root`` themselves (``store`` is for fault injection)
        self.store = store
        self.batches_per_trigger = batches_per_trigger
        # consumed queue batches each queue keeps for parts added with start="history"
        self.retain_batches = retain_batches
        # plan a pipeline of the static plan's shape once, not per batch (static_plan.py)
        self.static_plan = static_plan
        self.static_next: PreparedBatch | None = None  # set by static_plan.prepare_next
        self.static_entries = None  # the static plan's entries accumulator (static_plan.py)
        self.static_rows = None  # the rows its queue source read (static_plan.rows_accumulator)
        self.persist = PersistClient(self.store)
        self.stream = f"{name}.state"
        self.progress_shard = f"{name}.progress"
        self.cache_dir = cache_dir
        self.local_root = local_root or os.path.join(tempfile.gettempdir(), "headrace-local")
        self.nodes: list[Node] = []
        self.sinks: list[Sink] = []
        self.queues: list[str] = []
        self.streams = StreamSet()  # read_stream sources: side queries feeding their queues
        self.time = 0
        self.bindings: dict[str, int] = {}
        self.metrics: dict[str, float] = defaultdict(float)
        self.on_batch: Callable[[dict], None] | None = None  # called after each committed batch
        self.last_batch: dict | None = None
        self.last_history: dict | None = None  # the history batch of this run (history.py)
        self.last_rescale: dict | None = None  # the rescale of this run (rescale.py)
        # Spark's progress of each micro-batch of the runs so far (the newest 1,000)
        self.spark_progress: deque[dict] = deque(maxlen=1000)
        self.query = None  # the running Spark query (processingTime runs)
        self.stopping = threading.Event()  # set to stop a processingTime run (query.py)
        self.graph: StoredGraph | None = None  # the graph rows each batch commits (recover)
        self.evolution: Evolution | None = None  # what recover found new, kept or removed
        self.warm_requests: list[dict] = []  # filled by job.warm_workers' thread
        self._checkpoint_dir = checkpoint_dir
        self._storage: ReservoirStorage | None = None
        self._decode: Decoder | None = None
        self._columns: dict = {}  # Columns the same every batch (job.run_stages)

    # ---- where things are ---------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> str:
        """Spark's checkpoint folder. Default: a local folder keyed by the root *and* the
        store's identity (a random id the pipeline creates in the store on first use), so a new
        store at an old root never meets the old store's Spark offsets."""
        if self._checkpoint_dir is None:
            ident = store_identity(self.store, self.name)
            digest = hashlib.sha256(f"{self.root}|{self.name}|{ident}".encode()).hexdigest()[:16]
            self._checkpoint_dir = os.path.join(tempfile.gettempdir(),
                                                f"headrace-spark-{self.name}-{digest}")
        return self._checkpoint_dir

    @property
    def fingerprint(self) -> str:
        """The whole graph, buckets and backend in one digest: still committed, and the only
        marker of progress written before per-part digests (plan/evolve.py)."""
        return fingerprint(self.nodes, self.sinks, self.buckets, self.state_backend)

    def storage(self) -> ReservoirStorage:
        """The reservoir stream of the state (opened on first use)."""
        if self._storage is None:
            self._storage = ReservoirStorage.open(self.store, stream=self.stream,
                                                  options=STATE_OPTIONS)
        return self._storage

    def _manifest_key(self, version: int) -> str:
        return f"{self.name}.localstate/{version:020d}.json"

    def state_indexes(self, version: int | None) -> dict[str, str]:
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

    def graph_bindings(self) -> dict[str, int]:
        """The graph rows each batch commits (set by recover; a fresh graph before it)."""
        if self.graph is None:
            self.graph = reconcile({}, self.nodes, self.sinks, buckets=self.buckets,
                                   backend=self.state_backend, legacy_fingerprint="",
                                   pipeline=self.name).graph
        return {**self.graph.bindings(), f"{GRAPH_KEY}:{self.fingerprint}": 0}

    def outputs(self) -> list[tuple[str, pa.Schema]]:
        """Every shard a batch writes at its time: the sinks, and the dead-letter shard."""
        out = [(s.shard, s.node.schema) for s in self.sinks]
        if self.dead_letter_shard:
            out.append((self.dead_letter_shard, DEAD_LETTER_SCHEMA))
        return out

    def link_outputs(self, outputs: OutputCollector, t: int,
                     shards: list[tuple[str, pa.Schema]]) -> None:
        """Link a batch's output parts into ``shards`` at time ``t`` (one CAS each)."""
        for shard, schema in shards:
            outputs.link(self.persist, shard, schema, t)

    def decoder(self) -> Decoder:
        """Built once: the decode expressions cost hundreds of JVM calls to build."""
        sources = tuple(n for n in self.nodes if isinstance(n, SourceTable))
        if self._decode is None or self._decode.sources != list(sources):
            self._decode = Decoder(list(sources), self.max_entry_bytes)
        return self._decode

    def splits_per_batch(self) -> int:
        """Tasks that read one queue batch: one per core, at most ``partitions``."""
        return max(1, min(self.partitions, self.spark.sparkContext.defaultParallelism))

    def holds_state(self) -> bool:
        """Whether any operator of the graph keeps state."""
        return any(isinstance(n, Operator) and n.state_sides for n in self.nodes)

    def range_entries(self, ranges: dict[str, tuple[int, int]], counted=None):
        """The entries of every queue in (after, through] (``ranges``: queue -> (after,
        through)) as one DataFrame read by executors; an empty range is a no-data batch.
        ``counted``: an accumulator the rows read are added to. PipelineError if a queue no
        longer holds its range."""
        frames = []
        for q, (after, through) in ranges.items():
            try:
                frames.append(range_df(self.spark, self.store, self.root, q, after, through,
                                       self.partitions, self.splits_per_batch(),
                                       self.decoder(), counted))
            except RangeGone as e:
                raise PipelineError(str(e)) from e
        return reduce(lambda a, b: a.unionByName(b), frames)

    def task_context(self, state_version: int | None, t: int,
                     write_state: bool) -> TaskContextSpec:
        """Where the tasks of batch ``t`` read state ``state_version`` (and write the next)."""
        return TaskContextSpec(url=self.root, stream=self.stream, state_version=state_version,
                               run_prefix=f"t{t}-{uuid.uuid4().hex[:8]}",
                               cache_dir=self.cache_dir, write_state=write_state,
                               backend=self.state_backend, local_root=self.local_root,
                               pipeline=self.name, indexes=self.state_indexes(state_version),
                               checkpoint_id=f"t{t}")

    # ---- one micro-batch ---------------------------------------------------------------
    def process_entries(self, entries: pa.Table) -> None:
        """Run one micro-batch over queue entries given as Arrow (sequence, index, entry, and
        ``queue`` when the pipeline reads several), outside a streaming query (backfills,
        tests); the same protocol as a streamed batch."""
        if not self.queues:
            raise InvalidInput("process_entries needs read_queue(...) first")
        if "queue" not in entries.column_names:
            if len(self.queues) > 1:
                raise InvalidInput("entries need a 'queue' column: the pipeline reads "
                                   f"{self.queues}")
            entries = entries.append_column("queue", pa.array([self.queues[0]] * len(entries),
                                                              pa.string()))
        ends = {}
        for q in self.queues:
            seqs = entries.filter(pa.compute.equal(entries["queue"], q))["sequence"]
            ends[q] = pa.compute.max(seqs).as_py() if len(seqs) else None
        decoder = self.decoder()
        pieces = []  # columnar entries become their rows, as the queue source makes them
        for q in self.queues:
            mine = decoder.queue_columns(q)
            for rb in entries.filter(pa.compute.equal(entries["queue"], q)).select(
                    list(ENTRY_COLUMNS)).to_batches():
                pieces += [widen(b, decoder.columns)
                           for b in (columnar.explode(rb, mine) if len(mine) else [rb])]
        rows = pa.Table.from_batches(pieces) if pieces else None
        self.process_range(self.spark.createDataFrame(rows) if rows is not None else
                           self.spark.createDataFrame([], decoder.entries_ddl()), ends)

    def process(self, df, batch_id: int) -> None:
        """The streaming query's ``foreachBatch`` on the per-batch job."""
        self.process_range(df, self.spark_batch_end(batch_id, df))

    def spark_batch_end(self, batch_id: int, df) -> dict[str, int | None]:
        """The last sequence of each queue in Spark batch ``batch_id``, from Spark's offset log;
        a probe job only if the log is unreadable."""
        ends = offset_log_ends(self.checkpoint_dir, self.queues, batch_id)
        if ends is None:
            from pyspark.sql import functions as F

            log.warning("Spark offset log of batch %d unreadable; probing the batch's end",
                        batch_id)
            rows = df.groupBy("queue").agg(F.max("sequence").alias("m")).collect()
            return {r["queue"]: r["m"] for r in rows}
        return ends

    def process_range(self, df, ends: dict[str, int | None], no_data: bool = False) -> None:
        """Commit the entries of ``df`` past the committed positions through ``ends`` (none:
        a batch processed before a restart), then, if its watermark closed windows, a
        no-data batch that expires them."""
        afters = {q: self.bindings.get(q, -1) for q in self.queues}
        ends = {q: max(afters[q], ends[q] if ends.get(q) is not None else -1)
                for q in self.queues}
        if not no_data and ends == afters:
            return  # everything in this Spark batch was processed before a restart
        # one SQL condition: a Column built call by call costs ~20 JVM round trips per batch
        df = df.filter(" OR ".join(f"(queue = {_sql_string(q)} AND sequence > {afters[q]} AND "
                                   f"sequence <= {ends[q]})" for q in self.queues))
        watermark = watermark_of(self.nodes, self.bindings)
        new = self.commit_batch(df, ends, watermark=watermark)
        if expiring(self.nodes) and watermark_of(self.nodes, new) != watermark:
            # Spark's "no-data batch": windows the new watermark closes are expired (and, in
            # append mode, emitted) now, not when more input happens to arrive
            self.process_range(df.limit(0), ends, no_data=True)

    def commit_batch(self, df, ends: dict[str, int], *, watermark: int | None,
                     nodes: list[Node] | None = None, shards: set[str] | None = None,
                     marks: dict[str, int] | None = None,
                     collect: Callable[[int, int | None, set[str]], pa.Table] | None = None,
                     ) -> dict[str, int]:
        """Run batch t over ``df`` (entries through ``ends``), checkpoint the state, commit
        progress, link every output; returns the new bindings. ``nodes``/``shards``: only
        that part of the graph runs (the history batch, history.py; other shards get empty
        links); ``marks``: extra progress bindings of this batch; ``collect(t, state version,
        shards)``: runs the batch's job and returns its control rows (the static plan) instead
        of building the per-batch job."""
        t0 = time.perf_counter()
        batch_counts = self.store.counts()
        t = self.time
        prev_version = self.bindings.get(STATE_KEY)
        wanted = {s for s, _ in self.outputs()} if shards is None else shards
        if collect is not None:
            result = self.absorb_control(collect(t, prev_version, wanted))
            if result.negative:  # settled over the queue range, by the per-batch job
                result = settle_negative(self, self.range_entries(
                    {q: (self.bindings.get(q, -1), max(ends.get(q, -1), self.bindings.get(q, -1)))
                     for q in self.queues}), result, state_version=prev_version, t=t,
                    write_state=True, shards=wanted, watermark=watermark, nodes=nodes)
        else:
            result = self.run_stages(df, prev_version, t=t, write_state=True, shards=wanted,
                                     watermark=watermark, nodes=nodes)
        if self.state_backend == "local+backup":
            # the state of time t = the previous buckets' snapshots + the ones changed now;
            # a crashed earlier attempt of t may have left a manifest: not committed, replace it
            manifest = {**self.state_indexes(prev_version), **result.indexes}
            self.store.put(self._manifest_key(t), json.dumps(manifest, sort_keys=True).encode())
            version = t
        elif prev_version is not None and not self.holds_state() and not any(
                r.page_count or len(r.deleted_ids) for r in result.runs):
            version = prev_version  # no operator keeps state: no empty checkpoint per batch
        else:
            # until the progress names the new version, a restart redoes batch t (and a lagging
            # output replays it) from prev_version: it stays readable even past a snapshot
            version, repacked = checkpoint_runs(self.storage(), result.runs,
                                                keep_from=prev_version)
            self.metrics["state_repacked_files"] += repacked
        new = {**{q: int(e) for q, e in ends.items() if e >= 0}, STATE_KEY: int(version),
               **self.graph_bindings(), **(marks or {}),
               **event_time_bindings(self.nodes, self.bindings, result.wm)}
        commit_progress(self.persist, self.progress_shard, t, self.bindings, new)
        if result.indexes:  # recorded durably: make the snapshots permanent
            finalize(self.store, self.name, result.indexes)
        self.link_outputs(result.outputs, t, self.outputs())
        self.time = t + 1
        self.bindings = new
        self.metrics["batches"] += 1
        seconds = time.perf_counter() - t0
        self.metrics["batch_seconds"] += seconds
        self.metrics["bad_entries"] += result.bad
        counts = self.store.counts()
        requests = {k: counts.get(k, 0) - batch_counts.get(k, 0)
                    + result.task_requests.get(k, 0)
                    for k in sorted(set(counts) | set(result.task_requests))}
        through = ends[self.queues[0]] if len(self.queues) == 1 else ends
        self.last_batch = {"time": t, "through_sequence": through, "state_version": int(version),
                           "seconds": round(seconds, 3), "input_rows": result.input_rows,
                           "rows_per_second": round(result.input_rows / max(seconds, 1e-9), 1),
                           "bad_entries": result.bad,
                           "late_rows": result.late, "watermark_us": watermark,
                           "requests": requests}
        if self.on_batch is not None:
            self.on_batch(dict(self.last_batch))
        log.info("batch t=%d: through %s, state v%d, %.3f s", t, ends, version, seconds)
        return new

    # ---- the Spark job of a micro-batch ------------------------------------------------
    def run_stages(self, entries_df, state_version: int | None, *, t: int, write_state: bool,
                   shards: set[str], watermark: int | None = None,
                   nodes: list[Node] | None = None, settle: bool = True) -> BatchControl:
        """Run every operator (or ``nodes``) over the entries in one Spark job; absorb its
        control rows. A kernel's refusal (a retraction of a row never inserted) is settled
        (negative.py: fail naming the entry, or run again without it) unless ``settle`` is
        False."""
        ctx = self.task_context(state_version, t, write_state)
        # tasks upload parts under the driver's writer of each shard (registered once, its
        # lease refreshed by every link), so no sweep deletes them before they are linked
        writer_ids = {s: self.persist.open_writer(s).register() for s in sorted(shards)}
        rows = run_stages(
            self.spark, self.nodes if nodes is None else nodes, entries_df, ctx, t=t,
            partitions=self.partitions, buckets=self.buckets,
            sinks={id(s.node): [x.shard for x in self.sinks
                                if x.node is s.node and x.shard in shards] for s in self.sinks},
            writer_ids=writer_ids, persist_root=self.persist.root,
            inline_max=self.output_inline_max, max_entry_bytes=self.max_entry_bytes,
            dead_letter=self.dead_letter_shard if self.dead_letter_shard in shards else None,
            watermark_us=watermark, decoder=self.decoder(), columns=self._columns)
        result = self.absorb_control(rows)
        if result.negative and settle:
            result = settle_negative(self, entries_df, result, state_version=state_version,
                                     t=t, write_state=write_state, shards=shards,
                                     watermark=watermark, nodes=nodes)
        return result

    def dry_stages(self, entries_df, state_version: int | None, *, t: int,
                   watermark: int | None, nodes: list[Node]) -> BatchControl:
        """Run ``nodes`` over the entries writing nothing (no state, no output): the control
        rows folded, nothing counted (negative.py's dry runs)."""
        ctx = replace(self.task_context(state_version, t, False), write_outputs=False)
        return absorb(run_stages(
            self.spark, nodes, entries_df, ctx, t=t, partitions=self.partitions,
            buckets=self.buckets, sinks={}, writer_ids={}, persist_root=self.persist.root,
            inline_max=self.output_inline_max, max_entry_bytes=self.max_entry_bytes,
            dead_letter=None, watermark_us=watermark, decoder=self.decoder(),
            columns=self._columns))

    def absorb_control(self, rows: pa.Table | None) -> BatchControl:
        """Fold a batch's control rows; count its metrics; refuse it if it had bad entries
        and the pipeline fails on them."""
        c = absorb(rows)
        while self.warm_requests:  # the worker warm-up's reads (trigger.run)
            for k, v in self.warm_requests.pop().items():
                c.task_requests[k] += v
        for k, v in c.task_requests.items():
            self.metrics[f"task_{k}"] += v
        self.metrics["driver_inline_output_bytes_max"] = max(
            self.metrics["driver_inline_output_bytes_max"], c.outputs.inline_bytes)
        if c.bad and self.on_bad_entry == "fail":
            raise BadEntry(f"{c.first_bad()} ({c.bad} bad entries in this batch; nothing "
                           "was committed; Pipeline(on_bad_entry='dead_letter') keeps them "
                           "in a dead-letter shard instead)")
        self.metrics["late_rows"] += c.late
        return c


def _sql_string(text: str) -> str:
    """A SQL string literal of ``text`` (queue names are keys: no quotes expected, but safe)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
