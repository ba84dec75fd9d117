"""The in-flight buffer: files committed but not yet uploaded, readable at once (RYOW).

A FileRef names one data file from the moment its first page is written until it is in the store.
While ``writer`` is set, its pages are served from memory; the upload workers clear it once the PUT
has landed (and the file is in the local cache, when there is one). The upload queue is bounded
(``in_flight_capacity``): a writer that outruns the store blocks in ``submit`` (backpressure).
"""

from __future__ import annotations

import logging
import queue
import threading

from headrace.codec import crc64
from headrace.errors import AlreadyExists
from headrace.reservoir.errors import ReservoirFailed
from headrace.reservoir.formats.datafile import BlobFileWriter
from headrace.reservoir.state import NewFile
from headrace.retry import DEFAULT_RETRY, RetryPolicy
from headrace.store import CREATE, ObjectStore, payload_size, payload_views

log = logging.getLogger("headrace.reservoir")


class FileRef:
    """One data file: in memory (``writer``), then in the store (``info``)."""

    __slots__ = ("file_id", "writer", "data_offset", "info")

    def __init__(self, writer: BlobFileWriter | None = None, file_id: int = 0,
                 data_offset: int = 0, info: NewFile | None = None):
        self.file_id = file_id
        self.writer = writer
        self.data_offset = data_offset  # add to an in-writer offset to get the file offset
        self.info = info


class Uploader:
    """Named upload threads fed by a bounded queue; the first error is kept and re-raised."""

    def __init__(self, store: ObjectStore, workers: int, capacity: int, on_uploaded,
                 retry: RetryPolicy = DEFAULT_RETRY, name: str = "reservoir"):
        self.store = store
        self.retry = retry
        self.on_uploaded = on_uploaded
        self._q: queue.Queue = queue.Queue(maxsize=capacity)
        self._pending = 0
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self.uploaded_files = 0
        self.uploaded_bytes = 0
        self._threads = [threading.Thread(target=self._run, name=f"headrace-{name}-upload-{i}",
                                          daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, ref: FileRef, key: str, data: bytes) -> None:
        self.raise_if_failed()
        with self._cond:
            self._pending += 1
        self._q.put((ref, key, data))  # blocks when the queue is full: backpressure

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            ref, key, data = job
            try:
                if self.error is None:
                    self._put_new(key, data)
                    self.uploaded_files += 1
                    self.uploaded_bytes += payload_size(data)
                    self.on_uploaded(ref, data)
            except Exception as e:  # noqa: BLE001 - kept and surfaced by flush()/submit()
                log.error("upload of %s failed: %s", key, e)
                if self.error is None:
                    self.error = e
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _put_new(self, key: str, data) -> None:
        """PUT with Create: a data file key is never written twice, so an existing object is
        either our own upload whose reply was lost (same bytes) or not ours: then fail, never
        overwrite it."""
        try:
            self.retry.call(lambda: self.store.put(key, data, CREATE), what=f"upload {key}")
        except AlreadyExists:
            mine = 0
            for part in payload_views(data):
                mine = crc64(part, mine)
            there = self.retry.call(lambda: self.store.get(key).data, what=f"read back {key}")
            if crc64(there) != mine:
                raise

    def pending(self) -> int:
        with self._cond:
            return self._pending

    def flush(self) -> None:
        """Wait until every submitted file is uploaded; raise if any upload failed."""
        with self._cond:
            while self._pending:
                self._cond.wait()
        self.raise_if_failed()

    def wait_idle(self) -> None:
        with self._cond:
            while self._pending:
                self._cond.wait()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise ReservoirFailed(f"an upload failed: {self.error}") from self.error

    def clear_error(self) -> None:
        self.error = None

    def close(self) -> None:
        self.wait_idle()
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join(timeout=30)
