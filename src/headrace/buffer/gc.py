"""Garbage collector for batch files the queue no longer references (RFC 0001).

A batch file is deleted only if all hold: its name is ``{ULID}.batch`` directly under the data
prefix; the manifest snapshot does not reference it; its ULID time is older than the oldest
manifest entry's (a file uploaded but not yet enqueued is younger); and older than the grace
period (covers a producer still retrying its manifest append). The manifest is read again just
before deleting, so an append that landed while the collector listed spares its file (producers
also refuse to append a file past half the grace period and check it after appending; see
producer.py). The manifest is read without fencing: the collector only observes it. Delete
failures are logged and retried next cycle.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from headrace.buffer.config import check_number
from headrace.buffer.queue import read_manifest
from headrace.codec import Clock, SystemClock, is_ulid, ulid_timestamp_ms
from headrace.errors import StoreError
from headrace.metrics import PrometheusExport
from headrace.store import ObjectStore

log = logging.getLogger("headrace.buffer.gc")
_SUFFIX = ".batch"


@dataclass
class GcResult:
    deleted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    kept: int = 0  # batch files that did not qualify
    skipped: int = 0  # objects under the prefix that are not batch files


def batch_file_ulid(key: str, data_path_prefix: str) -> str | None:
    """The ULID of ``{prefix}/{ULID}.batch``, or None for any other key."""
    head = data_path_prefix.rstrip("/") + "/"
    if not key.startswith(head) or not key.endswith(_SUFFIX):
        return None
    name = key[len(head) : -len(_SUFFIX)]
    return name if "/" not in name and is_ulid(name) else None


class GarbageCollector(PrometheusExport):
    """Deletes orphaned batch files; ``run_once()`` or a background thread (``start()``)."""

    metrics_prefix = "headrace_buffer_gc"

    def __init__(self, store: ObjectStore, *, manifest_path: str = "ingest/manifest",
                 data_path_prefix: str = "ingest", grace_period_s: float = 600.0,
                 interval_s: float = 300.0, clock: Clock | None = None):
        check_number("grace_period_s", grace_period_s, 0)
        check_number("interval_s", interval_s, 0, above=True)
        self.store = store
        self.manifest_path = manifest_path
        self.data_path_prefix = data_path_prefix
        self.grace_period_s = grace_period_s
        self.interval_s = interval_s
        self.clock = clock or SystemClock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None
        self._totals = {"gc_cycles": 0, "gc_deleted": 0, "gc_delete_failures": 0,
                        "gc_cycle_errors": 0}

    def run_once(self) -> GcResult:
        manifest = read_manifest(self.store, self.manifest_path)
        referenced = {e.location for e in manifest.entries}
        oldest_ms: int | None = None
        if manifest.entries:
            ulid = batch_file_ulid(manifest.entries[0].location, self.data_path_prefix)
            if ulid is None:  # cannot order files against it: delete nothing this cycle
                log.warning("oldest manifest entry %r is not a ULID batch name; GC skipped",
                            manifest.entries[0].location)
                return GcResult()
            oldest_ms = ulid_timestamp_ms(ulid)
        horizon_ms = self.clock.now_ms() - int(self.grace_period_s * 1000)
        result = GcResult()
        candidates = []
        for meta in self.store.list(self.data_path_prefix.rstrip("/") + "/"):
            ulid = batch_file_ulid(meta.key, self.data_path_prefix)
            if ulid is None:
                result.skipped += 1
                continue
            ts = ulid_timestamp_ms(ulid)
            if (meta.key in referenced or (oldest_ms is not None and ts >= oldest_ms)
                    or ts >= horizon_ms):
                result.kept += 1
                continue
            candidates.append(meta.key)
        if candidates:  # a late append may have landed since the first read: read again
            again = {e.location for e in read_manifest(self.store, self.manifest_path).entries}
            spared = [k for k in candidates if k in again]
            if spared:
                log.warning("GC spares %d file(s) enqueued while it was listing: %s",
                            len(spared), spared[:3])
                result.kept += len(spared)
                candidates = [k for k in candidates if k not in again]
        for i in range(0, len(candidates), 1000):
            chunk = candidates[i : i + 1000]
            try:
                self.store.delete_many(chunk)
                result.deleted.extend(chunk)
            except StoreError:
                for key in chunk:  # find the ones that fail; they are retried next cycle
                    try:
                        self.store.delete(key)
                        result.deleted.append(key)
                    except StoreError as e:
                        log.warning("GC could not delete %s (retried next cycle): %s", key, e)
                        result.failed.append(key)
        self._totals["gc_cycles"] += 1
        self._totals["gc_deleted"] += len(result.deleted)
        self._totals["gc_delete_failures"] += len(result.failed)
        return result

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="headrace-buffer-gc",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception as e:  # noqa: BLE001 - kept for metrics(); next cycle retries
                self.last_error = e
                self._totals["gc_cycle_errors"] += 1
                log.warning("GC cycle failed: %s", e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def metrics(self) -> dict[str, float]:
        return dict(self._totals)
