"""Key validation: a key that could leave the store root or confuse a file system is refused."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from headrace.errors import InvalidKey, NotFound
from headrace.store import LocalStore, MemoryStore, PrefixedStore, validate_key


@pytest.mark.parametrize("key, reason", [
    ("", "empty"),
    ("/etc/passwd", "absolute"),
    ("../outside", "'..'"),
    ("a/../../b", "'..'"),
    ("a/./b", "'.'"),
    ("a//b", "empty path segment"),
    ("dir/", "empty path segment"),
    ("nul\x00byte", "NUL"),
    ("new\nline", "control"),
    ("back\\slash", "backslash"),
    ("x" * 1025, "1024"),
    ("a/.hrtmp-123", "reserved"),
    (".hrlocks/0001.lock", "reserved"),
    (b"bytes", "str"),
])
def test_bad_keys_are_refused_with_a_reason(key, reason):
    with pytest.raises(InvalidKey) as ei:
        validate_key(key)
    assert reason in str(ei.value)
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("key", ["a", "a/b/c.bin", "...", "a..b", "ünïcödé/日本", "x" * 1024,
                                 "sp ace/tab-less", ".hidden", "a/.b"])
def test_good_keys_pass(key):
    assert validate_key(key) == key


def test_local_store_never_touches_a_path_outside_its_root(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    store = LocalStore(tmp_path / "root")
    for key in ["../outside", "a/../../outside", str(outside)]:
        with pytest.raises(InvalidKey):
            store.put(key, b"overwritten")
        with pytest.raises(InvalidKey):
            store.get(key)
        with pytest.raises(InvalidKey):
            store.delete(key)
    assert outside.read_bytes() == b"keep"


def test_a_folder_is_not_an_object(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.put("dir/obj", b"x")
    for call in (lambda: store.get("dir"), lambda: store.head("dir"),
                 lambda: store.get_range("dir", 0, 1)):
        with pytest.raises(NotFound):
            call()
    assert not store.exists("dir")
    store.delete("dir")  # quiet, and the folder's object survives
    assert store.get("dir/obj").data == b"x"


def test_list_prefix_is_validated_too():
    store = MemoryStore()
    with pytest.raises(InvalidKey):
        list(store.list("../"))
    with pytest.raises(InvalidKey):
        list(store.list("/abs"))
    assert list(store.list("ok/")) == []


def test_prefixed_store_validates_its_prefix_and_keys():
    with pytest.raises(InvalidKey):
        PrefixedStore(MemoryStore(), "../up")
    store = PrefixedStore(MemoryStore(), "base")
    with pytest.raises(InvalidKey):
        store.put("../escape", b"x")


@given(st.text(max_size=40))
def test_any_accepted_key_stays_inside_the_root(key):
    try:
        validate_key(key)
    except InvalidKey:
        return
    segments = key.split("/")
    assert not key.startswith("/")
    assert all(s not in ("", ".", "..") for s in segments)
    assert "\x00" not in key
