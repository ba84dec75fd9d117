"""loads_bounded / field: JSON from untrusted bytes never raises RecursionError or TypeError."""

from __future__ import annotations

import json
import time

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from headrace.codec import jsonsafe
from headrace.codec.jsonsafe import field, loads_bounded, nesting_depth
from headrace.errors import FormatError, InvalidInput

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab[]{}"\\\n\x01é'),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids,
                                                              max_size=3),
    max_leaves=20)


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    return 0


@settings(max_examples=100)
@given(json_values, st.integers(1, 7))
def test_nesting_depth_matches_the_parsed_value_across_chunk_boundaries(value, chunk):
    text = json.dumps(value, ensure_ascii=False).encode()
    assert nesting_depth(text) == _depth(value)
    saved = jsonsafe._CHUNK
    jsonsafe._CHUNK = chunk  # carry of depth, string state and backslash runs between chunks
    try:
        assert nesting_depth(text) == _depth(value)
    finally:
        jsonsafe._CHUNK = saved
    assert loads_bounded(text, "x", max_depth=max(1, _depth(value))) == value


def test_deep_nesting_is_refused_before_parsing_and_fast():
    bomb = b"[" * 2_000_000 + b"]" * 2_000_000
    t0 = time.monotonic()
    with pytest.raises(FormatError, match=r"'obj/k'.*nested 2000000 deep, above the limit 64"):
        loads_bounded(bomb, "obj/k", max_bytes=len(bomb))
    assert time.monotonic() - t0 < 5
    # brackets inside strings are content, not nesting
    assert loads_bounded(json.dumps({"a": "[" * 1000}), "k", max_depth=1) == {"a": "[" * 1000}


@pytest.mark.parametrize("data, what, offset", [
    (b"x" * 101, "above the limit 100", None),
    (b'{"a": 1,}', "not JSON", 8),
    (b'{"a": "\xff"}', "not UTF-8", 7),
    (b"[Infinity]", "Infinity is not allowed", None),
])
def test_bad_json_is_a_format_error_with_offset(data, what, offset):
    with pytest.raises(FormatError, match=what) as ei:
        loads_bounded(data, "k", max_bytes=100)
    assert ei.value.key == "k" and ei.value.offset == offset


def test_offset_is_relative_to_the_enclosing_object():
    with pytest.raises(FormatError) as ei:
        loads_bounded(b"[1,,]", "k", offset=16)
    assert ei.value.offset == 16 + 3


def test_field_checks_types_and_names_the_field():
    obj = {"n": 3, "flag": True, "s": "x", "l": []}
    assert field(obj, "n", int, "k") == 3
    assert field(obj, "missing", int, "k", default=None) is None
    with pytest.raises(FormatError, match="field 'flag' must be an integer, got a boolean"):
        field(obj, "flag", int, "k")
    with pytest.raises(FormatError, match="field 's' must be an array or null, got a string"):
        field(obj, "s", (list, type(None)), "k")
    with pytest.raises(FormatError, match="field 'missing' is missing"):
        field(obj, "missing", int, "k")
    with pytest.raises(FormatError, match="expected a JSON object, got an array"):
        field([], "n", int, "k")


def test_bad_limits_are_invalid_input():
    with pytest.raises(InvalidInput):
        loads_bounded(b"{}", "k", max_depth=0)
