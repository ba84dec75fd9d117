"""HookStore: a store wrapper that calls back around each request (not a test module).

Tests force interleavings with it instead of sleeping: e.g. "right after the batch upload,
run the garbage collector" or "right before the manifest PUT, delete the batch file".
``before(verb, key)`` runs before the request, ``after(verb, key)`` after it succeeded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from headrace.store import ObjectStore
from headrace.store.base import OVERWRITE, GetResult, ObjectMeta, PutMode

Hook = Callable[[str, str], None]


def _noop(verb: str, key: str) -> None:
    return None


class HookStore(ObjectStore):
    def __init__(self, inner: ObjectStore, *, before: Hook = _noop, after: Hook = _noop):
        self.inner = inner
        self.capabilities = inner.capabilities
        self.url = inner.url
        self.before = before
        self.after = after

    def _call(self, verb: str, key: str, fn):
        self.before(verb, key)
        out = fn()
        self.after(verb, key)
        return out

    def get(self, key: str) -> GetResult:
        return self._call("get", key, lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._call("get", key, lambda: self.inner.get_range(key, start, end))

    def head(self, key: str) -> ObjectMeta:
        return self._call("head", key, lambda: self.inner.head(key))

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        return self._call("put", key, lambda: self.inner.put(key, data, mode))

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        return iter(self._call("list", prefix, lambda: list(self.inner.list(prefix))))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.inner.delete(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._call("delete", ",".join(keys), lambda: self.inner.delete_many(keys))
