"""``headrace.shard``: a persist shard as a Spark batch source, streaming source and sink.

Reading (batch): ``spark.read.format("headrace.shard").option("url", U).option("shard", S)
.option("as_of", T)`` — the consolidated snapshot at T (default: the latest complete time,
upper - 1). Columns: the shard's data columns, ``time`` (long, = as_of) and ``diff`` (long).

Every read holds a since-capability. A batch read takes a one-shot lease in the task for as long
as it reads. A stream read is a leased reader registered by the driver-side reader object, its id
recorded in every offset (``{"upper": u, "reader": id}``): a restarted query takes the same reader
up again from its offsets (``resume_reader``), so another reader advancing since cannot take the
times it still has to read. Its lease (option ``lease_s``, default 3600 s) is heartbeated by
``latestOffset`` and moved by ``commit(end)`` to ``end - 1``; it outlives a crash by up to the lease.
Executors read under it (``attach_reader``) and re-check since after fetching parts: a read
that can no longer be served raises SinceViolation instead of returning wrong data.

Reading (stream): the first micro-batch is the consolidated snapshot at ``end - 1`` (times set to
it); later batches are the updates with ``start <= time < end``, as written. Then the query
follows the shard as its upper advances.

Writing (stream): micro-batch id N becomes time N. Protocol:
1. when the writer object is shipped to the tasks (pickled, once per batch) it fixes a registered
   writer id: a live ``w-spark…`` writer with at least half its lease left (option ``lease_s``,
   default 3600 s), else a new one (one CAS); each commit's link refreshes it, so a steady stream
   registers none;
2. each task uploads its rows (plus ``diff`` = 1 if absent) as one untimed part under that writer
   (``upload_part``); its commit message carries the PartMeta;
3. ``commit(messages, N)`` on the driver verifies the parts and links them at time N with one CAS
   moving the upper to N + 1 — iff the upper is still <= N. If the upper is already past N the
   batch was written before (Spark replays a batch whose commit log entry was lost, or calls
   commit twice): its parts are compared with what the shard holds at N — the same is a no-op
   (parts deleted), different raises DefinitenessViolation. So the output is exactly-once.
4. ``abort`` deletes the batch's parts; a crash before 3 leaves parts for the sweep (once the
   writer's lease ran out).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from headrace.errors import InvalidInput
from headrace.persist import PersistClient, ReadHandle, UpperMismatch, upload_part
from headrace.persist import parts as P
from headrace.persist.state import PartMeta
from headrace.pipeline.exec.queue_source import register_source

log = logging.getLogger("headrace.persist")
NAME = "headrace.shard"


DEFAULT_LEASE_S = 3600.0


def _options(options) -> tuple[str, str]:
    url, shard = options.get("url"), options.get("shard")
    if not url or not shard:
        raise InvalidInput(f"{NAME} needs options 'url' and 'shard' (got {dict(options)})")
    return url, shard


def _number(options, name: str, default, kind=int):
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise InvalidInput(f"{NAME} option {name!r}: {raw!r} is not a {kind.__name__}") from None
    if value < 0:
        raise InvalidInput(f"{NAME} option {name!r}: {raw!r} is negative")
    return value


def _latest_upper(client: PersistClient, shard: str) -> int:
    state = client.state(shard)
    if state.upper is not None:
        return state.upper
    return max((p.upper for p in state.parts), default=0)  # finished: past the last time


class ShardDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        url, shard = _options(self.options)
        arrow = PersistClient(url).schema(shard)
        if arrow is None:
            raise InvalidInput(f"shard {shard!r} has no schema yet (nothing written): "
                               "pass .schema(...) to read it")
        fields = list(from_arrow_schema(arrow).fields)
        return StructType(fields + [StructField(P.TIME, LongType(), True),
                                    StructField(P.DIFF, LongType(), True)])

    def reader(self, schema):
        return ShardBatchReader(self.options, schema)

    def streamReader(self, schema):
        return ShardStreamReader(self.options, schema)

    def streamWriter(self, schema, overwrite: bool):
        return ShardStreamWriter(self.options, schema)


def _as_spark(table: pa.Table, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Batches with exactly the Arrow schema Spark expects (it checks types and nullability)."""
    table = table.select(target.names)
    yield from pa.Table.from_arrays([c.cast(f.type) for c, f in zip(table.columns, target,
                                                                    strict=True)],
                                    schema=target).to_batches()


