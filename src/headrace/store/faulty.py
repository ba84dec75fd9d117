"""FaultyStore: seeded fault injection for tests (the only place headrace 'mocks' a store).

Faults, each optional and reproducible from ``seed``:

- ``fail_calls``: 1-based numbers of calls (counted over ``verbs``) that raise a retryable
  StoreError before reaching the inner store;
- ``fail_rate``: the fraction of calls that do so;
- ``lost_reply_rate``: puts that *land* in the inner store but raise a retryable error, as when
  the response of a successful request is lost;
- ``latency_s``: added to every call;
- ``corrupt_get``: 'flip' one byte or 'truncate' the data returned by get/get_range, for keys
  matching ``corrupt_keys`` (a predicate) at ``corrupt_rate``.

Faults can be changed at any time (``set_faults``); ``injected`` counts what was injected.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from headrace.errors import InvalidInput, StoreError
from headrace.store.base import OVERWRITE, GetResult, ObjectMeta, ObjectStore, PutMode

ALL_VERBS = frozenset({"get", "get_range", "head", "put", "list", "delete", "delete_many"})


class InjectedFault(StoreError):
    """The error FaultyStore raises: retryable, like a 503 or a reset connection."""

    def __init__(self, verb: str, key: str | None, call_no: int, retryable: bool = True):
        super().__init__(f"injected fault in {verb} #{call_no} ({key!r})", key=key,
                         retryable=retryable)
        self.verb = verb


class FaultyStore(ObjectStore):
    def __init__(self, inner: ObjectStore, *, seed: int = 0, **faults):
        self.inner = inner
        self.capabilities = inner.capabilities
        self.url = inner.url
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._calls = 0
        self.injected: dict[str, int] = {"fail": 0, "lost_reply": 0, "corrupt": 0}
        self.set_faults(**faults)

    def set_faults(
        self,
        *,
        fail_calls: Iterable[int] = (),
        fail_rate: float = 0.0,
        lost_reply_rate: float = 0.0,
        latency_s: float = 0.0,
        corrupt_get: str | None = None,
        corrupt_rate: float = 1.0,
        corrupt_keys: Callable[[str], bool] | None = None,
        verbs: Iterable[str] = ALL_VERBS,
        keys: Callable[[str], bool] | None = None,
        retryable: bool = True,
    ) -> None:
        """Replace the fault plan (and restart the call count).

        ``retryable=False`` makes injected failures permanent errors (a crash of the caller's
        operation, not a blip its retry policy absorbs).
        """
        if corrupt_get not in (None, "flip", "truncate"):
            raise InvalidInput(f"FaultyStore corrupt_get must be None, 'flip' or 'truncate', got "
                               f"{corrupt_get!r}")
        for name, rate in (("fail_rate", fail_rate), ("lost_reply_rate", lost_reply_rate),
                           ("corrupt_rate", corrupt_rate)):
            if not 0.0 <= rate <= 1.0:
                raise InvalidInput(f"FaultyStore {name} must be in [0, 1], got {rate!r}")
        unknown = set(verbs) - ALL_VERBS
        if unknown:
            raise InvalidInput(f"FaultyStore verbs: unknown {sorted(unknown)}; known "
                               f"{sorted(ALL_VERBS)}")
        with self._lock:
            self.fail_calls = set(fail_calls)
            self.fail_rate = fail_rate
            self.lost_reply_rate = lost_reply_rate
            self.latency_s = latency_s
            self.corrupt_get = corrupt_get
            self.corrupt_rate = corrupt_rate
            self.corrupt_keys = corrupt_keys
            self.verbs = frozenset(verbs)
            self.keys = keys
            self.retryable = retryable
            self._calls = 0

    def clear(self) -> None:
        self.set_faults()

    # -- fault decisions -------------------------------------------------------------------
    def _before(self, verb: str, key: str | None) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)
        if verb not in self.verbs or (self.keys is not None and key is not None
                                      and not self.keys(key)):
            return
        with self._lock:
            self._calls += 1
            n = self._calls
            fail = n in self.fail_calls or (self.fail_rate and self._rng.random() < self.fail_rate)
            if fail:
                self.injected["fail"] += 1
        if fail:
            raise InjectedFault(verb, key, n, self.retryable)

    def _lose_reply(self, key: str) -> bool:
        if not self.lost_reply_rate or (self.keys is not None and not self.keys(key)):
            return False
        with self._lock:
            lose = self._rng.random() < self.lost_reply_rate
            if lose:
                self.injected["lost_reply"] += 1
        return lose

    def _maybe_corrupt(self, key: str, data: bytes) -> bytes:
        if self.corrupt_get is None or not data:
            return data
        if self.corrupt_keys is not None and not self.corrupt_keys(key):
            return data
        with self._lock:
            if self._rng.random() >= self.corrupt_rate:
                return data
            self.injected["corrupt"] += 1
            pos = self._rng.randrange(len(data))
        if self.corrupt_get == "truncate":
            return data[:pos]
        b = bytearray(data)
        b[pos] ^= 0xFF
        return bytes(b)

    # -- verbs -----------------------------------------------------------------------------
    def get(self, key: str) -> GetResult:
        self._before("get", key)
        res = self.inner.get(key)
        return GetResult(self._maybe_corrupt(key, res.data), res.etag)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._before("get_range", key)
        return self._maybe_corrupt(key, self.inner.get_range(key, start, end))

    def head(self, key: str) -> ObjectMeta:
        self._before("head", key)
        return self.inner.head(key)

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        self._before("put", key)
        etag = self.inner.put(key, data, mode)
        if self._lose_reply(key):
            raise StoreError(f"injected lost reply after put of {key!r} (the write landed)",
                             key=key, retryable=True)
        return etag

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        self._before("list", prefix)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._before("delete", key)
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._before("delete_many", keys[0] if keys else None)
        self.inner.delete_many(keys)

    def local_path(self, key: str):
        return self.inner.local_path(key)

    def close(self) -> None:
        self.inner.close()
