"""StoreTests: the ObjectStore contract as tests. Subclass it and provide a ``store`` fixture."""

from __future__ import annotations

import pytest

from headrace.errors import AlreadyExists, InvalidKey, NotFound, PreconditionFailed
from headrace.store import CREATE, IfMatch, ObjectStore


class StoreTests:
    """Every verb and put mode. The subclass's ``store`` fixture yields an empty store."""

    def test_put_get_roundtrip(self, store: ObjectStore):
        etag = store.put("a/b/c.bin", b"hello")
        res = store.get("a/b/c.bin")
        assert res.data == b"hello"
        assert res.etag == etag
        assert store.head("a/b/c.bin").size == 5

    def test_put_parts_writes_their_concatenation(self, store: ObjectStore):
        big = bytes(range(256)) * 4096
        parts = [b"head", memoryview(big)[3:], bytearray(b""), b"tail"]
        etag = store.put("parts/obj", parts, CREATE)
        res = store.get("parts/obj")
        assert res.data == b"head" + big[3:] + b"tail"
        assert res.etag == etag
        assert store.head("parts/obj").size == 8 + len(big) - 3
        with pytest.raises(AlreadyExists):
            store.put("parts/obj", (b"x",), CREATE)
        store.put("parts/obj", (b"only",), IfMatch(etag))
        assert store.get("parts/obj").data == b"only"

    def test_empty_object(self, store: ObjectStore):
        store.put("empty", b"")
        assert store.get("empty").data == b""
        assert store.head("empty").size == 0

    def test_overwrite_changes_etag(self, store: ObjectStore):
        e1 = store.put("k", b"one")
        e2 = store.put("k", b"two")
        assert e1 != e2
        assert store.get("k").data == b"two"

    def test_overwrite_same_bytes_changes_etag_or_keeps_data(self, store: ObjectStore):
        store.put("same", b"x")
        store.put("same", b"x")
        assert store.get("same").data == b"x"

    def test_create_twice_raises_already_exists(self, store: ObjectStore):
        store.put("c", b"1", CREATE)
        with pytest.raises(AlreadyExists) as ei:
            store.put("c", b"2", CREATE)
        assert isinstance(ei.value, FileExistsError)
        assert store.get("c").data == b"1"

    def test_if_match_current_etag_succeeds(self, store: ObjectStore):
        e1 = store.put("m", b"1", CREATE)
        e2 = store.put("m", b"2", IfMatch(e1))
        assert store.get("m") == store.get("m")
        assert store.get("m").data == b"2"
        assert store.get("m").etag == e2

    def test_if_match_stale_etag_raises(self, store: ObjectStore):
        e1 = store.put("m", b"1")
        store.put("m", b"2", IfMatch(e1))
        with pytest.raises(PreconditionFailed):
            store.put("m", b"3", IfMatch(e1))
        assert store.get("m").data == b"2"

    def test_if_match_missing_object_raises(self, store: ObjectStore):
        with pytest.raises(PreconditionFailed):
            store.put("nothing-here", b"x", IfMatch("some-etag"))
        assert not store.exists("nothing-here")

    def test_get_missing_raises_not_found(self, store: ObjectStore):
        with pytest.raises(NotFound) as ei:
            store.get("missing/key")
        assert isinstance(ei.value, FileNotFoundError)
        with pytest.raises(NotFound):
            store.head("missing/key")
        with pytest.raises(NotFound):
            store.get_range("missing/key", 0, 1)

    def test_get_range(self, store: ObjectStore):
        data = bytes(range(256)) * 4
        store.put("r", data)
        assert store.get_range("r", 0, 10) == data[:10]
        assert store.get_range("r", 100, 356) == data[100:356]
        assert store.get_range("r", 1000, 2000) == data[1000:]  # clipped at the end
        assert store.get_range("r", 5, 5) == b""

    def test_list_by_prefix_sorted(self, store: ObjectStore):
        for k in ["x/2", "x/1", "x/sub/3", "xy/4", "y/5"]:
            store.put(k, k.encode())
        assert [m.key for m in store.list("x/")] == ["x/1", "x/2", "x/sub/3"]
        assert [m.key for m in store.list("x")] == ["x/1", "x/2", "x/sub/3", "xy/4"]
        assert [m.key for m in store.list("x/s")] == ["x/sub/3"]
        assert [m.key for m in store.list("")] == ["x/1", "x/2", "x/sub/3", "xy/4", "y/5"]
        metas = {m.key: m for m in store.list("y/")}
        assert metas["y/5"].size == 3 and metas["y/5"].etag
        assert list(store.list("nope/")) == []

    def test_delete_and_delete_missing_is_quiet(self, store: ObjectStore):
        store.put("d/1", b"1")
        store.delete("d/1")
        assert not store.exists("d/1")
        store.delete("d/1")
        store.delete("never/existed")

    def test_delete_many(self, store: ObjectStore):
        keys = [f"dm/{i}" for i in range(5)]
        for k in keys:
            store.put(k, b"v")
        store.delete_many(keys[:3] + ["dm/missing"])
        assert [m.key for m in store.list("dm/")] == keys[3:]

    def test_create_after_delete(self, store: ObjectStore):
        store.put("cd", b"1", CREATE)
        store.delete("cd")
        store.put("cd", b"2", CREATE)
        assert store.get("cd").data == b"2"

    @pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "a//b", "a/./b", "a\x00b",
                                     "trailing/", "a\\b", ".hrtmp-x", "a/.hrlocks/b"])
    def test_invalid_keys_refused(self, store: ObjectStore, key: str):
        with pytest.raises(InvalidKey) as ei:
            store.put(key, b"x")
        assert isinstance(ei.value, ValueError)
        with pytest.raises(InvalidKey):
            store.get(key)

    def test_large_object(self, store: ObjectStore):
        data = bytes(range(256)) * (4 * 4096 + 1)  # ~4 MiB, not a multiple of a page
        store.put("big", data)
        assert store.get("big").data == data
        assert store.get_range("big", len(data) - 7, len(data)) == data[-7:]