class ShardBatchReader(DataSourceReader):
    def __init__(self, options, schema):
        self.url, self.shard = _options(options)
        self.target = to_arrow_schema(schema, timezone="UTC")
        self.as_of = _number(options, "as_of", None)
        if self.as_of is None:
            upper = _latest_upper(PersistClient(self.url), self.shard)
            self.as_of = upper - 1 if upper > 0 else None

    def partitions(self):
        return [InputPartition(self.as_of)]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        if partition.value is None:
            return iter(())
        client = PersistClient(self.url)  # a one-shot lease held while the task reads
        snap = client.read_only(self.shard).snapshot(partition.value)
        yield from _as_spark(_timed(snap, partition.value), self.target)


def _timed(snapshot: pa.Table, t: int) -> pa.Table:
    cols = P.data_columns(snapshot.schema)
    times = pa.array(np.full(snapshot.num_rows, t, np.int64))
    return pa.Table.from_arrays([*(snapshot.column(c) for c in cols), times,
                                 snapshot.column(P.DIFF)], names=[*cols, P.TIME, P.DIFF])


@dataclass(frozen=True)
class _Range:
    start: int
    end: int
    initial: bool
    reader_id: str


class ShardStreamReader(DataSourceStreamReader):
    """Driver side: holds the query's leased reader (see the module docstring)."""

    def __init__(self, options, schema):
        self.url, self.shard = _options(options)
        self.target = to_arrow_schema(schema, timezone="UTC")
        self.start_at = _number(options, "start_upper", 0)
        self.lease_s = _number(options, "lease_s", DEFAULT_LEASE_S, float)
        self._client: PersistClient | None = None
        self._reader: ReadHandle | None = None

    def __getstate__(self) -> dict:
        """Executors get the options only: the reader is held here, on the driver."""
        return {**self.__dict__, "_client": None, "_reader": None}

    @property
    def client(self) -> PersistClient:
        if self._client is None:
            self._client = PersistClient(self.url, auto_compact_at=None)
        return self._client

    def _hold(self, offset: dict | None) -> ReadHandle:
        """This query's reader: taken up again from ``offset`` after a restart."""
        if self._reader is not None:
            self._reader._maybe_heartbeat()
            return self._reader
        rid = offset.get("reader") if offset else None
        if rid is None:
            self._reader = self.client.open_reader(self.shard, lease_s=self.lease_s)
        else:
            upper = int(offset["upper"])
            # the next batch reads updates from ``upper`` on (since < upper); the initial
            # snapshot's time is not known yet
            needed = upper - 1 if upper > self.start_at else None
            self._reader = self.client.resume_reader(self.shard, rid, since=needed,
                                                     lease_s=self.lease_s)
        return self._reader

    def _offset(self, upper: int) -> dict:
        return {"upper": upper, "reader": self._reader.reader_id}

    def initialOffset(self) -> dict:
        self._hold(None)
        return self._offset(self.start_at)

    def latestOffset(self, start=None, limit=None) -> dict:
        self._hold(start)
        return self._offset(_latest_upper(self.client, self.shard))

    def partitions(self, start: dict, end: dict):
        reader = self._hold(start)
        s, e = int(start["upper"]), int(end["upper"])
        if e <= s:
            return []
        return [InputPartition(_Range(s, e, s == self.start_at, reader.reader_id))]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        r: _Range = partition.value
        handle = PersistClient(self.url).attach_reader(self.shard, r.reader_id)
        if r.initial:
            table = _timed(handle.snapshot(r.end - 1), r.end - 1)
        else:
            table = handle.updates_between(r.start, r.end).sort_by(P.TIME)
        yield from _as_spark(table, self.target)

    def commit(self, end: dict) -> None:
        """Spark has recorded the batch: this query never reads below ``end - 1`` again."""
        upper = int(end["upper"])
        if upper > 0:
            self._hold(end).downgrade_since(upper - 1)

    def stop(self) -> None:
        pass  # the lease is kept for a restart; it runs out after lease_s


