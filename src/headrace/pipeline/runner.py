"""Pipeline: a PySpark streaming job over headrace's queue, state and shards, exactly once.

One micro-batch (``_process``), at pipeline time t (batches committed so far):

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

Restart (``recover``): t = upper(progress). A sink whose upper is t-1 missed step 5 of batch
t-1: its output is recomputed from the recorded input range (read by executors) and state
v(t-2), then linked; the state is not rewritten. Parts added to the graph since the last run
start from t (``evolve.py``): a new sink's shard is first brought to upper t by an empty link.
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

import pyarrow as pa

from headrace.errors import HeadraceError, InvalidInput
from headrace.persist import PersistClient
from headrace.pipeline import columnar
from headrace.pipeline.builder import PipelineBuilder
from headrace.pipeline.control import absorb
from headrace.pipeline.decode import (
    DEAD_LETTER_SCHEMA,
    ENTRY_COLUMNS,
    MAX_ENTRY_BYTES,
    Decoder,
    widen,
)
from headrace.pipeline.eventtime import event_time_bindings, expiring, watermark_of
from headrace.pipeline.evolve import STATE_BACKENDS, reconcile
from headrace.pipeline.job import RangeGone, range_df, run_stages, warm_workers
from headrace.pipeline.outputs import OutputCollector
from headrace.pipeline.plan import Node, Sink, SourceTable
from headrace.pipeline.progress import (
    GRAPH_KEY,
    STATE_KEY,
    commit_progress,
)
from headrace.pipeline.sparklog import offset_log_ends
from headrace.pipeline.state.commit import STATE_OPTIONS, checkpoint_runs
from headrace.pipeline.streams import StreamSet
from headrace.pipeline.tasks import (
    INLINE_MAX,
    TaskContextSpec,
)
from headrace.pipeline.trigger import first_error_line, run_queries
from headrace.store import CountingStore, open_store

log = logging.getLogger("headrace.pipeline")
DEFAULT_BUCKETS = 32  # key groups: the most tasks a stage can use; ~3M keys each at 100M


class PipelineError(HeadraceError):
    """The pipeline cannot continue safely (e.g. its stored progress is inconsistent)."""


class BadEntry(PipelineError, ValueError):
    """A queue entry that does not decode into its table (on_bad_entry="fail")."""


def store_identity(store, name: str) -> str:
    """A random id created once per (store, pipeline): tells two stores at one root apart."""
    from headrace.codec import new_ulid
    from headrace.errors import AlreadyExists, NotFound
    from headrace.store import CREATE

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


class Pipeline(PipelineBuilder):
    """Define the query (see :class:`PipelineBuilder`, :mod:`headrace.pipeline.frame`), then
    run() it: recovery, then micro-batches, exactly once."""

    def __init__(self, spark, root: str, *, name: str = "pipeline", partitions: int | None = None,
                 buckets: int = DEFAULT_BUCKETS, state_backend: str = "reservoir",
                 checkpoint_dir: str | None = None, cache_dir: str | None = None, store=None,
                 batches_per_trigger: int | None = None, local_root: str | None = None,
                 on_bad_entry: str = "fail", max_entry_bytes: int = MAX_ENTRY_BYTES,
                 output_inline_max: int = INLINE_MAX, retain_batches: int = 0,
                 static_plan: bool = True):
        if not 1 <= buckets <= 65535:
            raise InvalidInput(f"buckets must be in [1, 65535], got {buckets}")
        if partitions is not None and not 1 <= partitions <= 65535:
            raise InvalidInput(f"partitions must be in [1, 65535], got {partitions}")
        if on_bad_entry not in ("fail", "dead_letter"):
            raise InvalidInput(f"on_bad_entry must be 'fail' or 'dead_letter', "
                               f"got {on_bad_entry!r}")
        if isinstance(retain_batches, bool) or not isinstance(retain_batches, int) or (
                retain_batches < 0):
            raise InvalidInput(f"retain_batches must be an integer >= 0, got {retain_batches!r}")
        if state_backend not in STATE_BACKENDS:
            raise InvalidInput(f"state_backend must be 'reservoir' or 'local+backup', "
                               f"got {state_backend!r}")
        self.spark = spark
        # Spark's workers may run in another directory: a local root must be absolute
        self.root = root if "://" in root else os.path.abspath(root)
        self.name = name
        self.buckets = buckets
        # Spark tasks per stage: may change on any restart (state is laid out by bucket)
        # one task per core: measured on 2 cores, 1M keys, 20k-row deltas, 4 tasks (two waves,
        # each task paying its fixed cost of opening, writing a run and an output part) took
        # 0.46-0.63 s per trigger against 0.34-0.39 s for 2 (docs/pipeline.md)
        self.partitions = partitions or spark.sparkContext.defaultParallelism
        self.state_backend = state_backend
        self.on_bad_entry = on_bad_entry
        self.max_entry_bytes = max_entry_bytes
        self.output_inline_max = output_inline_max  # output bytes a task may hand the driver
        self.dead_letter_shard = f"{name}.dead_letter" if on_bad_entry == "dead_letter" else None
        # the driver's store; tasks open ``root`` themselves (``store`` is for fault injection)
        self.store = CountingStore(store if store is not None else open_store(self.root))
        self.batches_per_trigger = batches_per_trigger
        # consumed queue batches each queue keeps for parts added with start="history"
        self.retain_batches = retain_batches
        # plan a pipeline of the static plan's shape once, not per batch (static.py)
        self.static_plan = bool(static_plan)
        self._static_next = None  # what static_batch.prepare_next set for the next batch
        self._static_entries = None  # the static plan's entries accumulator (static.py)
        self.persist = PersistClient(self.store)
        self.stream = f"{name}.state"
        self.progress_shard = f"{name}.progress"
        self._checkpoint_dir = checkpoint_dir
        self.cache_dir = cache_dir
        self.local_root = local_root or os.path.join(tempfile.gettempdir(), "headrace-local")
        self.nodes: list[Node] = []
        self.sinks: list[Sink] = []
        self.queues: list[str] = []
        self.streams = StreamSet()  # read_stream sources: side queries feeding their queues
        self.time = 0
        self.bindings: dict[str, int] = {}
        self.metrics: dict[str, float] = defaultdict(float)
        self._storage = None
        self.on_batch = None  # optional callback(dict) after each committed batch
        self.last_batch: dict | None = None
        self._query = None  # the running Spark query (processingTime runs)
        self._stopping = threading.Event()
        self._decode = None
        self._columns: dict = {}  # Columns the same every batch (job.run_stages)
        self._warm_requests: list[dict] = []  # filled by job.warm_workers' thread
        self._graph = None  # the graph rows of the progress bindings (recover)
        self._evolution = None  # what recover found new, kept or removed (evolve.py)
        self.last_history = None  # the history batch of this run, if any (history.py)
        # Spark's progress of each micro-batch of the runs so far (the newest 1,000)
        self.spark_progress: deque[dict] = deque(maxlen=1000)

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

    # ---- state and progress ------------------------------------------------------------
    def storage(self):
        if self._storage is None:
            from headrace.reservoir import ReservoirStorage

            self._storage = ReservoirStorage.open(self.store, stream=self.stream,
                                                  options=STATE_OPTIONS)
        return self._storage

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
        """Bring every output up to the progress shard; returns the time to continue at.
        The graph may have gained parts since (evolve.py): new sinks' shards are brought to
        the current time by an empty link, and start from there, or from the queue's retained
        history (history.py). Stored state with another bucket count is re-bucketed after
        that, as an empty batch (rescale.py)."""
        from headrace.pipeline.history import run_history
        from headrace.pipeline.rescale import recover_rescaled

        recover_rescaled(self, self._recover)
        return run_history(self)

    def _recover(self) -> int:
        from headrace.pipeline.restart import recover_outputs

        return recover_outputs(self)

    def _graph_bindings(self) -> dict[str, int]:
        """The graph rows each batch commits (set by recover; a fresh graph before it)."""
        if self._graph is None:
            self._graph = reconcile({}, self.nodes, self.sinks, buckets=self.buckets,
                                    backend=self.state_backend, legacy_fingerprint="",
                                    pipeline=self.name).graph
        return {**self._graph.bindings(), f"{GRAPH_KEY}:{self.fingerprint}": 0}

    def _range_df(self, queue: str, after: int, through: int):
        try:
            return range_df(self.spark, self.store, self.root, queue, after, through,
                            self.partitions, self._splits_per_batch(), self._decoder())
        except RangeGone as e:
            raise PipelineError(str(e)) from e

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
        decoder = self._decoder()
        pieces = []  # columnar entries become their rows, as the queue source makes them
        for q in self.queues:
            mine = decoder.queue_columns(q)
            for rb in entries.filter(pa.compute.equal(entries["queue"], q)).select(
                    list(ENTRY_COLUMNS)).to_batches():
                pieces += [widen(b, decoder.columns)
                           for b in (columnar.explode(rb, mine) if len(mine) else [rb])]
        rows = pa.Table.from_batches(pieces) if pieces else None
        self._process_range(self.spark.createDataFrame(rows) if rows is not None else
                            self.spark.createDataFrame([], decoder.entries_ddl()), ends)

    def _process(self, df, batch_id: int) -> None:
        self._process_range(df, self._spark_batch_end(batch_id, df))

    def _process_static(self, df, batch_id: int) -> None:
        """A batch of the static plan (static.py): ``df`` is the plan's control rows."""
        from headrace.pipeline.static_batch import process

        process(self, df, batch_id)

    def _spark_batch_end(self, batch_id: int, df) -> dict[str, int | None]:
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

    def _run_interrupted_batch(self) -> None:
        from headrace.pipeline.restart import run_interrupted_batch

        run_interrupted_batch(self)

    def _process_range(self, df, ends: dict[str, int | None], no_data: bool = False) -> None:
        afters = {q: self.bindings.get(q, -1) for q in self.queues}
        ends = {q: max(afters[q], ends[q] if ends.get(q) is not None else -1)
                for q in self.queues}
        if not no_data and ends == afters:
            return  # everything in this Spark batch was processed before a restart
        # one SQL condition: a Column built call by call costs ~20 JVM round trips per batch
        df = df.filter(" OR ".join(f"(queue = {_sql_string(q)} AND sequence > {afters[q]} AND "
                                   f"sequence <= {ends[q]})" for q in self.queues))
        watermark = watermark_of(self.nodes, self.bindings)
        new = self._commit_batch(df, ends, watermark=watermark)
        if expiring(self.nodes) and watermark_of(self.nodes, new) != watermark:
            # Spark's "no-data batch": windows the new watermark closes are expired (and, in
            # append mode, emitted) now, not when more input happens to arrive
            self._process_range(df.limit(0), ends, no_data=True)

    def _commit_batch(self, df, ends: dict[str, int], *, watermark: int | None,
                      nodes: list[Node] | None = None, shards: set[str] | None = None,
                      marks: dict[str, int] | None = None, collect=None) -> dict[str, int]:
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
        wanted = {s for s, _ in self._outputs()} if shards is None else shards
        if collect is not None:
            result = self._absorb_control(collect(t, prev_version, wanted))
            if result["negative"]:  # settled over the queue range, by the per-batch job
                from headrace.pipeline.negative import batch_entries, settle

                result = settle(self, batch_entries(self, ends), result,
                                state_version=prev_version, t=t, write_state=True,
                                shards=wanted, watermark=watermark, nodes=nodes)
        else:
            result = self._run_stages(df, prev_version, t=t, write_state=True, shards=wanted,
                                      watermark=watermark, nodes=nodes)
        if self.state_backend == "local+backup":
            # the state of time t = the previous buckets' snapshots + the ones changed now;
            # a crashed earlier attempt of t may have left a manifest: not committed, replace it
            manifest = {**self._state_indexes(prev_version), **result["indexes"]}
            self.store.put(self._manifest_key(t), json.dumps(manifest, sort_keys=True).encode())
            version = t
        else:
            # until the progress names the new version, a restart redoes batch t (and a lagging
            # output replays it) from prev_version: it stays readable even past a snapshot
            version, repacked = checkpoint_runs(self.storage(), result["runs"],
                                                keep_from=prev_version)
            self.metrics["state_repacked_files"] += repacked
        new = {**{q: int(e) for q, e in ends.items() if e >= 0}, STATE_KEY: int(version),
               **self._graph_bindings(), **(marks or {}),
               **event_time_bindings(self.nodes, self.bindings, result["wm"])}
        commit_progress(self.persist, self.progress_shard, t, self.bindings, new)
        if result["indexes"]:  # recorded durably: make the snapshots permanent
            from headrace.spark.local_state import finalize

            finalize(self.store, self.name, result["indexes"])
        self._link_outputs(result["outputs"], t, self._outputs())
        self.time = t + 1
        self.bindings = new
        self.metrics["batches"] += 1
        seconds = time.perf_counter() - t0
        self.metrics["batch_seconds"] += seconds
        self.metrics["bad_entries"] += result["bad"]
        counts = self.store.counts()
        requests = {k: counts.get(k, 0) - batch_counts.get(k, 0)
                    + result["task_requests"].get(k, 0)
                    for k in sorted(set(counts) | set(result["task_requests"]))}
        through = ends[self.queues[0]] if len(self.queues) == 1 else ends
        self.last_batch = {"time": t, "through_sequence": through, "state_version": int(version),
                           "seconds": round(seconds, 3), "input_rows": result["input_rows"],
                           "rows_per_second": round(result["input_rows"] / max(seconds, 1e-9), 1),
                           "bad_entries": result["bad"],
                           "late_rows": result["late"], "watermark_us": watermark,
                           "requests": requests}
        if self.on_batch is not None:
            self.on_batch(dict(self.last_batch))
        log.info("batch t=%d: through %s, state v%d, %.3f s", t, ends, version, seconds)
        return new

    def _outputs(self) -> list[tuple[str, pa.Schema]]:
        """Every shard a batch writes at its time: the sinks, and the dead-letter shard."""
        out = [(s.shard, s.node.schema) for s in self.sinks]
        if self.dead_letter_shard:
            out.append((self.dead_letter_shard, DEAD_LETTER_SCHEMA))
        return out

    def _link_outputs(self, outputs: OutputCollector, t: int,
                      shards: list[tuple[str, pa.Schema]]) -> None:
        for shard, schema in shards:
            outputs.link(self.persist, shard, schema, t)

    # ---- the Spark job of a micro-batch ------------------------------------------------
    def _run_stages(self, entries_df, state_version: int | None, *, t: int, write_state: bool,
                    shards: set[str], watermark: int | None = None,
                    nodes: list[Node] | None = None, settle: bool = True) -> dict:
        """Run every operator (or ``nodes``) over the entries in one Spark job; absorb its
        control rows. A kernel's refusal (a retraction of a row never inserted) is settled
        (negative.py: fail naming the entry, or run again without it) unless ``settle`` is
        False."""
        ctx = self._task_context(state_version, t, write_state)
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
            watermark_us=watermark, decoder=self._decoder(), columns=self._columns)
        result = self._absorb_control(rows)
        if result["negative"] and settle:
            from headrace.pipeline.negative import settle as settle_negative

            result = settle_negative(self, entries_df, result, state_version=state_version,
                                     t=t, write_state=write_state, shards=shards,
                                     watermark=watermark, nodes=nodes)
        return result

    def _task_context(self, state_version: int | None, t: int,
                      write_state: bool) -> TaskContextSpec:
        return TaskContextSpec(url=self.root, stream=self.stream, state_version=state_version,
                               run_prefix=f"t{t}-{uuid.uuid4().hex[:8]}",
                               cache_dir=self.cache_dir, write_state=write_state,
                               backend=self.state_backend, local_root=self.local_root,
                               pipeline=self.name, indexes=self._state_indexes(state_version),
                               checkpoint_id=f"t{t}")

    def _decoder(self) -> Decoder:
        """Built once: the decode expressions cost hundreds of JVM calls to build."""
        sources = tuple(n for n in self.nodes if isinstance(n, SourceTable))
        if self._decode is None or self._decode.sources != list(sources):
            self._decode = Decoder(list(sources), self.max_entry_bytes)
        return self._decode

    def _absorb_control(self, rows: pa.Table | None) -> dict:
        c = absorb(rows)
        while self._warm_requests:  # the worker warm-up's reads (run)
            for k, v in self._warm_requests.pop().items():
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
        return {"runs": c.runs, "indexes": c.indexes, "outputs": c.outputs, "bad": c.bad,
                "wm": c.wm, "late": c.late, "task_requests": dict(c.task_requests),
                "input_rows": c.input_rows, "negative": c.negative}

    # ---- running ----------------------------------------------------------------------
    def run(self, *, until_idle: bool = True, max_runs: int | None = None,
            processing_time: str | None = None, timeout_s: float | None = None) -> int:
        """Recover, then process the queue. until_idle: repeat availableNow runs until one finds
        nothing new; otherwise a processingTime trigger until ``timeout_s``. Returns batches."""
        if not self.queues or not self.sinks:
            raise InvalidInput("a pipeline needs read_queue(...) and at least one write_shard")
        if expiring(self.nodes) and self.state_backend == "local+backup":
            raise InvalidInput("event-time state (watermarked windows, joins on them, interval "
                               "joins) needs state_backend='reservoir': the local+backup state "
                               "cannot expire keys yet")
        from headrace.spark.queue_source import register

        register(self.spark)
        self.recover()
        from headrace.pipeline.restart import runs_direct

        if not runs_direct(self):  # the direct job starts the workers itself
            # the workers start and load the state while the driver plans the first batch
            warm_workers(self.spark, TaskContextSpec(
                url=self.root, stream=self.stream, state_version=self.bindings.get(STATE_KEY),
                run_prefix="warm", cache_dir=self.cache_dir, backend=self.state_backend),
                on_requests=self._warm_requests.append)  # counted with the next batch's
        self._run_interrupted_batch()
        if until_idle and self.streams:  # ingest what the streams hold now, then process it
            try:
                self.streams.drain(self.checkpoint_dir, self.name)
            except Exception as e:
                raise PipelineError(f"pipeline {self.name!r}: a stream's ingest stopped: "
                                    f"{first_error_line(e)}") from e
        return run_queries(self, until_idle=until_idle, max_runs=max_runs,
                           processing_time=processing_time, timeout_s=timeout_s)

    def _splits_per_batch(self) -> int:
        return max(1, min(self.partitions, self.spark.sparkContext.defaultParallelism))

    def start(self, processing_time: str = "1 second"):
        """Run in the background; returns a :class:`~headrace.pipeline.query.PipelineQuery`
        (status, last_progress, stop(), await_termination()), like Spark's StreamingQuery."""
        from headrace.pipeline.query import PipelineQuery

        return PipelineQuery(self, processing_time)

    def read_shard(self, shard: str, as_of: int | None = None) -> pa.Table:
        """The consolidated contents of an output shard (latest complete time by default)."""
        upper = self.persist.upper(shard) or 0
        if upper == 0:
            raise InvalidInput(f"shard {shard!r} has no complete time yet")
        return self.persist.read_only(shard).snapshot(upper - 1 if as_of is None else as_of)


def _sql_string(text: str) -> str:
    """A SQL string literal of ``text`` (queue names are keys: no quotes expected, but safe)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
