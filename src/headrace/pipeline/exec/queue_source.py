"""``spark.readStream.format("headrace.queue")``: the buffer's queue as a streaming source.

Offsets are ``{"sequence": N}``: N is the next queue sequence to read, so a micro-batch from
start to end covers the entries ``start <= sequence < end``. The driver-side reader owns one
``Consumer`` (its ``initialize`` bumps the epoch, fencing any earlier query on the queue);
``latestOffset`` reads the manifest epoch-checked, ``partitions`` hands each task the locations
and metadata of its batches, and ``read`` (in executors) fetches those batch files directly —
stateless, never touching the manifest. ``commit(end)`` acks through ``end - 1`` and dequeues.

Options: ``url`` (required), ``manifest_path`` (default ``ingest/manifest``),
``max_batches_per_trigger`` (a ``ReadMaxFiles`` limit), ``batches_per_partition`` (default 1),
``columns`` (the pipeline sets it: ``columnar.columns_option`` of the struct columns of the
tables it reads from this queue — each columnar entry of those tables arrives as its rows, typed,
with no parse; see pipeline/encoding/columnar.py), ``splits_per_batch`` (default 1: a queue batch read
by that many tasks, each fetching it and keeping its share of the rows — a trade of k - 1
extra GETs per batch, and of each task decoding every columnar entry of the batch, for a first
stage that uses k cores; a micro-batch of k or more queue batches is read by k tasks of whole
batches instead, so many small batches do not cost k tasks each; the pipeline sets it to
Spark's default parallelism),
``after_sequence`` (default -1: the sequences through N are not read — a pipeline's
position when its query starts, so a query restarted on an older Spark checkpoint does not
fetch what the pipeline holds), ``rows_accumulator`` (the id of a PySpark int accumulator of
the driver's session: the rows each task reads are added to it — the pipeline's input count
when no Python stage sees every row), ``retain_batches`` (default 0: the newest N consumed
queue batches are acknowledged but kept in the queue, so a pipeline part added later can
replay them — ``start="history"``; the
manifest and the stored batches grow by N batches), ``data_path_prefix`` (default: the
manifest's folder, so ``q/manifest`` reads batches under
``q/``; a location outside it is refused), ``gc_interval_s`` / ``gc_grace_period_s`` (the
consumer's collector; 0 turns it off). A batch that cannot be read raises the buffer's typed
error (``MissingBatch`` names sequence and location); one recorded with ``headrace queue skip``
reads as empty.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from headrace.buffer import Consumer, ConsumerConfig, ManifestEntry, list_entries, read_manifest
from headrace.buffer.batch_format import DecodedBlock
from headrace.buffer.batches import fetch_block
from headrace.buffer.config import DEFAULT_DATA_PREFIX, DEFAULT_MANIFEST_PATH
from headrace.buffer.types import SkipRecord
from headrace.errors import FormatError, HeadraceError
from headrace.pipeline.encoding.columnar import columns_ddl, explode, parse_columns_option
from headrace.retry import RetryPolicy
from headrace.store import open_store

log = logging.getLogger("headrace.spark.queue_source")

SCHEMA = "sequence long, index int, entry binary, ingestion_time_ms long, metadata binary"
ARROW_SCHEMA = pa.schema([("sequence", pa.int64()), ("index", pa.int32()),
                          ("entry", pa.binary()), ("ingestion_time_ms", pa.int64()),
                          ("metadata", pa.binary())])


class QueuePartition(InputPartition):
    """The batches one task reads: (sequence, location, metadata items) each; of each batch
    only share ``split[0]`` of ``split[1]`` equal shares of its entries."""

    def __init__(self, url: str, batches: list[tuple[int, str, list[tuple[int, int, bytes]]]],
                 manifest_path: str = DEFAULT_MANIFEST_PATH,
                 data_path_prefix: str = DEFAULT_DATA_PREFIX, split: tuple[int, int] = (0, 1),
                 columns: str | None = None, rows_accumulator: int | None = None):
        super().__init__(batches[0][0] if batches else 0)
        self.url = url
        self.batches = batches
        self.manifest_path = manifest_path
        self.data_path_prefix = data_path_prefix
        self.split = split
        self.columns = columns
        self.rows_accumulator = rows_accumulator


def _int_option(options, name: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise ValueError(f"option {name}: not an integer: {raw!r}") from e
    if value < minimum:
        raise ValueError(f"option {name}: must be >= {minimum}, got {value}")
    return value


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options) -> None:
        url = options.get("url")
        if not url:
            raise ValueError("option url: required (the store URL holding the queue)")
        self.url = url
        self.manifest_path = options.get("manifest_path", DEFAULT_MANIFEST_PATH)
        default_prefix = self.manifest_path.rpartition("/")[0] or DEFAULT_DATA_PREFIX
        self.data_path_prefix = options.get("data_path_prefix", default_prefix)
        self.max_batches = _int_option(options, "max_batches_per_trigger", None, 1)
        self.batches_per_partition = _int_option(options, "batches_per_partition", 1, 1)
        self.splits_per_batch = _int_option(options, "splits_per_batch", 1, 1)
        self.retain_batches = _int_option(options, "retain_batches", 0, 0)
        self.after_sequence = _int_option(options, "after_sequence", -1, -1)
        self.rows_accumulator = _int_option(options, "rows_accumulator", None, 0)
        self.columns = options.get("columns")
        self.gc_interval_s = float(options.get("gc_interval_s", "300"))
        self.gc_grace_period_s = float(options.get("gc_grace_period_s", "600"))
        self._consumer: Consumer | None = None
        self._target: int | None = None  # availableNow: never read past this sequence
        self._planned: dict[int, ManifestEntry] = {}

    def __getstate__(self) -> dict:
        # Spark pickles the reader to ship read() to executors: they get no consumer
        state = dict(self.__dict__)
        state["_consumer"] = None
        state["_planned"] = {}
        return state

    @property
    def consumer(self) -> Consumer:
        """The driver-side consumer, created (and the epoch bumped) on first use."""
        if self._consumer is None:
            consumer = Consumer(ConsumerConfig(
                url=self.url, manifest_path=self.manifest_path,
                data_path_prefix=self.data_path_prefix, gc_interval_s=self.gc_interval_s,
                gc_grace_period_s=self.gc_grace_period_s))
            consumer.initialize()  # fences any earlier query on this queue
            self._consumer = consumer
        return self._consumer

    # -- offsets -----------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        pending = self.consumer.pending_entries(1)
        if pending:
            return {"sequence": pending[0].sequence}
        return {"sequence": read_manifest(self.consumer.store, self.manifest_path).next_sequence}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_batches is not None:
            return ReadMaxFiles(self.max_batches)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = read_manifest(self.consumer.store, self.manifest_path).next_sequence

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["sequence"])
        entries = [e for e in self.consumer.pending_entries() if e.sequence >= begin]
        if self._target is not None:
            entries = [e for e in entries if e.sequence < self._target]
        if isinstance(limit, ReadMaxFiles):
            entries = entries[: max(1, limit.max_files)]
        elif not isinstance(limit, ReadAllAvailable):
            log.debug("read limit %r is not supported; reading all available", limit)
        for e in entries:
            self._planned[e.sequence] = e
        return {"sequence": entries[-1].sequence + 1 if entries else begin}

    def reportLatestOffset(self) -> dict | None:
        return {"sequence": read_manifest(self.consumer.store, self.manifest_path).next_sequence}

    # -- planning and reading ----------------------------------------------------------------
    def partitions(self, start: dict, end: dict) -> list[QueuePartition]:
        lo, hi = max(int(start["sequence"]), self.after_sequence + 1), int(end["sequence"])
        if hi <= lo:
            return []
        wanted = range(lo, hi)
        if not all(s in self._planned for s in wanted):  # a restarted query replaying a batch
            for e in list_entries(self.consumer.store, self.manifest_path, lo - 1):
                self._planned[e.sequence] = e
        missing = [s for s in wanted if s not in self._planned]
        if missing:
            raise HeadraceError(
                f"queue {self.manifest_path!r} no longer holds sequences {missing[0]}.."
                f"{missing[-1]} of the micro-batch [{lo}, {hi}): they were dequeued")
        batches = [(s, self._planned[s].location,
                    [(m.start_index, m.ingestion_time_ms, m.payload)
                     for m in self._planned[s].metadata]) for s in wanted]
        n, k = self.batches_per_partition, self.splits_per_batch
        if k > 1 and len(batches) >= k:  # enough whole batches for k tasks: none is split
            n, k = max(n, -(-len(batches) // k)), 1
        return [QueuePartition(self.url, batches[i : i + n], self.manifest_path,
                               self.data_path_prefix, (j, k), self.columns,
                               self.rows_accumulator)
                for i in range(0, len(batches), n) for j in range(k)]

    def read(self, partition: QueuePartition) -> Iterator[pa.RecordBatch]:
        counted = None
        if partition.rows_accumulator is not None:
            from pyspark.accumulators import INT_ACCUMULATOR_PARAM, _deserialize_accumulator

            # the driver's accumulator, as a task sees one that travelled in its closure: the
            # Python worker reports its value with the task's result
            counted = _deserialize_accumulator(partition.rows_accumulator, 0,
                                               INT_ACCUMULATOR_PARAM)
        yield from read_batches(partition.url, partition.manifest_path,
                                partition.data_path_prefix, partition.batches,
                                partition.split, partition.columns, counted)

    def commit(self, end: dict) -> None:
        through = int(end["sequence"]) - 1
        if through - self.retain_batches >= 0:  # the newest retain_batches stay in the queue
            self.consumer.ack_through(through - self.retain_batches)
            self.consumer.flush()
        for s in [s for s in self._planned if s <= through]:
            del self._planned[s]

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


def read_batches(url: str, manifest_path: str, data_path_prefix: str,
                 batches: list[tuple[int, str, list[tuple[int, int, bytes]]]],
                 split: tuple[int, int] = (0, 1), columns: str | None = None,
                 counted=None):
    """Executor side: fetch and decode each (sequence, location, metadata) batch, keeping
    share ``split[0]`` of ``split[1]`` of its rows; a recorded skip yields nothing, an
    unreadable batch raises the buffer's typed error. ``columns`` (an option value): columnar
    entries of those tables become their rows (``columnar.explode``). ``counted``: an
    accumulator the rows yielded are added to."""
    share, shares = split
    structs = parse_columns_option(columns) if columns else None
    store = open_store(url)
    retry = RetryPolicy()
    for sequence, location, metadata in batches:
        got = fetch_block(store, manifest_path, ManifestEntry(sequence, location, ()),
                          data_path_prefix=data_path_prefix, retry=retry)
        if isinstance(got, SkipRecord):
            continue
        rb = batch_to_arrow(got, sequence, location, metadata)
        pieces = [rb] if structs is None else explode(rb, structs)
        if shares > 1:  # zero-copy: the rows keep their entry's index within the batch
            pieces = _share(pieces, share, shares)
        if counted is not None:
            counted.add(sum(p.num_rows for p in pieces))
        yield from pieces


def _share(pieces: list[pa.RecordBatch], share: int, shares: int) -> list[pa.RecordBatch]:
    """Share ``share`` of ``shares`` equal shares of the rows of ``pieces``, as slices."""
    n = sum(p.num_rows for p in pieces)
    lo, hi = n * share // shares, n * (share + 1) // shares
    out, at = [], 0
    for p in pieces:
        a, b = max(lo, at), min(hi, at + p.num_rows)
        if a < b:
            out.append(p.slice(a - at, b - a))
        at += p.num_rows
    return out


def batch_to_arrow(block: DecodedBlock, sequence: int, location: str,
                   metadata: list[tuple[int, int, bytes]]) -> pa.RecordBatch:
    """One decoded batch as an Arrow record batch of the source's schema (vectorised)."""
    n = len(block.starts)
    entry = block.entry_array()
    md_starts = np.array([m[0] for m in metadata], dtype=np.int64)
    if len(md_starts) and (np.any(np.diff(md_starts) < 0) or md_starts[-1] > n):
        raise FormatError(location, None, f"metadata start indexes {md_starts.tolist()} are "
                          f"not ascending within the batch's {n} records")
    ids = np.searchsorted(md_starts, np.arange(n), side="right") - 1
    take = pa.array(ids, mask=ids < 0)
    times = pa.array([m[1] for m in metadata], pa.int64()).take(take)
    payloads = pa.array([m[2] for m in metadata], pa.binary()).take(take)
    return pa.RecordBatch.from_arrays(
        [pa.array(np.full(n, sequence, dtype=np.int64)), pa.array(np.arange(n, dtype=np.int32)),
         entry, times, payloads], schema=ARROW_SCHEMA)


