"""``Pipeline``: a PySpark streaming job over headrace's queue, state and shards, exactly once.

Define the query with the builder's methods and the fluent :class:`~headrace.pipeline.api.frame.
Frame` API, then ``run()`` it (recovery, then micro-batches) or ``start()`` it in the background.
The running side is a :class:`~headrace.pipeline.driver.batch.BatchDriver` (``driver``): the
pipeline's settings, position and counters below are the driver's, read through the pipeline.
"""

from __future__ import annotations

import os

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline.api.builder import PipelineBuilder
from headrace.pipeline.api.query import PipelineQuery
from headrace.pipeline.driver import restart, trigger
from headrace.pipeline.driver.batch import BatchDriver
from headrace.pipeline.exec.decode import MAX_ENTRY_BYTES
from headrace.pipeline.exec.tasks import INLINE_MAX
from headrace.pipeline.plan.evolve import STATE_BACKENDS
from headrace.pipeline.plan.nodes import check_missing_fields
from headrace.store import CountingStore, open_store

DEFAULT_BUCKETS = 32  # key groups: the most tasks a stage can use; ~3M keys each at 100M


class _Driven:
    """An attribute of the pipeline's driver, read (and, where the driver allows, set) through
    the pipeline."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.driver, self.name)

    def __set__(self, obj, value) -> None:
        setattr(obj.driver, self.name, value)


class Pipeline(PipelineBuilder):
    """Define the query (see :class:`PipelineBuilder`, :mod:`headrace.pipeline.api.frame`), then
    run() it: recovery, then micro-batches, exactly once."""

    # settings
    spark = _Driven()
    root = _Driven()
    name = _Driven()
    buckets = _Driven()
    partitions = _Driven()
    state_backend = _Driven()
    on_bad_entry = _Driven()
    max_entry_bytes = _Driven()
    output_inline_max = _Driven()
    dead_letter_shard = _Driven()
    batches_per_trigger = _Driven()
    retain_batches = _Driven()
    static_plan = _Driven()
    cache_dir = _Driven()
    local_root = _Driven()
    # where things are
    store = _Driven()
    persist = _Driven()
    stream = _Driven()
    progress_shard = _Driven()
    checkpoint_dir = _Driven()
    # the graph (the builder adds to it)
    nodes = _Driven()
    sinks = _Driven()
    queues = _Driven()
    streams = _Driven()
    # the committed position and what the runs so far did
    time = _Driven()
    bindings = _Driven()
    metrics = _Driven()
    on_batch = _Driven()  # optional callback(dict) after each committed batch
    last_batch = _Driven()
    last_history = _Driven()
    last_rescale = _Driven()
    spark_progress = _Driven()

    def __init__(self, spark, root: str, *, name: str = "pipeline", partitions: int | None = None,
                 buckets: int = DEFAULT_BUCKETS, state_backend: str = "reservoir",
                 checkpoint_dir: str | None = None, cache_dir: str | None = None, store=None,
                 batches_per_trigger: int | None = None, local_root: str | None = None,
                 on_bad_entry: str = "fail", max_entry_bytes: int = MAX_ENTRY_BYTES,
                 output_inline_max: int = INLINE_MAX, retain_batches: int = 0,
                 static_plan: bool = True, missing_fields: str = "bad"):
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
        # read_queue's default: a JSON entry that omits a column is bad, or the column NULL
        self.missing_fields = check_missing_fields(missing_fields, "Pipeline")
        # Spark's workers may run in another directory: a local root must be absolute
        root = root if "://" in root else os.path.abspath(root)
        self.driver = BatchDriver(
            spark, root=root, name=name,
            # one task per core: measured on 2 cores, 1M keys, 20k-row deltas, 4 tasks (two
            # waves, each task paying its fixed cost of opening, writing a run and an output
            # part) took 0.46-0.63 s per trigger against 0.34-0.39 s for 2 (docs/pipeline.md)
            partitions=partitions or spark.sparkContext.defaultParallelism,
            buckets=buckets, state_backend=state_backend, checkpoint_dir=checkpoint_dir,
            cache_dir=cache_dir,
            store=CountingStore(store if store is not None else open_store(root)),
            batches_per_trigger=batches_per_trigger, local_root=local_root,
            on_bad_entry=on_bad_entry, max_entry_bytes=max_entry_bytes,
            output_inline_max=output_inline_max, retain_batches=retain_batches,
            static_plan=bool(static_plan))

    def storage(self):
        """The reservoir stream of the state."""
        return self.driver.storage()

    def recover(self) -> int:
        """Bring every output up to the progress shard; returns the time to continue at
        (driver/restart.py: new parts, history, a change of buckets)."""
        return restart.recover(self.driver)

    def process_entries(self, entries: pa.Table) -> None:
        """Run one micro-batch over queue entries given as Arrow (sequence, index, entry, and
        ``queue`` when the pipeline reads several), outside a streaming query (backfills,
        tests); the same protocol as a streamed batch."""
        self.driver.process_entries(entries)

    def run(self, *, until_idle: bool = True, max_runs: int | None = None,
            processing_time: str | None = None, timeout_s: float | None = None) -> int:
        """Recover, then process the queue. until_idle: repeat availableNow runs until one finds
        nothing new; otherwise a processingTime trigger until ``timeout_s``. Returns batches."""
        return trigger.run(self.driver, until_idle=until_idle, max_runs=max_runs,
                           processing_time=processing_time, timeout_s=timeout_s)

    def start(self, processing_time: str = "1 second") -> PipelineQuery:
        """Run in the background; returns a :class:`~headrace.pipeline.api.query.PipelineQuery`
        (status, last_progress, stop(), await_termination()), like Spark's StreamingQuery."""
        return PipelineQuery(self, processing_time)

    def read_shard(self, shard: str, as_of: int | None = None) -> pa.Table:
        """The consolidated contents of an output shard (latest complete time by default)."""
        upper = self.persist.upper(shard) or 0
        if upper == 0:
            raise InvalidInput(f"shard {shard!r} has no complete time yet")
        return self.persist.read_only(shard).snapshot(upper - 1 if as_of is None else as_of)
