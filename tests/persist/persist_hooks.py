"""HookStore for persist tests (not a test module): run a callback at an exact store call."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from headrace.store import ObjectStore
from headrace.store.base import OVERWRITE, GetResult, ObjectMeta, PutMode


class HookStore(ObjectStore):
    """Delegates to ``inner``; ``when(verb, predicate, callback)`` runs ``callback`` once, at the
    first ``verb`` call whose key satisfies ``predicate`` (before it for get/head/list, after it
    for put: the object has landed, the caller has not heard back yet)."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner
        self.capabilities = inner.capabilities
        self.url = inner.url
        self._hooks: list[tuple[str, Callable[[str], bool], Callable[[], None]]] = []
        self.fired: list[str] = []

    def when(self, verb: str, predicate: Callable[[str], bool],
             callback: Callable[[], None]) -> None:
        self._hooks.append((verb, predicate, callback))

    def _fire(self, verb: str, key: str) -> None:
        for hook in list(self._hooks):
            if hook[0] == verb and hook[1](key):
                self._hooks.remove(hook)
                self.fired.append(f"{verb} {key}")
                hook[2]()

    def get(self, key: str) -> GetResult:
        self._fire("get", key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._fire("get", key)
        return self.inner.get_range(key, start, end)

    def head(self, key: str) -> ObjectMeta:
        self._fire("head", key)
        return self.inner.head(key)

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        etag = self.inner.put(key, data, mode)
        self._fire("put", key)
        return etag

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        self._fire("list", prefix)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many(keys)

    def local_path(self, key: str):
        return self.inner.local_path(key)


def is_part(key: str) -> bool:
    return "/parts/" in key and key.endswith(".parquet")
