"""A store that does not exist: a missing S3 bucket is a typed, non-retryable StoreNotFound naming
the bucket on every verb that can tell (never a retryable error quoting the server's XML, never
an object NotFound that a reader would take for "nothing yet"); a local folder opened with
``create=False`` is not created and gets no ``.hrlocks/``; redacted URLs read ``***``."""

from __future__ import annotations

import os
import shutil

import pytest

from headrace.errors import NotFound, StoreError
from headrace.store import CREATE, LocalStore, StoreNotFound, open_store
from headrace.store.url import redact_url


def test_a_missing_bucket_is_store_not_found_naming_it_on_every_verb(moto_server):
    """Old code: list raised a retryable GenericError quoting the XML body; get and put raised
    NotFound for the object key (a reader took it for an absent object)."""
    url = moto_server.url("no-such-bucket-h10", "tenant")
    store = open_store(url)
    calls = {"get": lambda: store.get("k"), "put": lambda: store.put("k", b"v"),
             "create": lambda: store.put("k", b"v", CREATE),
             "list": lambda: list(store.list("")), "get_range": lambda: store.get_range("k", 0, 4),
             "delete": lambda: store.delete("k")}
    for verb, call in calls.items():
        with pytest.raises(StoreNotFound) as ei:
            call()
        err = ei.value
        assert not err.retryable, verb
        assert isinstance(err, FileNotFoundError) and not isinstance(err, NotFound), verb
        text = str(err)
        assert "bucket 'no-such-bucket-h10' does not exist" in text, (verb, text)
        assert "<" not in text and "NoSuchBucket" not in text, (verb, text)  # no XML
        assert "testing" not in text  # the credentials in the URL
        assert err.__cause__ is None and err.__suppress_context__, verb


def test_an_existing_bucket_still_reports_missing_objects_as_not_found(s3_url):
    store = open_store(s3_url)
    with pytest.raises(NotFound) as ei:
        store.get("nope")
    assert not isinstance(ei.value, StoreNotFound)
    assert list(store.list("")) == []


def test_a_local_store_opened_without_create_creates_nothing(tmp_path):
    missing = tmp_path / "no" / "such"
    for open_it in (lambda: LocalStore(missing, create=False),
                    lambda: open_store(str(missing), create=False),
                    lambda: open_store(f"file://{missing}", create=False)):
        with pytest.raises(StoreNotFound, match="local store folder .*no/such.* does not exist"):
            open_it()
    assert not (tmp_path / "no").exists()
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(StoreNotFound, match="not a folder"):
        LocalStore(tmp_path / "file", create=False)

    LocalStore(tmp_path / "s", fsync=False).put("a/k", b"v")
    shutil.rmtree(tmp_path / "s" / ".hrlocks")  # as in a copy made without hidden files
    ro = open_store(str(tmp_path / "s"), create=False)
    assert [m.key for m in ro.list("")] == ["a/k"] and ro.get("a/k").data == b"v"
    assert sorted(os.listdir(tmp_path / "s")) == ["a"]  # old code: ".hrlocks" appeared
    ro.put("b", b"w", CREATE)  # a write still works: the lock folder is made when needed
    assert sorted(os.listdir(tmp_path / "s")) == [".hrlocks", "a", "b"]


def test_the_default_still_creates_the_folder(tmp_path):
    LocalStore(tmp_path / "new" / "store")
    assert sorted(os.listdir(tmp_path / "new" / "store")) == [".hrlocks"]
    with pytest.raises(StoreError, match="cannot open a local store"):
        (tmp_path / "f").write_bytes(b"")
        LocalStore(tmp_path / "f")


def test_redact_url_prints_a_plain_mask():
    red = redact_url("s3://b/p?endpoint=http://127.0.0.1:9000&secret_access_key=abc&token=x")
    assert red == "s3://b/p?endpoint=http://127.0.0.1:9000&secret_access_key=***&token=***"
    assert "%2A" not in red
