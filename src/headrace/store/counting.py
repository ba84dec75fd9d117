"""CountingStore: counts requests and bytes per verb, and prices them. Requests are money."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from headrace.store.base import (
    OVERWRITE,
    GetResult,
    ObjectMeta,
    ObjectStore,
    PutMode,
    payload_size,
)


@dataclass(frozen=True)
class PriceTable:
    """USD per 1,000 requests. Default: S3 Standard, us-east-1 (DELETE is free)."""

    put_per_1000: float = 0.005
    list_per_1000: float = 0.005
    get_per_1000: float = 0.0004
    head_per_1000: float = 0.0004
    delete_per_1000: float = 0.0


S3_STANDARD = PriceTable()
VERBS = ("put", "get", "list", "head", "delete")


class CountingStore(ObjectStore):
    """Wraps any store; ``counts()`` gives calls and bytes per verb, ``cost_usd()`` their price.

    ``get_range`` counts as a GET (it is one request); ``delete_many`` counts one DELETE per
    1,000 keys (S3 DeleteObjects batches), ``list`` one LIST per 1,000 keys returned.
    """

    def __init__(self, inner: ObjectStore, prices: PriceTable = S3_STANDARD):
        self.inner = inner
        self.prices = prices
        self.capabilities = inner.capabilities
        self.url = inner.url
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._calls = dict.fromkeys(VERBS, 0)
            self._bytes_in = 0  # written to the store
            self._bytes_out = 0  # read from the store

    def _add(self, verb: str, n: int = 1, bytes_in: int = 0, bytes_out: int = 0) -> None:
        with self._lock:
            self._calls[verb] += n
            self._bytes_in += bytes_in
            self._bytes_out += bytes_out

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {f"{v}s": c for v, c in self._calls.items()}
            out["bytes_written"] = self._bytes_in
            out["bytes_read"] = self._bytes_out
            out["requests"] = sum(self._calls.values())
        return out

    def cost_usd(self) -> float:
        with self._lock:
            c = dict(self._calls)
        p = self.prices
        return (c["put"] * p.put_per_1000 + c["get"] * p.get_per_1000
                + c["list"] * p.list_per_1000 + c["head"] * p.head_per_1000
                + c["delete"] * p.delete_per_1000) / 1000.0

    # a failed request is still a billed request: count the call whether or not it succeeds
    def get(self, key: str) -> GetResult:
        try:
            res = self.inner.get(key)
        except BaseException:
            self._add("get")
            raise
        self._add("get", bytes_out=len(res.data))
        return res

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            data = self.inner.get_range(key, start, end)
        except BaseException:
            self._add("get")
            raise
        self._add("get", bytes_out=len(data))
        return data

    def head(self, key: str) -> ObjectMeta:
        self._add("head")
        return self.inner.head(key)

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        self._add("put", bytes_in=payload_size(data))
        return self.inner.put(key, data, mode)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        items = list(self.inner.list(prefix))
        self._add("list", max(1, -(-len(items) // 1000)))
        return iter(items)

    def delete(self, key: str) -> None:
        self._add("delete")
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            self._add("delete", -(-len(keys) // 1000))
            self.inner.delete_many(keys)

    def local_path(self, key: str):
        return self.inner.local_path(key)

    def close(self) -> None:
        self.inner.close()
