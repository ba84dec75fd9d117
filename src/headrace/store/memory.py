"""MemoryStore: a dict behind a lock; the reference model for the conformance tests."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

from headrace.errors import AlreadyExists, NotFound, PreconditionFailed
from headrace.store.base import (
    OVERWRITE,
    Capabilities,
    Create,
    GetResult,
    IfMatch,
    ObjectMeta,
    ObjectStore,
    PutMode,
    check_range,
    payload_bytes,
    validate_key,
    validate_prefix,
)


class MemoryStore(ObjectStore):
    capabilities = Capabilities(conditional_put=True, listable=True, local_path=False)

    def __init__(self, name: str = ""):
        self._objects: dict[str, tuple[bytes, str, float]] = {}
        self._lock = threading.Lock()
        self._etags = itertools.count(1)
        self.url = f"memory://{name}"

    def get(self, key: str) -> GetResult:
        validate_key(key)
        with self._lock:
            try:
                data, etag, _ = self._objects[key]
            except KeyError:
                raise NotFound(key) from None
        return GetResult(data, etag)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        check_range(key, start, end)
        return self.get(key).data[start:end]

    def head(self, key: str) -> ObjectMeta:
        validate_key(key)
        with self._lock:
            try:
                data, etag, mtime = self._objects[key]
            except KeyError:
                raise NotFound(key) from None
        return ObjectMeta(key, len(data), etag, mtime)

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        validate_key(key)
        payload = bytes(payload_bytes(data))
        with self._lock:
            current = self._objects.get(key)
            if isinstance(mode, Create) and current is not None:
                raise AlreadyExists(key)
            if isinstance(mode, IfMatch) and (current is None or current[1] != mode.etag):
                raise PreconditionFailed(key, mode.etag)
            etag = f"m{next(self._etags)}"
            self._objects[key] = (payload, etag, time.time())
        return etag

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        validate_prefix(prefix)
        with self._lock:
            items = [(k, v) for k, v in self._objects.items() if k.startswith(prefix)]
        return iter(ObjectMeta(k, len(v[0]), v[1], v[2]) for k, v in sorted(items))

    def delete(self, key: str) -> None:
        validate_key(key)
        with self._lock:
            self._objects.pop(key, None)
