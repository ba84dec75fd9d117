"""open_store(url): each URL form opens the right store; bad URLs fail clearly, secrets never show."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from headrace.errors import InvalidInput, StoreError
from headrace.store import LocalStore, MemoryStore, ObjectStore, PrefixedStore, open_store
from headrace.store.url import redact_url

SECRET = "SuperSecret123"
KEY_ID = "AKIAEXAMPLEID"


def test_bare_path_opens_a_local_store(tmp_path):
    store = open_store(str(tmp_path / "s"))
    assert isinstance(store, LocalStore)
    store.put("a/b", b"1")
    assert (tmp_path / "s" / "a" / "b").read_bytes() == b"1"
    assert store.url == (tmp_path / "s").resolve().as_uri()


def test_relative_path_is_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = open_store("rel/store")
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "rel" / "store").resolve()


def test_file_url_opens_the_same_folder(tmp_path):
    a = open_store(str(tmp_path / "s"))
    a.put("k", b"v")
    b = open_store((tmp_path / "s").as_uri())
    assert isinstance(b, LocalStore)
    assert b.get("k").data == b"v"
    # a file URL with an escaped space
    c = open_store(f"file://{tmp_path}/with%20space")
    c.put("k", b"w")
    assert (Path(tmp_path) / "with space" / "k").read_bytes() == b"w"


def test_memory_url_shares_a_store_per_name():
    a = open_store("memory://test-url-shared")
    b = open_store("memory://test-url-shared")
    c = open_store("memory://test-url-other")
    assert isinstance(a, MemoryStore) and a is b and a is not c
    a.put("k", b"v")
    assert b.get("k").data == b"v"
    assert not c.exists("k")


def test_an_object_store_passes_through():
    store = MemoryStore()
    assert open_store(store) is store


def test_s3_url_with_endpoint_reaches_the_server(moto_server):
    url = moto_server.new_bucket()
    store = open_store(url)
    assert isinstance(store, ObjectStore)
    store.put("x/y", b"over http")
    assert open_store(url).get("x/y").data == b"over http"


def test_s3_url_with_prefix_keeps_keys_under_it(moto_server):
    bucket = moto_server.new_bucket().split("?")[0].removeprefix("s3://")
    whole = open_store(moto_server.url(bucket))
    inner = open_store(moto_server.url(bucket, "tenant/a"))
    assert isinstance(inner, PrefixedStore)
    inner.put("k", b"1")
    assert [m.key for m in whole.list("")] == ["tenant/a/k"]
    assert [m.key for m in inner.list("")] == ["k"]
    assert inner.url == f"s3://{bucket}/tenant/a"


def test_credentials_never_appear_in_store_url(moto_server):
    url = (f"s3://{moto_server.new_bucket().split('?')[0].removeprefix('s3://')}/p?"
           f"endpoint={moto_server.endpoint}&access_key_id={KEY_ID}&secret_access_key={SECRET}")
    store = open_store(url)
    assert SECRET not in store.url and KEY_ID not in store.url
    assert SECRET not in repr(store)


def test_credentials_never_appear_in_store_errors(moto_server):
    url = (f"s3://no-such-bucket-here?endpoint={moto_server.endpoint}"
           f"&access_key_id={KEY_ID}&secret_access_key={SECRET}")
    store = open_store(url)
    with pytest.raises(StoreError) as ei:
        store.put("k", b"v")
    text = "".join(traceback.format_exception(ei.value))
    assert SECRET not in text and KEY_ID not in text


@pytest.mark.parametrize("url", [
    f"ftp://host/path?secret_access_key={SECRET}",
    f"s3://?secret_access_key={SECRET}",
    f"s3://{KEY_ID}:{SECRET}@bucket/prefix",
    f"s3://bucket?secret_access_key={SECRET}&not_a_setting=1",
])
def test_bad_urls_fail_clearly_without_leaking_secrets(url):
    with pytest.raises(InvalidInput) as ei:
        open_store(url)
    assert isinstance(ei.value, ValueError)
    text = "".join(traceback.format_exception(ei.value))
    assert SECRET not in text
    assert KEY_ID not in text


def test_unknown_scheme_names_the_scheme_and_the_choices():
    with pytest.raises(ValueError, match=r"unsupported store url scheme 'ftp'.*s3://"):
        open_store("ftp://host/x")


@pytest.mark.parametrize("bad", ["", None, 42])
def test_non_url_values_are_refused(bad):
    with pytest.raises(ValueError, match="non-empty string"):
        open_store(bad)


def test_redact_url_keeps_what_helps_and_masks_the_rest():
    red = redact_url(f"s3://{KEY_ID}:{SECRET}@bkt/p?endpoint=http://127.0.0.1:9000"
                     f"&region=eu-west-1&secret_access_key={SECRET}&token=abc")
    assert SECRET not in red and KEY_ID not in red and "abc" not in red
    assert "bkt/p" in red and "endpoint=http://127.0.0.1:9000" in red and "eu-west-1" in red