class QueueDataSource(DataSource):
    """The ``headrace.queue`` streaming data source."""

    @classmethod
    def name(cls) -> str:
        return "headrace.queue"

    def schema(self) -> str:
        columns = self.options.get("columns")
        return SCHEMA + (", " + columns_ddl(parse_columns_option(columns)) if columns else "")

    def streamReader(self, schema) -> QueueStreamReader:
        return QueueStreamReader(self.options)


class CountedQueueDataSource(QueueDataSource):
    """The same source under the name the pipeline reads its queues by, registered from the
    session's Python (``register_counted``): the JVM relays the accumulator updates of such a
    source's tasks to the driver, not those of a source PySpark found by its ``pyspark_*``
    package (measured: the ``rows_accumulator`` option then counts nothing)."""

    @classmethod
    def name(cls) -> str:
        return "headrace.queue.counted"


def register_counted(spark) -> str:
    """Register ``CountedQueueDataSource`` on ``spark`` (once); its format name."""
    register_source(spark, CountedQueueDataSource)
    return CountedQueueDataSource.name()


def register(spark) -> None:
    """Make ``spark.readStream.format("headrace.queue")`` available in this session."""
    register_source(spark, QueueDataSource)


def register_source(spark, source) -> None:
    """Register the DataSource class ``source`` on ``spark`` unless its name resolves already:
    re-registering a statically registered source works but logs a WARN on every call."""
    jsession = getattr(spark, "_jsparkSession", None)  # None on Spark Connect: just register
    if jsession is not None and \
            jsession.sessionState().dataSourceManager().dataSourceExists(source.name()):
        return
    spark.dataSource.register(source)
