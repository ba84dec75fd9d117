"""pipeline.keys: binary-safe, exact, vectorised row encoding (Hypothesis fuzz)."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import FormatError, InvalidInput
from headrace.pipeline.encoding.rowkeys import (
    RowCodec,
    decode_sortable,
    encode_sortable,
    normalize_floats,
)

DEC = pa.decimal128(38, 4)
TYPES = {
    "i8": (pa.int8(), st.integers(-(2**7), 2**7 - 1)),
    "i16": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "i32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "i64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "u64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "f32": (pa.float32(), st.floats(width=32)),
    "f64": (pa.float64(), st.floats()),
    "bool": (pa.bool_(), st.booleans()),
    "str": (pa.string(), st.text()),
    "lstr": (pa.large_string(), st.text(alphabet=st.characters(codec="utf-8"))),
    "bin": (pa.binary(), st.binary()),
    "date": (pa.date32(), st.dates()),
    "ts": (pa.timestamp("us"), st.datetimes()),
    "tstz": (pa.timestamp("us", tz="UTC"),
             st.datetimes(timezones=st.just(dt.UTC))),
    "dec": (DEC, st.decimals(allow_nan=False, allow_infinity=False, places=4,
                             min_value=-(10**33), max_value=10**33)),
}


def same(a, b) -> bool:
    """Exact value equality: NaN equals NaN, -0.0 differs from 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a)
                                                     == math.copysign(1, b))
    return a == b


@st.composite
def tables(draw):
    names = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=5,
                          unique=True))
    n = draw(st.integers(0, 8))
    cols = {}
    for name in names:
        t, values = TYPES[name]
        cols[name] = pa.array(draw(st.lists(st.none() | values, min_size=n, max_size=n)), t)
    tbl = pa.table(cols)
    start = draw(st.integers(0, n))  # a slice: non-zero array offsets
    return tbl.slice(start, draw(st.integers(0, n - start)))


@settings(max_examples=150, deadline=None)
@given(tables())
def test_round_trip_is_exact_for_every_type_with_nulls(tbl):
    codec = RowCodec(tbl.schema)
    enc = codec.encode(tbl)
    assert enc.type == pa.binary() and len(enc) == tbl.num_rows
    back = codec.decode(enc)
    assert back.schema == tbl.schema
    for name in tbl.column_names:
        for a, b in zip(tbl[name].to_pylist(), back[name].to_pylist(), strict=True):
            assert same(a, b), (name, a, b)
    # the encoding does not depend on chunking
    chunked = pa.concat_tables([tbl.slice(0, tbl.num_rows // 2),
                                tbl.slice(tbl.num_rows // 2)])
    assert codec.encode(chunked).equals(enc)


FLOATS = [0.0, -0.0, math.nan, -math.nan, math.inf, 1.0, None]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FLOATS), st.sampled_from(["", "\x00", "\x1f", None]),
                          st.sampled_from([0, -1, None])), min_size=2, max_size=6))
def test_equal_keys_iff_equal_encodings_after_normalisation(rows):
    schema = pa.schema([("d", pa.float64()), ("s", pa.string()), ("x", pa.int64())])
    tbl = pa.table({n: pa.array([r[i] for r in rows], schema.field(n).type)
                    for i, n in enumerate(schema.names)})
    enc = RowCodec(schema, normalize=True).encode(tbl).to_pylist()

    def key(r):
        d = r[0]
        d = None if d is None else ("nan" if d != d else d + 0.0)  # -0.0 + 0.0 == 0.0
        return (d, r[1], r[2])

    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (enc[i] == enc[j]) == (key(rows[i]) == key(rows[j]))
    raw = RowCodec(schema).encode(tbl).to_pylist()  # unnormalised: -0.0 and 0.0 differ
    for i in range(len(rows)):
        for j in range(len(rows)):
            if raw[i] == raw[j]:
                assert all(same(a, b) or (a != a and b != b) for a, b in
                           zip(rows[i], rows[j], strict=True))


def test_no_byte_is_reserved():
    every = "".join(chr(c) for c in range(128)) + "\x1f\x00"
    vals = ["\x00", "\x1f", "a\x1fb", every, "", None, "\x00\x00"]
    tbl = pa.table({"a": pa.array(vals), "b": pa.array([v.encode() if v else None
                                                         for v in vals], pa.binary())})
    codec = RowCodec(tbl.schema)
    enc = codec.encode(tbl)
    assert len(set(enc.to_pylist())) == len(vals)
    assert codec.decode(enc).equals(tbl)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["i8", "i64", "u64", "f32", "f64", "bool", "str", "bin", "date",
                        "tstz", "dec"]), st.data())
