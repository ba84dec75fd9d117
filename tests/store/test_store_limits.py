"""Store limits: long keys, prefixes with a leading '/', timeouts, missing credentials.

The unresponsive endpoint is a local TCP socket that accepts connections and never answers;
the credential lookup is pointed at a closed local port, so no test depends on the network.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
import traceback

import pytest

from headrace.errors import CredentialsMissing, InvalidInput, InvalidKey, StoreError, StoreTimeout
from headrace.store import LocalStore, MemoryStore, PrefixedStore, open_store
from headrace.store import local as local_mod
from headrace.store.url import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S, _call_limits

SECRET = "SuperSecret123"


# ---- local store: long keys --------------------------------------------------------------------
@pytest.mark.parametrize("key", ["x" * 300, "x" * 300 + "/obj", "é" * 200 + "/obj",
                                 "a/" + "b" * 256])
def test_a_key_too_long_for_the_file_system_is_invalid_key_on_every_verb(tmp_path, key):
    store = LocalStore(tmp_path / "s")
    calls = {"put": lambda: store.put(key, b"v"), "get": lambda: store.get(key),
             "head": lambda: store.head(key), "range": lambda: store.get_range(key, 0, 1),
             "delete": lambda: store.delete(key), "list": lambda: list(store.list(key))}
    for verb, call in calls.items():
        with pytest.raises(InvalidKey, match="local file system") as ei:
            call()
        assert ei.value.key == key, verb
    assert [p.name for p in (tmp_path / "s").iterdir()] == [".hrlocks"]  # nothing left behind


def test_a_failing_cleanup_never_masks_the_write_error(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "s")

    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def refuse(path, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(local_mod.os, "write", full_disk)
    monkeypatch.setattr(local_mod.os, "unlink", refuse)
    with pytest.raises(StoreError, match="No space left") as ei:
        store.put("k", b"value")
    assert ei.value.key == "k" and not isinstance(ei.value, PermissionError)


# ---- prefixes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["/abs", "//abs", "/"])
def test_a_prefix_with_a_leading_slash_is_refused_not_stripped(prefix):
    with pytest.raises(InvalidKey, match="leading '/'"):
        PrefixedStore(MemoryStore(), prefix)


def test_a_trailing_slash_on_a_prefix_is_fine():
    inner = MemoryStore()
    PrefixedStore(inner, "tenant/").put("k", b"1")
    assert [m.key for m in inner.list()] == ["tenant/k"]


def test_an_s3_url_with_a_double_slash_prefix_is_refused(moto_server):
    bucket = moto_server.new_bucket().split("?")[0].removeprefix("s3://")
    with pytest.raises(InvalidKey, match="leading '/'"):
        open_store(moto_server.url(bucket, "/abs"))
    store = open_store(moto_server.url(bucket, "tenant/"))
    assert store.url == f"s3://{bucket}/tenant"


# ---- timeouts -----------------------------------------------------------------------------------
@pytest.fixture
def silent_endpoint():
    """An HTTP endpoint that accepts every connection and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    srv.close()
    for c in held:
        c.close()


def test_an_unresponsive_endpoint_fails_within_the_timeout(silent_endpoint):
    url = (f"s3://bkt?endpoint={silent_endpoint}&access_key_id=AKIAX"
           f"&secret_access_key={SECRET}&timeout=1500ms&connect_timeout=1s")
    store = open_store(url)
    for verb, call in (("get", lambda: store.get("k")), ("put", lambda: store.put("k", b"v")),
                       ("list", lambda: list(store.list("")))):
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout) as ei:
            call()
        elapsed = time.monotonic() - t0
        assert 1.4 < elapsed < 4.0, (verb, elapsed)  # one timeout (+ retries inside its window)
        err = ei.value
        assert isinstance(err, TimeoutError) and err.retryable
        assert silent_endpoint in str(err) and "1.5s" in str(err) and "?timeout=" in str(err)
        assert SECRET not in "".join(traceback.format_exception(err))


def test_default_limits_are_bounded():
    limits = _call_limits({}, "s3://b")
    assert limits["timeout"].total_seconds() == DEFAULT_TIMEOUT_S <= 10
    assert limits["connect_timeout"].total_seconds() == DEFAULT_CONNECT_TIMEOUT_S
    assert limits["retry_timeout"] == limits["timeout"] and 0 < limits["max_retries"] <= 3
    config = {"timeout": "2m", "connect_timeout": "250ms", "max_retries": "0", "region": "x"}
    limits = _call_limits(config, "s3://b")
    assert config == {"region": "x"}  # ours are not passed on to obstore
    assert limits["timeout"].total_seconds() == 120 and limits["max_retries"] == 0
    assert limits["connect_timeout"].total_seconds() == 0.25


@pytest.mark.parametrize("param", ["timeout=abc", "timeout=0s", "timeout=2h",
                                   "connect_timeout=-1", "max_retries=99", "max_retries=x",
                                   "retry_timeout=5parsecs"])
def test_bad_limits_are_invalid_input_naming_the_parameter(param):
    with pytest.raises(InvalidInput, match=param.split("=")[0]) as ei:
        open_store(f"s3://bkt?{param}&secret_access_key={SECRET}")
    assert SECRET not in "".join(traceback.format_exception(ei.value))


# ---- credentials --------------------------------------------------------------------------------
@pytest.fixture
def no_aws_credentials(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SKIP_SIGNATURE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens: the instance-metadata lookup fails at once
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{port}")


def test_missing_credentials_say_what_to_set(moto_server, no_aws_credentials):
    bucket = moto_server.new_bucket().split("?")[0]
    store = open_store(f"{bucket}?endpoint={moto_server.endpoint}&timeout=3s")
    t0 = time.monotonic()
    with pytest.raises(CredentialsMissing) as ei:
        store.put("k", b"v")
    assert time.monotonic() - t0 < 4
    err = ei.value
    assert isinstance(err, PermissionError) and not err.retryable
    text = str(err)
    for hint in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "access_key_id=",
                 "secret_access_key=", "skip_signature=true"):
        assert hint in text
    assert "'k'" in text and bucket in text


def test_credentials_in_the_url_are_used_and_never_shown(moto_server, no_aws_credentials):
    bucket = moto_server.new_bucket().split("?")[0]
    store = open_store(f"{bucket}?endpoint={moto_server.endpoint}&access_key_id=AKIAX"
                       f"&secret_access_key={SECRET}")
    store.put("k", b"v")
    assert store.get("k").data == b"v"
    assert SECRET not in store.url


# ---- configuration errors ------------------------------------------------------------------------
def test_a_local_store_root_must_be_a_usable_path(tmp_path):
    for bad in ("", None, 5):
        with pytest.raises(InvalidInput, match="root"):
            LocalStore(bad)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(StoreError, match="cannot open a local store") as ei:
        LocalStore(tmp_path / "file")
    assert str(tmp_path / "file") in str(ei.value)


def test_bad_ranges_and_fault_plans_are_invalid_input(tmp_path):
    from headrace.store import FaultyStore

    store = LocalStore(tmp_path / "s")
    store.put("k", b"abc")
    for start, end in ((-1, 2), (2, 1), (0.5, 2)):
        with pytest.raises(InvalidInput, match="bad range"):
            store.get_range("k", start, end)
    for kwargs, what in (({"fail_rate": 2.0}, "fail_rate"), ({"corrupt_get": "x"}, "corrupt_get"),
                         ({"verbs": ["nope"]}, "verbs")):
        with pytest.raises(InvalidInput, match=what):
            FaultyStore(store, **kwargs)
