"""A pipeline's Spark streaming query: the queues as one stream, its triggers, its progress.

``Pipeline.run`` recovers, then hands over here: each run is a Structured Streaming query over
every queue (``headrace.queue`` sources, unioned and tagged with their queue) whose
``foreachBatch`` is the pipeline's micro-batch (batch.py). ``until_idle``: availableNow runs
until no queue holds an entry past the ones consumed (read from the queues' manifests, not
learnt from one more query that finds nothing); else one processingTime query until stopped or
timed out, the ``read_stream`` side queries beside it. Spark's own account of each batch is kept in
``Pipeline.spark_progress``: its ``triggerExecution`` covers the whole trigger (offsets,
planning, the batch, Spark's commit log and the source's ack) — the figure to compare with
another Spark query's — while ``last_batch["seconds"]`` covers the batch function only.
"""

from __future__ import annotations

import logging
import time
from functools import reduce

from headrace.buffer import list_entries
from headrace.errors import InvalidInput
from headrace.pipeline.driver import job, restart, static_plan
from headrace.pipeline.driver.batch import BatchDriver
from headrace.pipeline.encoding.columnar import columns_option, struct_ddl
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.exec.queue_source import register, register_counted
from headrace.pipeline.exec.tasks import TaskContextSpec
from headrace.pipeline.plan.eventtime import expiring
from headrace.pipeline.plan.progress import STATE_KEY

log = logging.getLogger("headrace.pipeline")


def run(d: BatchDriver, *, until_idle: bool, max_runs: int | None, processing_time: str | None,
        timeout_s: float | None) -> int:
    """Recover, then process the queue (``Pipeline.run``). until_idle: repeat availableNow
    runs until one finds nothing new; otherwise a processingTime trigger until ``timeout_s``.
    Returns the batches committed."""
    if not d.queues or not d.sinks:
        raise InvalidInput("a pipeline needs read_queue(...) and at least one write_shard")
    if expiring(d.nodes) and d.state_backend == "local+backup":
        raise InvalidInput("event-time state (watermarked windows, joins on them, interval "
                           "joins) needs state_backend='reservoir': the local+backup state "
                           "cannot expire keys yet")
    register(d.spark)
    restart.recover(d)
    if not restart.runs_direct(d):  # the direct job starts the workers itself
        # the workers start and load the state while the driver plans the first batch
        job.warm_workers(d.spark, TaskContextSpec(
            url=d.root, stream=d.stream, state_version=d.bindings.get(STATE_KEY),
            run_prefix="warm", cache_dir=d.cache_dir, backend=d.state_backend),
            on_requests=d.warm_requests.append)  # counted with the next batch's
    restart.run_interrupted_batch(d)
    if until_idle and d.streams:  # ingest what the streams hold now, then process it
        try:
            d.streams.drain(d.checkpoint_dir, d.name)
        except Exception as e:
            raise PipelineError(f"pipeline {d.name!r}: a stream's ingest stopped: "
                                f"{first_error_line(e)}") from e
    return run_queries(d, until_idle=until_idle, max_runs=max_runs,
                       processing_time=processing_time, timeout_s=timeout_s)


def run_queries(d: BatchDriver, *, until_idle: bool, max_runs: int | None, processing_time: str | None,
                timeout_s: float | None) -> int:
    """Run the pipeline's query (after recovery); returns the batches committed."""
    try:
        return _run_queries(d, until_idle=until_idle, max_runs=max_runs,
                            processing_time=processing_time, timeout_s=timeout_s)
    finally:
        static_plan.clear(d.spark)  # the static plan's (static_plan.prepare), set on this thread


def _run_queries(d: BatchDriver, *, until_idle: bool, max_runs: int | None, processing_time: str | None,
                 timeout_s: float | None) -> int:
    start_batches = d.metrics["batches"]
    runs = 0
    while True:
        if until_idle and not queues_hold_more(d):
            break  # the next availableNow query would find nothing: don't start it (~1 s)
        before = d.metrics["batches"]
        ops = static_plan.shape_of(d) if d.static_plan else None
        stream, process = input_stream(d, static_plan.source_counter(d, ops)), d.process
        if ops is not None:  # planned once for the whole query (static_plan.py)
            stream, process = static_plan.build(d, ops, stream), _static_process(d)
            static_plan.prepare_next(d)  # the query's thread inherits it
        writer = (stream.writeStream.foreachBatch(process)
                  .option("checkpointLocation", d.checkpoint_dir))
        try:
            if until_idle:
                query = writer.trigger(availableNow=True).start()
                try:
                    query.awaitTermination()
                finally:
                    record_progress(d, query)
            else:
                trigger = processing_time or "1 second"
                d.streams.start(d.checkpoint_dir, d.name, trigger)  # run beside
                query = writer.trigger(processingTime=trigger).start()
                d.query = query
                deadline = None if timeout_s is None else time.monotonic() + timeout_s
                while query.isActive and not d.stopping.is_set() and (
                        not d.streams.failed()) and (
                        deadline is None or time.monotonic() < deadline):
                    query.awaitTermination(0.5)
                query.stop()
                record_progress(d, query)
                d.streams.stop()  # raises what killed a side query, if anything did
                query.awaitTermination()  # raises what killed it, if anything did
        except Exception as e:  # the query died: what failed inside a batch is in its text
            d.streams.stop(quiet=True)  # side queries of a continuous run, if still up
            if static_plan.BAD_MARK in str(e):  # run the batch again to name its bad entries
                restart.run_interrupted_batch(d, checked=True)
            raise PipelineError(f"pipeline {d.name!r} stopped at t={d.time}: "
                                f"{failure_text(e)}") from e
        runs += 1
        if not until_idle or d.metrics["batches"] == before:
            break
        if max_runs is not None and runs >= max_runs:
            break
    return int(d.metrics["batches"] - start_batches)


