"""``Pipeline.start()``: a running pipeline as a handle shaped like Spark's StreamingQuery.

The pipeline runs on a background thread (a processingTime trigger); the handle reports what
each committed micro-batch did and stops the query from any thread. A failure inside the
pipeline is kept and raised by ``await_termination`` (and shown in ``status``), never lost.
Spark's camelCase names (``awaitTermination``, ``lastProgress``, ``recentProgress``,
``isActive``, ``exception()``, ``name``) map onto the same things.
"""

from __future__ import annotations

import threading
import time
from collections import deque


class PipelineQuery:
    """status, last_progress, recent_progress, is_active, exception(), stop(),
    await_termination(); and the same under StreamingQuery's names."""

    def __init__(self, pipeline, processing_time: str = "1 second", keep: int = 100):
        self.pipeline = pipeline
        self.recent_progress: deque[dict] = deque(maxlen=keep)
        self._error: BaseException | None = None
        self._started = time.time()
        chained = pipeline.on_batch

        def record(progress: dict) -> None:
            progress["timestamp"] = time.time()
            self.recent_progress.append(progress)
            if chained is not None:
                chained(progress)

        pipeline.on_batch = record
        pipeline.driver.stopping.clear()
        self._thread = threading.Thread(target=self._run, args=(processing_time,),
                                        name=f"headrace-{pipeline.name}", daemon=True)
        self._thread.start()

    def _run(self, processing_time: str) -> None:
        try:
            self.pipeline.run(until_idle=False, processing_time=processing_time)
        except BaseException as e:  # kept for await_termination / status
            self._error = e

    @property
    def is_active(self) -> bool:
        return self._thread.is_alive()

    isActive = is_active  # noqa: N815 — StreamingQuery's names

    @property
    def name(self) -> str:
        """The pipeline's name (StreamingQuery.name): with the store root, its identity."""
        return self.pipeline.name

    def exception(self) -> BaseException | None:
        """The error that ended the query, or None (a method, as StreamingQuery's)."""
        return self._error

    @property
    def last_progress(self) -> dict | None:
        return self.recent_progress[-1] if self.recent_progress else None

    lastProgress = last_progress  # noqa: N815

    @property
    def recentProgress(self) -> list[dict]:  # noqa: N802
        """The kept progress dicts, oldest first, as a list (StreamingQuery.recentProgress)."""
        return list(self.recent_progress)

    @property
    def status(self) -> dict:
        p = self.pipeline
        if self._error is not None:
            message = f"failed: {self._error}"
        elif self.is_active:
            message = "running" if p.driver.query is not None else "recovering"
        else:
            message = "stopped"
        return {"message": message, "is_active": self.is_active, "time": p.time,
                "batches": int(p.metrics["batches"]), "late_rows": int(p.metrics["late_rows"]),
                "bad_entries": int(p.metrics["bad_entries"]),
                "streams": {s.table: dict(s.metrics) for s in p.streams},  # ingest counters
                "uptime_s": round(time.time() - self._started, 1)}

    def stop(self, timeout_s: float | None = 120) -> None:
        """Stop after the batch in flight commits (or is abandoned: it is replayed later)."""
        self.pipeline.driver.stopping.set()
        q = self.pipeline.driver.query
        if q is not None:
            try:
                q.stop()
            except Exception:  # already stopped: nothing to do
                pass
        self._thread.join(timeout_s)

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait until the query ends (True) or ``timeout_s`` passes (False); raise the error
        that ended it, if one did."""
        self._thread.join(timeout_s)
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        """StreamingQuery.awaitTermination: without ``timeout`` (seconds) wait for the end and
        return None; with one, whether the query ended in time. Raises the query's error."""
        ended = self.await_termination(timeout)
        return None if timeout is None else ended

