"""Progress of a backup or restore: files, bytes and rate, reported through a callback."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """A progress report: what phase, how far, how fast. Passed to the progress callback."""

    phase: str  # "upload" | "download"
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    elapsed_s: float

    @property
    def rate_bytes_s(self) -> float:
        return self.bytes_done / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressCallback = Callable[[Progress], None]


class ProgressTracker:
    """Counts work done from many worker threads; calls the callback after each step."""

    def __init__(self, phase: str, files_total: int, bytes_total: int,
                 callback: ProgressCallback | None):
        self.phase = phase
        self.files_total = files_total
        self.bytes_total = bytes_total
        self.callback = callback
        self.files_done = 0
        self.bytes_done = 0
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def add(self, *, files: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.files_done += files
            self.bytes_done += nbytes
            report = self.snapshot()
        if self.callback is not None:
            self.callback(report)

    def snapshot(self) -> Progress:
        return Progress(self.phase, self.files_done, self.files_total, self.bytes_done,
                        self.bytes_total, time.perf_counter() - self._t0)
