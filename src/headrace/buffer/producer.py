"""Producer: buffers produce() calls into batches, uploads them, enqueues their locations.

Two named threads per producer. ``headrace-buffer-producer`` owns the batch being built:
``produce`` hands it entries over a bounded queue (``max_buffered_inputs``); when it falls
behind, callers block, which is the backpressure. A batch is cut when it exceeds
``flush_size_bytes`` (RFC 0001: a loose limit, so one produce call may carry it past) or when
``flush_interval_s`` has passed since its first entry, encoded, and handed to ``headrace-buffer-uploader`` (a queue of one, so at most two encoded batches wait),
which puts ``{data_path_prefix}/{ULID}.batch`` with Create, appends the location to the manifest
(CAS; refused past half the collector's grace period, then re-uploaded under a fresh name),
checks the file is still there, and only then resolves that batch's handles — in hand-off
order, so per-producer order holds.
Encoding the next batch (CPU) overlaps the upload of the previous one (I/O). A failed flush fails
every handle of its batch with the cause, so nothing is reported durable that is not.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from headrace.buffer.batch_format import COMPRESSIONS, encode_batch
from headrace.buffer.config import ProducerConfig
from headrace.buffer.queue import QueueProducer
from headrace.buffer.types import Metadata, StaleBatch
from headrace.codec import Clock, SystemClock, new_ulid, ulid_timestamp_ms
from headrace.errors import AlreadyExists, HeadraceError, InvalidInput, NotFound
from headrace.metrics import PrometheusExport
from headrace.retry import RetryPolicy
from headrace.store import CREATE

log = logging.getLogger("headrace.buffer.producer")
_STOP = object()
_MAX_STALE_REUPLOADS = 5  # fresh names tried when appends keep missing their window
_MAX_PUT_BACKS = 3  # a file that vanished after its append is put back at most this often


class DurabilityWatcher:
    """Tells when the entries of one produce() call are durable (or why they never will be)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.sequence: int | None = None  # queue sequence of the batch, once durable
        self.location: str | None = None
        self.start_index: int | None = None  # index of the first entry inside the batch

    def _resolve(self, sequence: int, location: str) -> None:
        self.sequence, self.location = sequence, location
        self._done.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> bool | None:
        """None while pending; True once durable; raises the cause if the flush failed."""
        if not self._done.is_set():
            return None
        if self._error is not None:
            raise self._error
        return True

    def await_durable(self, timeout: float | None = None) -> None:
        """Block until durable; raises the flush's error, or TimeoutError after ``timeout``."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"entries not durable after {timeout} s")
        self.result()


class WriteHandle:
    """Returned by ``Producer.produce``; ``watcher`` reports durability."""

    def __init__(self) -> None:
        self.watcher = DurabilityWatcher()


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


class Producer(PrometheusExport):
    """Accepts entries from any thread and makes them durable in batches."""

    metrics_prefix = "headrace_buffer_producer"

    def __init__(self, config: ProducerConfig, clock: Clock | None = None):
        self.config = config
        self.clock = clock or SystemClock()
        self.store = config.open_store()
        self._retry = config.retry or RetryPolicy()
        self._queue_producer = QueueProducer(self.store, config.manifest_path, config.cas_retry,
                                             data_path_prefix=config.data_path_prefix,
                                             clock=self.clock)
        self._append_window_ms = int(config.gc_grace_period_s * 500)  # half the grace, in ms
        self._compression = COMPRESSIONS[config.batch_compression]
        self._inbox: queue.Queue = queue.Queue(maxsize=config.max_buffered_inputs)
        self._closed = False
        self._close_lock = threading.Lock()
        self._error: BaseException | None = None
        self._stats_lock = threading.Lock()
        self._stats = {"records_produced": 0, "bytes_produced": 0, "batches_flushed": 0,
                       "batch_bytes_written": 0, "failed_flushes": 0, "produce_calls": 0,
                       "batches_reuploaded": 0}
        self._flush_latencies_ms: deque[float] = deque(maxlen=1024)
        # encoded batches wait here for the uploader: one in flight + one queued bounds memory
        self._uploads: queue.Queue = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="headrace-buffer-producer",
                                        daemon=True)
        self._uploader = threading.Thread(target=self._upload_loop,
                                          name="headrace-buffer-uploader", daemon=True)
        self._uploader.start()
        self._thread.start()

    # -- public API --------------------------------------------------------------------------
    def produce(self, entries: Sequence[bytes], metadata: bytes = b"") -> WriteHandle:
        """Queue ``entries`` (one metadata item for all of them); blocks when the buffer is full."""
        entries = list(entries)
        if not entries:
            raise InvalidInput("produce() needs at least one entry")
        kinds = set(map(type, entries))
        if not kinds <= {bytes}:
            if not kinds <= {bytes, bytearray, memoryview}:
                bad = sorted(k.__name__ for k in kinds - {bytes, bytearray, memoryview})
                raise InvalidInput(f"entries must be bytes-like, got {', '.join(bad)}")
            entries = list(map(bytes, entries))
        if not isinstance(metadata, bytes | bytearray | memoryview):
            raise InvalidInput(f"metadata must be bytes, got {type(metadata).__name__}")
        self._check_open()
        handle = WriteHandle()
        self._inbox.put((entries, bytes(metadata), self.clock.now_ms(), handle.watcher))
        return handle

    def flush(self, timeout: float | None = None) -> None:
        """Flush everything produced so far and wait for it."""
        self._check_open()
        marker = _Flush()
        self._inbox.put(marker)
        if not marker.done.wait(timeout):
            raise TimeoutError(f"producer flush did not finish within {timeout} s")
        if self._error is not None:
            raise HeadraceError("producer thread failed") from self._error

    def close(self) -> None:
        """Flush what is buffered and stop the thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join()
        self._uploader.join()
        if self._error is not None:
            raise HeadraceError("producer thread failed") from self._error

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def metrics(self) -> dict[str, float]:
        with self._stats_lock:
            out: dict[str, float] = dict(self._stats)
            lat = np.array(self._flush_latencies_ms) if self._flush_latencies_ms else None
        out["buffered_inputs"] = self._inbox.qsize()
        out["flush_latency_p50_ms"] = float(np.percentile(lat, 50)) if lat is not None else 0.0
        out["flush_latency_p99_ms"] = float(np.percentile(lat, 99)) if lat is not None else 0.0
        out.update(self._queue_producer.counters.as_dict("producer"))
        return out

    # -- the flusher thread --------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._error is not None:
            raise HeadraceError("producer thread failed") from self._error
        if self._closed:
            raise HeadraceError("producer is closed")

    def _run(self) -> None:
        entries: list[bytes] = []
        items: list[Metadata] = []
        watchers: list[DurabilityWatcher] = []
        size = 0
        first_at: float | None = None
        interval = self.config.flush_interval_s
        try:
            while True:
                timeout = None if first_at is None else first_at + interval - self.clock.monotonic()
                try:
                    item = self._inbox.get(timeout=max(timeout, 0.0)) if timeout is not None \
                        else self._inbox.get()
                except queue.Empty:
                    item = None
                if isinstance(item, tuple):
                    batch, payload, t_ms, watcher = item
                    watcher.start_index = len(entries)
                    items.append(Metadata(len(entries), t_ms, payload))
                    entries.extend(batch)
                    watchers.append(watcher)
                    size += sum(map(len, batch)) + 4 * len(batch)
                    if first_at is None:
                        first_at = self.clock.monotonic()
                due = (item is None or item is _STOP or isinstance(item, _Flush)
                       or size > self.config.flush_size_bytes
                       or (first_at is not None
                           and self.clock.monotonic() - first_at >= interval))
                if due and entries:
                    self._encode_and_hand_off(entries, items, watchers, size)
                    entries, items, watchers, size, first_at = [], [], [], 0, None
                if isinstance(item, _Flush) or item is _STOP:
                    self._uploads.put(item)  # the uploader answers once earlier batches landed
                if item is _STOP:
                    return
        except BaseException as e:  # surfaced to callers through _check_open / close
            log.exception("producer thread failed")
            self._error = e
            for w in watchers:
                w._fail(e)
            self._drain_failed(e)
            self._uploads.put(_STOP)

    def _drain_failed(self, error: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                item[3]._fail(error)
            elif isinstance(item, _Flush):
                item.done.set()

    def _put_batch(self, location: str, data: bytes, *, fresh: bool = True) -> None:
        attempt = 0

        def put() -> None:
            nonlocal attempt
            attempt += 1
            try:
                self.store.put(location, data, CREATE)
            except AlreadyExists:
                if fresh and attempt == 1:  # a fresh ULID cannot exist unless our try landed
                    raise
        self._retry.call(put, what=f"upload {location}")

    def _make_durable(self, data: bytes, items: list[Metadata]) -> tuple[int, str]:
        """Upload, append, verify: the entry is reported only once its file is known present.

        The collector deletes unreferenced files older than its grace period, so a producer
        that stalled between upload and append could append a deleted file. Each manifest PUT
        is therefore allowed only within half the grace period of the file's ULID time
        (``StaleBatch`` otherwise: upload again under a fresh name), and after the append the
        file is checked (HEAD) and put back if it vanished anyway (a stall after the check,
        or a collector whose clock runs ahead).
        """
        prefix = self.config.data_path_prefix
        for _ in range(_MAX_STALE_REUPLOADS + 1):
            ulid = new_ulid(self.clock)
            location = f"{prefix}/{ulid}.batch"
            self._put_batch(location, data)
            try:
                sequence = self._queue_producer.enqueue(
                    location, items, named_at_ms=ulid_timestamp_ms(ulid),
                    window_ms=self._append_window_ms)
            except StaleBatch as e:
                log.warning("%s; uploading it again under a fresh name", e)
                self._count("batches_reuploaded")
                continue
            self._ensure_present(location, data)
            return sequence, location
        raise HeadraceError(f"gave up after {_MAX_STALE_REUPLOADS} fresh uploads: upload + "
                            f"append take longer than the {self._append_window_ms} ms append "
                            "window (half of gc_grace_period_s)")

    def _ensure_present(self, location: str, data: bytes) -> None:
        """After the append: the file must exist before anything is reported durable."""
        for _ in range(_MAX_PUT_BACKS):
            try:
                self._retry.call(lambda: self.store.head(location), what=f"check {location}")
                return
            except NotFound:
                log.warning("batch %s vanished before its manifest entry landed (collected "
                            "during a stall?): putting it back", location)
                self._count("batches_reuploaded")
                self._put_batch(location, data, fresh=False)
        raise HeadraceError(f"batch {location} keeps vanishing after its append: is a "
                            "collector running with a clock far ahead or a shorter grace?")

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self._stats[name] += 1

    def _encode_and_hand_off(self, entries: list[bytes], items: list[Metadata],
                             watchers: list[DurabilityWatcher], size: int) -> None:
        """Encode here (CPU) while the uploader writes the previous batch (I/O)."""
        t0 = time.perf_counter()
        try:
            data = encode_batch(entries, self._compression)
        except Exception as e:  # noqa: BLE001 - every handle of the batch learns the cause
            self._fail_batch(watchers, len(entries), e)
            return
        self._uploads.put((data, items, watchers, size, len(entries), t0))

    def _fail_batch(self, watchers: list[DurabilityWatcher], n: int, error: Exception) -> None:
        log.warning("flush of %d entries failed: %s", n, error)
        with self._stats_lock:
            self._stats["failed_flushes"] += 1
        for w in watchers:
            w._fail(error)

    def _upload_loop(self) -> None:
        """Batches in hand-off order: put the file, enqueue it, then resolve its handles."""
        while True:
            job = self._uploads.get()
            if job is _STOP:
                return
            if isinstance(job, _Flush):
                job.done.set()
                continue
            data, items, watchers, size, n, t0 = job
            try:
                sequence, location = self._make_durable(data, items)
            except Exception as e:  # noqa: BLE001 - every handle of the batch learns the cause
                self._fail_batch(watchers, n, e)
                continue
            except BaseException as e:
                self._error = e
                self._fail_batch(watchers, n, HeadraceError("producer uploader failed"))
                raise
            ms = (time.perf_counter() - t0) * 1000
            with self._stats_lock:
                st = self._stats
                st["records_produced"] += n
                st["bytes_produced"] += size - 4 * n
                st["batches_flushed"] += 1
                st["batch_bytes_written"] += len(data)
                st["produce_calls"] += len(watchers)
                self._flush_latencies_ms.append(ms)
            for w in watchers:
                w._resolve(sequence, location)
