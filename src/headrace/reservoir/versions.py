"""Stream versions: opt-in separate prefixes per version, KeepLastStreamVersions cleanup.

With ``options.stream_version`` set, a version's state lives under ``{stream}/v/{version}/`` and
opening it (re)writes the marker ``{stream}/versions/{version}``, whose last-modified time is the
version's last initialisation. After the first checkpoint of an open, versions other than the
current one are sorted newest first and all beyond ``keep_last_stream_versions`` are deleted
(-1 keeps all; 0 keeps none besides the current one). Without versioning nothing is written.
"""

from __future__ import annotations

import json
import logging
import time

from headrace.reservoir.keys import stream_prefix, version_marker_prefix
from headrace.reservoir.options import ReservoirOptions
from headrace.retry import DEFAULT_RETRY
from headrace.store import OVERWRITE, ObjectStore

log = logging.getLogger("headrace.reservoir")


class StreamVersions:
    def __init__(self, store: ObjectStore, stream: str, options: ReservoirOptions):
        self.store = store
        self.stream = stream
        self.current = options.stream_version
        self.keep = options.keep_last_stream_versions

    @property
    def enabled(self) -> bool:
        return self.current is not None

    def mark_open(self) -> None:
        if not self.enabled:
            return
        key = version_marker_prefix(self.stream) + self.current
        body = json.dumps({"version": self.current, "init_ms": time.time_ns() // 1_000_000})
        DEFAULT_RETRY.call(lambda: self.store.put(key, body.encode(), OVERWRITE),
                           what=f"put {key}")

    def list(self) -> list[tuple[str, float]]:
        """(version, last init time) of every version, newest first."""
        prefix = version_marker_prefix(self.stream)
        out = [(m.key[len(prefix):], m.last_modified) for m in self.store.list(prefix)
               if "/" not in m.key[len(prefix):]]
        return sorted(out, key=lambda t: t[1], reverse=True)

    def cleanup(self) -> list[str]:
        """Delete versions beyond the retention count; returns the deleted version names."""
        if not self.enabled or self.keep < 0:
            return []
        others = [name for name, _t in self.list() if name != self.current]
        doomed = others[self.keep:]
        for name in doomed:
            prefix = stream_prefix(self.stream, name) + "/"
            keys = [m.key for m in self.store.list(prefix)]
            if keys:
                self.store.delete_many(keys)
            self.store.delete(version_marker_prefix(self.stream) + name)
            log.info("deleted stream version %s/%s (%d objects)", self.stream, name, len(keys))
        return doomed
