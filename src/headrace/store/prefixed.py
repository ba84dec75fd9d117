"""PrefixedStore: a view of a store under a key prefix (a 'folder' inside a bucket)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from headrace.errors import InvalidKey
from headrace.store.base import OVERWRITE, GetResult, ObjectMeta, ObjectStore, PutMode, validate_key


class PrefixedStore(ObjectStore):
    """Keys ``k`` of this store are ``prefix/k`` in ``inner``.

    ``prefix`` is a relative key (``tenant/a``; one trailing ``/`` is allowed). A leading ``/``
    is refused, not stripped: a prefix names a place *inside* the inner store, and silently
    re-rooting ``/abs`` at ``abs`` would put data where nobody asked for it.
    """

    def __init__(self, inner: ObjectStore, prefix: str):
        if not isinstance(prefix, str):
            raise InvalidKey(prefix, "a prefix is a str")
        if prefix.startswith("/"):
            raise InvalidKey(prefix, "a store prefix is relative to the store; a leading '/' "
                             "is refused")
        body = prefix[:-1] if prefix.endswith("/") else prefix
        self.inner = inner
        self.prefix = validate_key(body) + "/"
        self.capabilities = inner.capabilities
        self.url = inner.url.rstrip("/") + "/" + body if "://" in inner.url else inner.url

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
