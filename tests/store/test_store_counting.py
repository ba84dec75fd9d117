"""CountingStore: calls and bytes per verb, and their price at S3 Standard rates."""

from __future__ import annotations

import threading

import pytest

from headrace.errors import NotFound
from headrace.store import CountingStore, LocalStore, MemoryStore, PriceTable


def test_counts_calls_and_bytes_per_verb(tmp_path):
    store = CountingStore(LocalStore(tmp_path / "s"))
    store.put("a", b"12345")
    store.put("b", b"xy")
    assert store.get("a").data == b"12345"
    assert store.get_range("a", 1, 3) == b"23"
    store.head("b")
    assert [m.key for m in store.list("")] == ["a", "b"]
    store.delete("a")
    c = store.counts()
    assert c == {"puts": 2, "gets": 2, "lists": 1, "heads": 1, "deletes": 1,
                 "bytes_written": 7, "bytes_read": 7, "requests": 7}


def test_failed_requests_are_counted_too():
    store = CountingStore(MemoryStore())
    with pytest.raises(NotFound):
        store.get("missing")
    with pytest.raises(NotFound):
        store.get_range("missing", 0, 4)
    assert store.counts()["gets"] == 2
    assert store.counts()["bytes_read"] == 0


def test_list_and_delete_many_count_like_s3_pages():
    store = CountingStore(MemoryStore())
    keys = [f"k/{i:05d}" for i in range(2500)]
    for k in keys:
        store.inner.put(k, b"")  # bypass the meter: only list/delete are under test
    assert len(list(store.list("k/"))) == 2500
    assert store.counts()["lists"] == 3  # 1,000 keys per LIST page
    store.delete_many(keys)
    assert store.counts()["deletes"] == 3  # 1,000 keys per DeleteObjects
    assert list(store.inner.list("")) == []
    store.reset()
    assert list(store.list("nothing/")) == []
    assert store.counts()["lists"] == 1  # an empty listing is still a request


def test_cost_usd_uses_the_s3_standard_price_table():
    store = CountingStore(MemoryStore())
    for i in range(1000):
        store.put(f"p/{i}", b"x")
    assert store.cost_usd() == pytest.approx(0.005)
    for i in range(1000):
        store.get(f"p/{i}")
    assert store.cost_usd() == pytest.approx(0.005 + 0.0004)
    store.delete_many([f"p/{i}" for i in range(1000)])  # DELETE is free
    assert store.cost_usd() == pytest.approx(0.0054)


def test_custom_price_table():
    store = CountingStore(MemoryStore(), PriceTable(put_per_1000=1.0, get_per_1000=2.0))
    store.put("a", b"1")
    store.get("a")
    assert store.cost_usd() == pytest.approx(0.003)


def test_counts_are_exact_under_threads():
    store = CountingStore(MemoryStore())

    def work(t: int) -> None:
        for i in range(300):
            store.put(f"t{t}/{i}", b"abcd")
            store.get(f"t{t}/{i}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = store.counts()
    assert (c["puts"], c["gets"], c["bytes_written"], c["bytes_read"]) == (2400, 2400, 9600, 9600)


def test_reset_and_passthrough(tmp_path):
    inner = LocalStore(tmp_path / "s")
    store = CountingStore(inner)
    store.put("a", bytearray(b"abc"))
    assert store.local_path("a") == inner.local_path("a")
    assert store.url == inner.url and store.capabilities == inner.capabilities
    store.reset()
    assert store.counts()["requests"] == 0 and store.cost_usd() == 0.0