def queues_hold_more(d) -> bool:
    """Whether any queue holds an entry past what the pipeline consumed: one manifest GET
    per queue, instead of a streaming query's start, planning and stop to learn it."""
    for q in d.queues:
        if list_entries(d.store, f"{q}/manifest", d.bindings.get(q, -1), max_batches=1):
            return True
    return False


def input_stream(d, counted=None):
    """The union of every queue's stream, each row tagged with its queue (Spark's offset log
    lists the sources in this order: see ``BatchDriver.spark_batch_end``); what the pipeline
    holds is not read again; ``counted``: an accumulator the rows read are added to."""
    from pyspark.sql import functions as F

    decoder = d.decoder()
    streams = []
    for q in d.queues:
        # a queue batch read by one task per core: the first stage (fetch, JSON parse, bucket
        # hash, shuffle write) would otherwise run on one core
        source = "headrace.queue" if counted is None else register_counted(d.spark)
        r = (d.spark.readStream.format(source).option("url", d.root)
             .option("manifest_path", f"{q}/manifest")
             .option("splits_per_batch", str(d.splits_per_batch()))
             .option("retain_batches", str(d.retain_batches))
             .option("after_sequence", str(d.bindings.get(q, -1))))
        if counted is not None:
            r = r.option("rows_accumulator", str(counted.aid))
        mine = decoder.queue_columns(q)
        if len(mine):  # columnar entries of the queue's tables arrive as typed rows
            r = r.option("columns", columns_option(mine))
        if d.batches_per_trigger:
            r = r.option("max_batches_per_trigger", str(d.batches_per_trigger))
        structs = [F.col(f"`{f.name}`") if f.name in mine.names else
                   F.lit(None).cast(struct_ddl(f)).alias(f.name)
                   for f in decoder.columns]
        streams.append(r.load().select(F.lit(q).alias("queue"), "sequence", "index", "entry",
                                       *structs))
    return reduce(lambda a, b: a.unionByName(b), streams)


def record_progress(d, query) -> None:
    """Append Spark's progress of the query's batches to ``d.spark_progress``."""
    try:
        for prog in query.recentProgress:
            phases = prog["durationMs"]
            d.spark_progress.append({
                "batch_id": prog["batchId"], "input_rows": prog["numInputRows"],
                "trigger_s": phases.get("triggerExecution", 0) / 1000.0,
                "add_batch_s": phases.get("addBatch", 0) / 1000.0,
                "durations_ms": dict(phases)})  # every phase: offsets, WAL, planning, commit
    except Exception as e:  # noqa: BLE001 - an account only, never a failure
        log.debug("no Spark progress: %s", e)


def failure_text(e: Exception) -> str:
    """What stopped a query, for its PipelineError: :func:`first_error_line`, and what to do
    when a Python worker ran out of memory."""
    line = first_error_line(e)
    if "Cannot allocate memory" in line or "MemoryError" in line:
        line += (" (out of memory: where spark.executor.pyspark.memory caps the Python "
                 "workers, a task's largest allocation is the merge of one bucket's state "
                 "runs; restart with more buckets, Pipeline(buckets=...), which re-buckets "
                 "the state once, or give the workers more memory: docs/guide.md, Limits)")
    return line


def first_error_line(e: Exception) -> str:
    """The innermost Python error of a failed streaming query (Spark wraps it several times):
    a headrace error's own line first, else the last line naming an error."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    ours = [ln for ln in lines if ln.startswith("headrace.") and ": " in ln]
    if ours:
        return ours[-1][:500]
    errors = [ln for ln in lines if "Error:" in ln or "Exception:" in ln or "Fault:" in ln]
    return (errors[-1] if errors else (lines[0] if lines else repr(e)))[:500]


def _static_process(d: BatchDriver):
    """The query's ``foreachBatch`` on the static plan (static_plan.process)."""

    def process(df, batch_id: int) -> None:
        static_plan.process(d, df, batch_id)

    return process