@dataclass(frozen=True)
class PartMessage(WriterCommitMessage):
    part: PartMeta | None  # None: the task had no rows


class ShardStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options, schema):
        self.url, self.shard = _options(options)
        self.lease_s = _number(options, "lease_s", DEFAULT_LEASE_S, float)
        self.writer_id: str | None = None
        if P.TIME in schema.fieldNames():
            raise InvalidInput(f"{NAME} sink: the micro-batch id is the time; drop the "
                               "'time' column")

    def __getstate__(self) -> dict:
        """Pickling is Spark shipping this writer to the tasks: fix the writer id first."""
        self._ensure_writer()
        return dict(self.__dict__)

    def _ensure_writer(self) -> str:
        if self.writer_id is None:
            self.writer_id = sink_writer_id(PersistClient(self.url, auto_compact_at=None),
                                            self.shard, self.lease_s)
        return self.writer_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartMessage:
        batches = list(iterator)
        if not batches or not sum(b.num_rows for b in batches):
            return PartMessage(None)
        table = pa.Table.from_batches(batches)
        if P.DIFF not in table.column_names:
            table = table.append_column(P.DIFF, pa.array(np.ones(table.num_rows, np.int64)))
        elif table.column(P.DIFF).null_count:
            raise InvalidInput(f"{NAME} sink: null diff")
        else:
            i = table.schema.get_field_index(P.DIFF)
            table = table.set_column(i, P.DIFF, table.column(P.DIFF).cast(pa.int64()))
        client = PersistClient(self.url, auto_compact_at=None)
        return PartMessage(upload_part(client.store, self.shard, self._ensure_writer(), table,
                                       root=client.root))

    def commit(self, messages, batchId: int) -> None:
        if not all(m is None or isinstance(m, PartMessage) for m in messages):
            raise InvalidInput(f"unexpected commit messages {messages!r}")
        parts = [m.part.at_time(batchId) for m in messages if m is not None and m.part]
        writers = {p.writer_id for p in parts}
        if len(writers) > 1:
            raise InvalidInput(f"{NAME} sink: batch {batchId} has parts of writers {writers}")
        client = PersistClient(self.url)
        try:
            writer = client.open_writer(self.shard, writers.pop() if writers else None)
            self._link(client, writer, parts, batchId)
        finally:
            client.close()  # this worker may not live on: finish a compaction it started

    def _link(self, client, writer, parts: list[PartMeta], batchId: int) -> None:
        for _ in range(100):
            state = client.state(self.shard)
            if state.upper is None or state.upper > batchId:
                writer.append_parts(parts, batchId, batchId + 1)  # compares, then discards
                log.info("shard %s: batch %d already committed (upper %s): no-op", self.shard,
                         batchId, state.upper)
                return
            try:  # the upper may be below the batch id: times between are empty
                writer.link_parts(parts, state.upper, batchId + 1)
                return
            except UpperMismatch:
                continue  # a concurrent commit of this batch: look again
        raise UpperMismatch(batchId, client.upper(self.shard), self.shard)

    def abort(self, messages, batchId: int) -> None:
        client = PersistClient(self.url)
        P.delete_quietly(client.store, [m.part.key for m in messages
                                        if isinstance(m, PartMessage) and m.part])


def sink_writer_id(client: PersistClient, shard: str, lease_s: float) -> str:
    """A registered Spark-sink writer of ``shard`` with at least half its lease left, reused
    across batches (and queries) so a steady stream registers no writer; else a new one."""
    now = client.clock.now_ms()
    live = [w for w in client.state(shard).writers if w.writer_id.startswith("w-spark")
            and w.heartbeat_ms + w.lease_ms - now >= w.lease_ms // 2]
    if live:
        return max(live, key=lambda w: w.heartbeat_ms).writer_id
    return client.register_writer(shard, lease_s=lease_s, tag="spark").writer_id


def register(spark) -> None:
    """Make ``format("headrace.shard")`` available on this SparkSession."""
    register_source(spark, ShardDataSource)
