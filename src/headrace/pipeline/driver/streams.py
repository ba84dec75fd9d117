"""``p.read_stream(df, name)``: any Spark streaming DataFrame as a pipeline source, exactly once.

Ingest, then process. A side Spark query (its own checkpoint, ``foreachBatch``) copies each
micro-batch of ``df`` into the internal queue ``<pipeline>.stream.<name>`` as columnar queue
entries of table ``name`` (encoding/columnar.py: Arrow record batches of the stream's rows, so neither
side parses text); the pipeline reads that queue like any other, so its recovery, offsets,
dead-letter shard and exactly-once apply unchanged.

One ingest batch b (Spark's batch id) of side query Q:

1. read the *intent* object ``<queue>.ingest`` = {query, batch, next_sequence}. Q differs: the
   side query's checkpoint was replaced -> ``StreamCheckpointLost`` (Spark would re-read the
   source from its start; we refuse rather than duplicate). batch > b, or batch == b and the
   manifest's ``next_sequence`` moved past the recorded one: b's entries landed before a crash
   -> skip (the replay appends nothing);
2. executors encode the rows as columnar entries (``mapInArrow``: Spark hands them over as
   Arrow) and upload them as batch files
   (``{queue}/{ULID}.batch``, Create, ~8 MiB each): the data never reaches the driver, which
   collects one small row per file;
3. unless step 1 found b's intent already, put the intent {Q, b, next_sequence now} (CAS on its
   etag);
4. append every file of b to the manifest in **one** CAS whose step re-checks that
   ``next_sequence`` is still the intent's: the batch lands whole or not at all, and an
   ambiguous put (or a zombie attempt) that landed is seen and not repeated.

The manifest's ``next_sequence`` never decreases (dequeues keep it), so the check in step 1 holds
even after the pipeline consumed and dequeued b's entries. The internal queue has exactly one
producer, this ingest. Files of an attempt that crashed before step 4 are orphans the queue's
collector deletes after its grace period; step 4 refuses files older than half of it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.buffer.batch_format import COMPRESSION_ZSTD, FOOTER, VERSION
from headrace.buffer.manifest_format import append_entry, entry_after, read_footer
from headrace.buffer.queue import CasCounters, _cas_loop, default_cas_policy, read_manifest_bytes
from headrace.buffer.types import Metadata, StaleBatch
from headrace.codec import new_ulid, ulid_timestamp_ms, zstd_compress
from headrace.errors import (
    AlreadyExists,
    FormatError,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from headrace.pipeline.encoding import columnar
from headrace.pipeline.encoding.types import arrow_schema
from headrace.pipeline.errors import StreamCheckpointLost, StreamIngestError
from headrace.pipeline.exec.workers import task_store
from headrace.retry import RetryPolicy
from headrace.store import CREATE, IfMatch

log = logging.getLogger("headrace.pipeline.streams")

STREAM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
FILE_BYTES = 8 << 20  # entry bytes per uploaded batch file (readers bound a block at 128 MiB)
APPEND_WINDOW_MS = 300_000  # half of the queue collector's default grace period (600 s)
_UPLOAD_ATTEMPTS = 3  # fresh uploads when an append finds its files past the window
_FILES_DDL = "location string, records long, bytes long"


@dataclass(frozen=True)
class Intent:
    """Batch ``batch`` of side query ``query`` appends right after ``next_sequence - 1``."""

    query: str
    batch: int
    next_sequence: int


def stream_schema(df, name: str) -> pa.Schema:
    """The Arrow schema of a streaming DataFrame's rows, or InvalidInput naming what is wrong
    (not streaming, a bad name, a column type the pipeline does not carry)."""
    if not isinstance(name, str) or not STREAM_NAME.match(name):
        raise InvalidInput(f"read_stream name {name!r}: want a letter, then letters, digits "
                           "or '_' (at most 64): it names the table and an internal queue")
    if not getattr(df, "isStreaming", False):
        raise InvalidInput(f"read_stream({name!r}): not a streaming DataFrame (use "
                           "spark.readStream...); a batch DataFrame can be produced to a "
                           "queue instead")
    return arrow_schema(df.schema, f"stream {name!r}")


def entries_block(entries: pa.Array) -> bytes:
    """A batch file (buffer format: ``[len u32][data]`` records, zstd, footer) of an Arrow array
    of entries, built by Arrow kernels: no Python loop per record."""
    n = len(entries)
    if entries.null_count:
        raise InvalidInput("entries must not be NULL")
    lengths = pc.binary_length(entries).to_numpy(zero_copy_only=False).astype("<u4")
    prefixes = pa.Array.from_buffers(pa.binary(), n, [
        None, pa.py_buffer(np.arange(0, 4 * n + 1, 4, dtype=np.int32)),
        pa.py_buffer(lengths.tobytes())])
    joined = pc.binary_join_element_wise(prefixes, entries, b"")
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=n + 1,
                            offset=4 * joined.offset)
    block = memoryview(joined.buffers()[2])[int(offsets[0]):int(offsets[n])]
    return zstd_compress(block, 3) + FOOTER.pack(COMPRESSION_ZSTD, n, VERSION)


def upload_task(url: str, queue: str, stream: str, batch_id: int, schema: pa.Schema,
                file_bytes: int = FILE_BYTES):
    """mapInArrow function: a partition's rows (the stream's columns) -> columnar entries in
    batch files under ``queue/``, one row (location, records = rows, bytes) per file."""
    def fn(batches):
        store = task_store(url)
        pending: list[bytes] = []
        rows: list[int] = []
        size = 0

        def upload() -> pa.RecordBatch:
            data = entries_block(pa.array(pending, pa.binary()))
            location = f"{queue}/{new_ulid()}.batch"
            RetryPolicy().call(lambda: store.put(location, data, CREATE),
                               what=f"upload {location}")
            return pa.RecordBatch.from_arrays(
                [pa.array([location]), pa.array([sum(rows)], pa.int64()),
                 pa.array([len(data)], pa.int64())], names=["location", "records", "bytes"])

        for b in batches:
            if not b.num_rows:
                continue
            # Spark marks columns nullable or not per batch, and gives timestamps in the
            # session's time zone: the same values, cast to the table's declared types
            for entry, n in columnar.encode_counted(
                    stream, b, schema, entry_bytes=min(columnar.ENTRY_BYTES, file_bytes)):
                if len(entry) > columnar.MAX_ENTRY_BYTES:
                    raise InvalidInput(
                        f"stream {stream!r} batch {batch_id}: a row takes {len(entry)} bytes "
                        f"as a columnar entry, more than {columnar.MAX_ENTRY_BYTES}")
                if pending and size + len(entry) + 4 > file_bytes:
                    yield upload()
                    pending, rows, size = [], [], 0
                pending.append(entry)
                rows.append(n)
                size += len(entry) + 4
        if pending:
            yield upload()

    return fn


class StreamIngest:
    """One stream's side query and the protocol of the module docstring."""

    def __init__(self, df, *, url: str, store, queue: str, table: str, schema: pa.Schema,
                 checkpoint: str | None = None, file_bytes: int = FILE_BYTES):
        self.df, self.url, self.store, self.queue, self.table = df, url, store, queue, table
        self.schema = schema  # the table's declared schema (stream_schema of ``df``)
        self.checkpoint = checkpoint  # None: <the pipeline's checkpoint>/streams/<table>
        self.file_bytes = file_bytes
        self.manifest_path = f"{queue}/manifest"
        self.intent_key = f"{queue}.ingest"
        self.metrics: dict[str, int] = defaultdict(int)
        # crash-test hook: callback(step, batch_id) after the "intent" put and the "append"
        self.on_step = None
        self._query = None
        self._query_id: str | None = None
        self._started = threading.Event()
        self._policy = default_cas_policy()
        self._counters = CasCounters()

    # ---- the side query ----------------------------------------------------------------
    def entries(self, df):
        """``df``'s rows to become queue entries: the stream's columns, in the table's order
        (the upload task encodes them, ``upload_task``)."""
        from pyspark.sql import functions as F

        return df.select(*[F.col(f"`{c}`") for c in self.schema.names])

    def _writer(self, checkpoint_root: str, pipeline: str):
        entries = self.entries(self.df)
        location = self.checkpoint or f"{checkpoint_root.rstrip('/')}/streams/{self.table}"
        return (entries.writeStream.foreachBatch(self._foreach_batch)
                .queryName(f"headrace-{pipeline}-{self.table}")
                .option("checkpointLocation", location))

    def _foreach_batch(self, df, batch_id: int) -> None:
        self._started.wait()  # the query's id is known once start() returned
        self.ingest(df, batch_id, self._query_id)

    def _launch(self, writer):
        self._started.clear()
        query = writer.start()
        self._query, self._query_id = query, str(query.id)
        self._started.set()
        return query

    def drain(self, checkpoint_root: str, pipeline: str) -> None:
        """Ingest everything the stream has now (availableNow), then return."""
        query = self._launch(self._writer(checkpoint_root, pipeline).trigger(availableNow=True))
        try:
            query.awaitTermination()
        finally:
            self._query = None

    def start(self, checkpoint_root: str, pipeline: str, processing_time: str) -> None:
        self._launch(self._writer(checkpoint_root, pipeline)
                     .trigger(processingTime=processing_time))

    def failed(self) -> bool:
        """True when the running side query stopped on its own (an error)."""
        return self._query is not None and not self._query.isActive

    def stop(self) -> None:
        """Stop the side query; raises what killed it, if anything did."""
        query, self._query = self._query, None
        if query is not None:
            query.stop()
            query.awaitTermination()

    # ---- one ingest batch --------------------------------------------------------------
    def ingest(self, entries_df, batch_id: int, query_id: str) -> int:
        """Append Spark batch ``batch_id`` of ``entries_df`` (the rows, ``entries``) to the
        queue exactly once; returns the rows appended (0 on a replay)."""
        intent, etag = self._read_intent()
        if intent is not None and intent.query != query_id:
            raise StreamCheckpointLost(
                f"stream {self.table!r}: queue {self.queue!r} was written by side query "
                f"{intent.query} (through batch {intent.batch}), but this side query is "
                f"{query_id}: its Spark checkpoint was deleted or replaced, so Spark would read "
                "the source again from its start. Restore the checkpoint, or ingest under a "
                "new stream name (a new pipeline)")
        if intent is not None and (intent.batch > batch_id or (
                intent.batch == batch_id and self._next_sequence() > intent.next_sequence)):
            log.info("stream %s: batch %d is in queue %s already; not appended again",
                     self.table, batch_id, self.queue)
            self.metrics["replayed_batches"] += 1
            return 0
        t0 = time.perf_counter()
        for _ in range(_UPLOAD_ATTEMPTS):
            files = entries_df.mapInArrow(
                upload_task(self.url, self.queue, self.table, batch_id, self.schema,
                            self.file_bytes),
                _FILES_DDL).collect()
            if not files:
                return 0
            if intent is None or intent.batch != batch_id:
                intent = Intent(query_id, batch_id, self._next_sequence())
                etag = self._put_intent(intent, etag)
                if self.on_step is not None:
                    self.on_step("intent", batch_id)
            try:
                n = self._append(sorted(files, key=lambda r: r["location"]), intent)
            except StaleBatch as e:
                log.warning("stream %s batch %d: %s; uploading again", self.table, batch_id, e)
                self.metrics["reuploads"] += 1
                continue
            self.metrics["batches"] += 1
            self.metrics["rows"] += n
            self.metrics["files"] += len(files)
            self.metrics["bytes"] += sum(r["bytes"] for r in files)
            log.info("stream %s: batch %d, %d rows in %d files, %.3f s", self.table, batch_id,
                     n, len(files), time.perf_counter() - t0)
            if self.on_step is not None:
                self.on_step("append", batch_id)
            return n
        raise StreamIngestError(f"stream {self.table!r} batch {batch_id}: gave up after "
                                f"{_UPLOAD_ATTEMPTS} uploads: encoding and uploading take longer "
                                f"than the {APPEND_WINDOW_MS} ms append window")

    def _append(self, files: list, intent: Intent) -> int:
        """All of the batch's files in one manifest CAS, unless the batch landed already."""
        now_ms = int(time.time() * 1000)
        payload = json.dumps({"stream": self.table, "query": intent.query,
                              "batch": intent.batch}, sort_keys=True).encode()
        oldest = min(ulid_timestamp_ms(r["location"].rsplit("/", 1)[1][:-len(".batch")])
                     for r in files)

        def step(data: bytes, ambiguous: bool):
            footer = read_footer(data, self.manifest_path)
            if footer.next_sequence < intent.next_sequence:
                raise StreamIngestError(
                    f"queue {self.queue!r} assigned sequences below {footer.next_sequence} "
                    f"only, but {self.intent_key!r} recorded {intent.next_sequence}: the "
                    "queue was replaced; rows of earlier batches may be lost")
            if footer.next_sequence > intent.next_sequence:
                self._check_landed(data, intent)
                return None, 0
            age = int(time.time() * 1000) - oldest
            if age >= APPEND_WINDOW_MS:
                raise StaleBatch(files[0]["location"], age, APPEND_WINDOW_MS)
            buf = bytearray(data)
            for r in files:
                append_entry(buf, r["location"], [Metadata(0, now_ms, payload)],
                             self.manifest_path)
            return bytes(buf), sum(r["records"] for r in files)

        return _cas_loop(self.store, self.manifest_path, self._policy, self._counters, step,
                         f"ingest of stream {self.table!r}")

    def _check_landed(self, data: bytes, intent: Intent) -> None:
        """The manifest moved past the intent: its first new entry (if not dequeued yet) must
        be this batch's, else something else writes the internal queue."""
        entry = entry_after(data, intent.next_sequence - 1, self.manifest_path)
        if entry is None or entry.sequence != intent.next_sequence:
            return  # dequeued by the pipeline: next_sequence alone says it landed
        try:
            got = json.loads(entry.metadata[0].payload)
        except (IndexError, ValueError):
            got = None
        want = {"stream": self.table, "query": intent.query, "batch": intent.batch}
        if got != want:
            raise StreamIngestError(
                f"queue {self.queue!r} sequence {entry.sequence} holds {got!r}, not batch "
                f"{intent.batch} of stream {self.table!r}: the internal queue of a stream has "
                "one producer, its ingest")

    # ---- the intent object -------------------------------------------------------------
    def _next_sequence(self) -> int:
        data, _ = read_manifest_bytes(self.store, self.manifest_path)
        return read_footer(data, self.manifest_path).next_sequence

    def _read_intent(self) -> tuple[Intent | None, str | None]:
        try:
            got = self.store.get(self.intent_key)
        except NotFound:
            return None, None
        try:
            obj = json.loads(got.data)
            intent = Intent(str(obj["query"]), int(obj["batch"]), int(obj["next_sequence"]))
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(self.intent_key, 0, f"not an ingest intent: {e}") from e
        return intent, got.etag

    def _put_intent(self, intent: Intent, etag: str | None) -> str:
        data = json.dumps(asdict(intent), sort_keys=True).encode()
        for _ in RetryPolicy().delays():
            try:
                return self.store.put(self.intent_key, data,
                                      CREATE if etag is None else IfMatch(etag))
            except (AlreadyExists, PreconditionFailed) as e:
                current, current_etag = self._read_intent()
                if current == intent:  # our own put landed; its reply was lost
                    return current_etag
                raise StreamIngestError(f"stream {self.table!r}: {self.intent_key!r} changed "
                                        f"under batch {intent.batch} (now {current}): another "
                                        "ingest of this stream is running") from e
            except StoreError as e:
                if not e.retryable:
                    raise
        raise StreamIngestError(f"stream {self.table!r}: could not write {self.intent_key!r}")


class StreamSet(list):
    """The pipeline's streams: drained before a run, or running beside a continuous one."""

    def drain(self, checkpoint_root: str, pipeline: str) -> None:
        for s in self:
            s.drain(checkpoint_root, pipeline)

    def start(self, checkpoint_root: str, pipeline: str, processing_time: str) -> None:
        try:
            for s in self:
                s.start(checkpoint_root, pipeline, processing_time)
        except BaseException:
            self.stop()
            raise

    def failed(self) -> bool:
        return any(s.failed() for s in self)

    def stop(self, quiet: bool = False) -> None:
        """Stop every side query; raise the first one's error (unless ``quiet``: the caller
        is raising its own), after stopping them all."""
        first = None
        for s in self:
            try:
                s.stop()
            except Exception as e:  # noqa: BLE001 - the others still need stopping
                first = first or e
        if first is not None and not quiet:
            raise first
