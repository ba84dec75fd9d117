"""Model-based test: random sequences of store calls agree with a dict, for local and memory.

The model keeps, per key, the bytes and the etag the store returned for the last successful put.
Every etag ever returned is remembered so that IfMatch can be tried with stale ones: it must
succeed exactly when the etag is the key's current one.
"""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from headrace.errors import AlreadyExists, NotFound, PreconditionFailed
from headrace.store import CREATE, IfMatch, LocalStore, MemoryStore, ObjectStore

# two-level keys only: on a file system "a" and "a/b" cannot both be objects
KEYS = st.builds(lambda a, b: f"{a}/{b}", st.sampled_from(["a", "ab", "b"]),
                 st.sampled_from(["x", "y", "x.1", "z"]))
PREFIXES = st.sampled_from(["", "a", "a/", "ab", "ab/x", "b/", "b/z", "c"])
DATA = st.binary(max_size=64)


class StoreModel(RuleBasedStateMachine):
    etags = Bundle("etags")

    def make_store(self) -> ObjectStore:
        return MemoryStore()

    def __init__(self) -> None:
        super().__init__()
        self.store = self.make_store()
        self.model: dict[str, tuple[bytes, str]] = {}

    @rule(target=etags, key=KEYS, data=DATA)
    def put(self, key, data):
        etag = self.store.put(key, data)
        self.model[key] = (data, etag)
        return etag

    @rule(target=etags, key=KEYS, data=DATA)
    def create(self, key, data):
        if key in self.model:
            try:
                self.store.put(key, data, CREATE)
            except AlreadyExists:
                return self.model[key][1]
            raise AssertionError(f"Create over existing {key!r} succeeded")
        etag = self.store.put(key, data, CREATE)
        self.model[key] = (data, etag)
        return etag

    @rule(target=etags, key=KEYS, data=DATA, etag=etags)
    def if_match(self, key, data, etag):
        current = self.model.get(key)
        if current is not None and current[1] == etag:
            new = self.store.put(key, data, IfMatch(etag))
            self.model[key] = (data, new)
            return new
        try:
            self.store.put(key, data, IfMatch(etag))
        except PreconditionFailed:
            return etag
        raise AssertionError(f"IfMatch with a stale etag on {key!r} succeeded")

    @rule(key=KEYS)
    def get(self, key):
        if key in self.model:
            res = self.store.get(key)
            assert (res.data, res.etag) == self.model[key]
        else:
            try:
                self.store.get(key)
            except NotFound:
                return
            raise AssertionError(f"get of absent {key!r} succeeded")

    @rule(key=KEYS, start=st.integers(0, 80), length=st.integers(0, 80))
    def get_range(self, key, start, length):
        if key in self.model:
            data = self.model[key][0]
            assert self.store.get_range(key, start, start + length) == data[start:start + length]

    @rule(key=KEYS)
    def head(self, key):
        if key in self.model:
            meta = self.store.head(key)
            assert (meta.key, meta.size, meta.etag) == (key, len(self.model[key][0]),
                                                         self.model[key][1])

    @rule(key=KEYS)
    def delete(self, key):
        self.store.delete(key)
        self.model.pop(key, None)

    @rule(keys=st.lists(KEYS, max_size=4))
    def delete_many(self, keys):
        self.store.delete_many(keys)
        for k in keys:
            self.model.pop(k, None)

    @rule(prefix=PREFIXES)
    def list_prefix(self, prefix):
        got = [(m.key, m.size, m.etag) for m in self.store.list(prefix)]
        want = [(k, len(v[0]), v[1]) for k, v in sorted(self.model.items()) if k.startswith(prefix)]
        assert got == want

    @invariant()
    def exists_agrees(self):
        for k in ("a/x", "b/z"):
            assert self.store.exists(k) == (k in self.model)


class LocalStoreModel(StoreModel):
    def make_store(self) -> ObjectStore:
        self.dir = tempfile.mkdtemp(prefix="hr-model-")
        # fsync only buys durability across power loss, which this test does not look at
        return LocalStore(self.dir, fsync=False)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


_SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestMemoryStoreModel = StoreModel.TestCase
TestMemoryStoreModel.settings = _SETTINGS
TestLocalStoreModel = LocalStoreModel.TestCase
TestLocalStoreModel.settings = _SETTINGS
