"""A run view's lookup (state/views.py) against a plain membership filter: keys of one width
with a shared prefix are searched as integers, any other keys as byte strings; both must
return exactly the rows whose key is probed, in the run's order."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.pipeline.state.rows import as_fixed, fixed_width
from headrace.pipeline.state.views import RunView

BYTES = st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF])


@st.composite
def run_and_probe(draw):
    width = draw(st.sampled_from([1, 2, 8, 9, 10, 17]))
    shared = bytes(draw(st.lists(BYTES, max_size=width, min_size=0)))[:width]

    def key():
        tail = draw(st.lists(BYTES, min_size=width - len(shared), max_size=width - len(shared)))
        return shared + bytes(tail)

    keys = sorted(set(draw(st.lists(st.builds(key), min_size=1, max_size=30))))
    rows = sorted(keys + draw(st.lists(st.sampled_from(keys), max_size=5)))  # repeated keys
    others = draw(st.lists(st.lists(BYTES, min_size=width, max_size=width).map(bytes),
                           max_size=5))  # outside the shared prefix too
    probe = sorted(set(draw(st.lists(st.sampled_from(keys), max_size=10)) + others))
    return width, rows, probe


@settings(max_examples=300, deadline=None)
@given(run_and_probe())
def test_view_lookup_returns_exactly_the_probed_rows(case):
    width, rows, probe = case
    n = len(rows)
    t = pa.table({"key": pa.array(rows, pa.binary()),
                  "val": pa.array([i.to_bytes(2, "big") for i in range(n)], pa.binary()),
                  "w": pa.array([1] * n, pa.int64())})
    view = RunView([t])
    p = pa.array(probe, pa.binary())
    w = fixed_width(p)
    got = view.match(p, w, as_fixed(p, w) if w else None)
    wanted = set(probe)
    assert got.column("val").to_pylist() == [v for k, v in zip(rows, t.column("val").to_pylist(),
                                                               strict=True) if k in wanted]


def test_group_keys_are_searched_as_integers():
    keys = [b"\x00\x01" + i.to_bytes(8, "big") for i in range(0, 3000, 3)]
    t = pa.table({"key": pa.array(keys, pa.binary()), "val": pa.array([b""] * len(keys)),
                  "w": pa.array([1] * len(keys), pa.int64())})
    view = RunView([t])
    assert view.ints is not None and len(view.prefix) == 8  # all keys < 2**16
    p = pa.array([b"\x00\x01" + i.to_bytes(8, "big") for i in (0, 1, 2997, 2999)], pa.binary())
    got = view.match(p, 10, as_fixed(p, 10))
    assert got.column("key").to_pylist() == [keys[0], keys[-1]]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([3, 8, 9, 12, None]), st.lists(st.integers(0, 30), max_size=60),
       st.integers(0, 5))
def test_key_ids_are_equal_exactly_for_equal_keys(width, picks, skip):
    """A merge identifies keys by id (an integer sort for keys of one width that differ in at
    most 8 bytes — a group key's flag byte never differs — hashing for the rest): equal ids
    must mean equal keys, on sliced arrays too."""
    import numpy as np

    from headrace.pipeline.state.rows import key_ids

    def value(i: int) -> bytes:
        if width is None:  # variable width, including the empty value
            return b"\x00" * (i % 4) + bytes([i])
        body = (i * 0x0102030405060708090A0B).to_bytes(11, "little")
        return (b"\x01" + body)[:width]  # a constant first byte, as a group key's flag

    arr = pa.array([value(i) for i in [99] * skip + picks], pa.binary()).slice(skip)
    ids = key_ids(arr)
    assert ids.dtype == np.int64 and len(ids) == len(picks)
    vals = arr.to_pylist()
    for a in range(len(vals)):
        for b in range(len(vals)):
            assert (ids[a] == ids[b]) == (vals[a] == vals[b])
