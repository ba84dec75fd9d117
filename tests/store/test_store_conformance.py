"""The ObjectStore contract, run against the local folder, memory and a real S3 endpoint."""

from __future__ import annotations

import pytest

from headrace.store import CountingStore, FaultyStore, LocalStore, MemoryStore, open_store
from headrace.testing.store_conformance import StoreTests


class TestLocalStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        return LocalStore(tmp_path / "store")

    def test_no_temp_or_lock_files_listed(self, store):
        store.put("a", b"1")
        (store.root / ".hrtmp-leftover").write_bytes(b"partial")
        assert [m.key for m in store.list("")] == ["a"]
        assert store.sweep_temp_files() == 1

    def test_symlink_escape_is_not_listed_as_object(self, store, tmp_path):
        (tmp_path / "outside").mkdir()
        (tmp_path / "outside" / "secret").write_bytes(b"s")
        (store.root / "link").symlink_to(tmp_path / "outside")
        assert [m.key for m in store.list("")] == []


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store(self):
        return MemoryStore()


class TestS3Store(StoreTests):
    @pytest.fixture
    def store(self, s3_url):
        return open_store(s3_url)


class TestPrefixedS3Store(StoreTests):
    @pytest.fixture
    def store(self, moto_server):
        bucket = moto_server.new_bucket().split("?")[0].removeprefix("s3://")
        return open_store(moto_server.url(bucket, "some/prefix"))


class TestCountingStore(StoreTests):
    @pytest.fixture
    def store(self):
        return CountingStore(MemoryStore())


class TestFaultyStoreWithoutFaults(StoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        return FaultyStore(LocalStore(tmp_path / "s"), seed=1)