def test_sortable_encoding_orders_like_spark(name, data):
    t, values = TYPES[name]
    vals = data.draw(st.lists(st.none() | values, max_size=8))
    arr = pa.array(vals, t)
    enc = encode_sortable(arr)
    back = decode_sortable(enc, t).to_pylist()
    for a, b in zip(vals, back, strict=True):
        assert same(a, b) or (isinstance(a, float) and a != a and b != b)
    if name in ("str", "lstr"):
        def order(v):
            return v.encode()
    elif name.startswith("f"):
        def order(v):  # NaN above everything, -0.0 just below 0.0
            return (v != v, 0.0 if v != v else v, v != v or math.copysign(1, v) > 0)
    else:
        def order(v):
            return v
    present = [v for v in vals if v is not None]
    by_bytes = [v for e, v in sorted(zip(enc.to_pylist(), vals, strict=True),
                                     key=lambda p: p[0]) if v is not None]
    assert [order(v) for v in by_bytes] == sorted(order(v) for v in present)
    assert all(e[:1] == b"\x00" for e, v in zip(enc.to_pylist(), vals, strict=True)
               if v is None)


def test_fixed_width_prefix_sorts_as_its_values():
    tbl = pa.table({"t": pa.array([5, -3, 0, None, 2**40], pa.timestamp("us")),
                    "s": pa.array(["z", "a", "\x00", "m", ""])})
    enc = RowCodec(tbl.schema).encode(tbl).to_pylist()
    order = sorted(range(5), key=lambda i: enc[i])
    assert order == [3, 1, 2, 0, 4]


def test_normalize_floats():
    arr = pa.array([-0.0, math.nan, None, 2.0])
    out = normalize_floats(arr).to_pylist()
    assert str(out[0]) == "0.0" and math.isnan(out[1]) and out[2] is None and out[3] == 2.0
    bits = np.asarray(normalize_floats(pa.array([-math.nan, math.nan])).to_numpy()).view(
        np.uint64)
    assert bits[0] == bits[1]


@pytest.mark.parametrize("mangle, match", [
    (lambda b: b[:-1], "ends inside"),
    (lambda b: b + b"\x00", "trailing"),
    (lambda b: b"\x07" + b[1:], "NULL flag"),
    (lambda b: b[:10] + b"\xff\xff\xff\xff" + b[14:], "ends inside"),
])
def test_malformed_encodings_raise_format_error(mangle, match):
    tbl = pa.table({"x": pa.array([1], pa.int64()), "s": pa.array(["abc"])})
    codec = RowCodec(tbl.schema)
    good = codec.encode(tbl).to_pylist()[0]
    with pytest.raises(FormatError, match=match):
        codec.decode(pa.array([mangle(good)], pa.binary()))


def test_invalid_utf8_in_a_string_column_is_a_format_error():
    codec = RowCodec(pa.schema([("s", pa.string())]))
    with pytest.raises(FormatError, match="UTF-8"):
        codec.decode(pa.array([b"\x01\x00\x00\x00\x01\xff"], pa.binary()))


def test_unsupported_types_are_refused_by_name():
    schema = pa.schema([("l", pa.list_(pa.int64()))])
    with pytest.raises(InvalidInput, match="column 'l' has type list"):
        RowCodec(schema)
    with pytest.raises(InvalidInput, match="unknown columns"):
        RowCodec(schema, ["nope"])


def test_decimal_and_timestamps_keep_their_types():
    tbl = pa.table({"d": pa.array([decimal.Decimal("-1.5000"), None], DEC),
                    "t": pa.array([dt.datetime(2020, 1, 1, tzinfo=dt.UTC), None],
                                  pa.timestamp("us", tz="Europe/Paris"))})
    back = RowCodec(tbl.schema).decode(RowCodec(tbl.schema).encode(tbl))
    assert back.equals(tbl)


def test_encoding_is_vectorised():
    """A million rows of (long, double, string) in well under the time of a per-row loop."""
    n = 1_000_000
    rng = np.random.default_rng(0)
    tbl = pa.table({"x": rng.integers(-(2**62), 2**62, n), "d": rng.normal(size=n),
                    "s": pa.array(np.char.mod("k%d", rng.integers(0, 10**6, n)).tolist())})
    codec = RowCodec(tbl.schema, normalize=True)
    t0 = time.perf_counter()
    enc = codec.encode(tbl)
    t1 = time.perf_counter()
    back = codec.decode(enc)
    t2 = time.perf_counter()
    assert back.equals(tbl)
    print(f"encode {n / (t1 - t0):,.0f} rows/s, decode {n / (t2 - t1):,.0f} rows/s")
    assert t1 - t0 < 5 and t2 - t1 < 5


def test_large_and_small_offsets_encode_alike():
    schema = pa.schema([("s", pa.string()), ("b", pa.binary())])
    small = pa.table({"s": pa.array(["a", None, "\x00"]), "b": pa.array([b"", b"x", None])})
    large = small.cast(pa.schema([("s", pa.large_string()), ("b", pa.large_binary())]))
    codec = RowCodec(schema)
    assert codec.encode(large).equals(codec.encode(small))
    with pytest.raises(InvalidInput, match="column 's' is int64, expected string"):
        codec.encode(pa.table({"s": pa.array([1]), "b": pa.array([b""])}))
