"""``headrace.shard``: a persist shard as a Spark batch source, streaming source and sink.

Reading (batch): ``spark.read.format("headrace.shard").option("url", U).option("shard", S)
.option("as_of", T)`` — the consolidated snapshot at T (default: the latest complete time,
upper - 1). Columns: the shard's data columns, ``time`` (long, = as_of) and ``diff`` (long).

Reading (stream): offsets are ``{"upper": u}``. The first micro-batch is the consolidated snapshot
at ``end - 1`` (times set to it); later batches are the updates with ``start <= time < end``, as
written. Then the query follows the shard as its upper advances.

Writing (stream): micro-batch id N becomes time N. Protocol:
1. each task writes its rows (plus ``diff`` = 1 if absent) as one untimed Parquet part, Create put
   under a fresh key; its commit message carries the part's key, size and CRC;
2. ``commit(messages, N)`` on the driver links the parts at time N with one CAS moving the upper to
   N + 1 — iff the upper is still <= N. If the upper is already past N the batch was committed
   before (Spark replays a batch whose commit log entry was lost, or calls commit twice): it is a
   no-op, and parts that no state references are deleted. So the output is exactly-once.
3. ``abort`` deletes the batch's parts; a crash before 2 leaves parts for the sweep.
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

from headrace.codec import crc32
from headrace.errors import InvalidInput
from headrace.persist import PersistClient, UpperMismatch
from headrace.persist import parts as P
from headrace.persist.state import PartMeta

log = logging.getLogger("headrace.persist")
NAME = "headrace.shard"


def _options(options) -> tuple[str, str]:
    url, shard = options.get("url"), options.get("shard")
    if not url or not shard:
        raise InvalidInput(f"{NAME} needs options 'url' and 'shard' (got {dict(options)})")
    return url, shard


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
        as_of = options.get("as_of")
        if as_of is None:
            upper = _latest_upper(PersistClient(self.url), self.shard)
            self.as_of = upper - 1 if upper > 0 else None
        else:
            self.as_of = int(as_of)

    def partitions(self):
        return [InputPartition(self.as_of)]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        if partition.value is None:
            return iter(())
        client = PersistClient(self.url)
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


class ShardStreamReader(DataSourceStreamReader):
    def __init__(self, options, schema):
        self.url, self.shard = _options(options)
        self.target = to_arrow_schema(schema, timezone="UTC")
        self.start_at = int(options.get("start_upper", 0))

    def initialOffset(self) -> dict:
        return {"upper": self.start_at}

    def latestOffset(self, start=None, limit=None) -> dict:
        return {"upper": _latest_upper(PersistClient(self.url), self.shard)}

    def partitions(self, start: dict, end: dict):
        s, e = int(start["upper"]), int(end["upper"])
        if e <= s:
            return []
        return [InputPartition(_Range(s, e, s == self.start_at))]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        r: _Range = partition.value
        handle = PersistClient(self.url).read_only(self.shard)
        if r.initial:
            table = _timed(handle.snapshot(r.end - 1), r.end - 1)
        else:
            table = handle.updates_between(r.start, r.end).sort_by(P.TIME)
        yield from _as_spark(table, self.target)

    def commit(self, end: dict) -> None:
        pass  # nothing is held: the shard's since is not moved by this reader

    def stop(self) -> None:
        pass


@dataclass(frozen=True)
class PartMessage(WriterCommitMessage):
    key: str
    rows: int
    size: int
    crc32: int
    schema: str


class ShardStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options, schema):
        self.url, self.shard = _options(options)
        if P.TIME in schema.fieldNames():
            raise InvalidInput(f"{NAME} sink: the micro-batch id is the time; drop the "
                               "'time' column")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartMessage | None:
        batches = list(iterator)
        if not batches or not sum(b.num_rows for b in batches):
            return None
        table = pa.Table.from_batches(batches)
        if P.DIFF not in table.column_names:
            table = table.append_column(P.DIFF, pa.array(np.ones(table.num_rows, np.int64)))
        elif table.column(P.DIFF).null_count:
            raise InvalidInput(f"{NAME} sink: null diff")
        else:
            i = table.schema.get_field_index(P.DIFF)
            table = table.set_column(i, P.DIFF, table.column(P.DIFF).cast(pa.int64()))
        client = PersistClient(self.url)
        data = P.encode_part(table)
        key = P.part_key(client.root, self.shard)
        P.put_new_blob(client.store, key, data)
        schema = P.data_schema(table).remove_metadata()
        return PartMessage(key, table.num_rows, len(data), crc32(data), P.schema_to_text(schema))

    def commit(self, messages, batchId: int) -> None:
        msgs = [m for m in messages if m is not None]  # None: a task that had no rows
        if not all(isinstance(m, PartMessage) for m in msgs):
            raise InvalidInput(f"unexpected commit messages {messages!r}")
        client = PersistClient(self.url)
        writer = client.open_writer(self.shard)
        parts = [PartMeta(m.key, batchId, batchId + 1, m.rows, m.size, m.crc32, batchId)
                 for m in msgs]
        schema = P.schema_from_text(msgs[0].schema) if msgs else None
        try:
            self._link(client, writer, parts, schema, batchId)
        finally:
            client.close()  # this worker may not live on: finish a compaction it started

    def _link(self, client, writer, parts, schema, batchId: int) -> None:
        for _ in range(100):
            state = client.state(self.shard)
            if state.upper is None or state.upper > batchId:
                referenced = {p.key for p in state.parts}
                P.delete_quietly(client.store, [p.key for p in parts if p.key not in referenced])
                log.info("shard %s: batch %d already committed (upper %s): no-op", self.shard,
                         batchId, state.upper)
                return
            try:
                writer.link_parts(parts, state.upper, batchId + 1, schema)
                return
            except UpperMismatch:
                continue  # a concurrent commit of this batch: look again
        raise UpperMismatch(batchId, client.upper(self.shard), self.shard)

    def abort(self, messages, batchId: int) -> None:
        client = PersistClient(self.url)
        client.store.delete_many([m.key for m in messages if isinstance(m, PartMessage)])


def register(spark) -> None:
    """Make ``format("headrace.shard")`` available on this SparkSession."""
    spark.dataSource.register(ShardDataSource)
