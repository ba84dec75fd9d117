"""PrefixedStore: a view of a store under a key prefix (a 'folder' inside a bucket)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from headrace.store.base import OVERWRITE, GetResult, ObjectMeta, ObjectStore, PutMode, validate_key


class PrefixedStore(ObjectStore):
    def __init__(self, inner: ObjectStore, prefix: str):
        self.inner = inner
        self.prefix = validate_key(prefix.strip("/")) + "/"
        self.capabilities = inner.capabilities
        self.url = inner.url.rstrip("/") + "/" + prefix.strip("/") if "://" in inner.url else inner.url

    def _k(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def get(self, key: str) -> GetResult:
        return self.inner.get(self._k(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.get_range(self._k(key), start, end)

    def head(self, key: str) -> ObjectMeta:
        return replace(self.inner.head(self._k(key)), key=key)

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        return self.inner.put(self._k(key), data, mode)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        n = len(self.prefix)
        return (replace(m, key=m.key[n:]) for m in self.inner.list(self.prefix + prefix))

    def delete(self, key: str) -> None:
        self.inner.delete(self._k(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many([self._k(k) for k in keys])

    def local_path(self, key: str):
        return self.inner.local_path(self._k(key))

    def close(self) -> None:
        self.inner.close()
