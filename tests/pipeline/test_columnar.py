"""Columnar queue entries (pipeline/columnar.py): every column type round-trips exactly, the
queue source's explode keeps every entry in order, and hostile or mismatched bytes are refused
with a ColumnarEntryError naming table and field — never another exception, never a coercion."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.pipeline.encoding import columnar
from headrace.pipeline.encoding.types import TIMESTAMP, parse_schema
from headrace.pipeline.errors import ColumnarEntryError
from headrace.pipeline.exec.decode import describe
from headrace.pipeline.names import W

ALL = parse_schema("l long, i int, d double, f float, s string, b boolean, t timestamp, "
                   "dt date, dec decimal(10,2), bin binary")


def _all_types(n: int) -> pa.Table:
    rnd = np.random.default_rng(3)
    cols = {
        "l": [int(x) for x in rnd.integers(-2**62, 2**62, n)],
        "i": [int(x) for x in rnd.integers(-2**31, 2**31 - 1, n)],
        "d": [float("nan"), -0.0, float("inf"), 1e308] + [float(x) for x in rnd.random(n - 4)],
        "f": [float(np.float32(x)) for x in rnd.random(n)],
        "s": ["\x00", "\x1f", "é", ""] + [f"s{i}" for i in range(n - 4)],
        "b": [bool(x) for x in rnd.integers(0, 2, n)],
        "t": [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(x))
              for x in rnd.integers(0, 10**12, n)],
        "dt": [dt.date(1970, 1, 1) + dt.timedelta(days=int(x)) for x in rnd.integers(0, 9000, n)],
        "dec": [decimal.Decimal(int(x)) / 100 for x in rnd.integers(-10**9, 10**9, n)],
        "bin": [bytes([i % 256]) * (i % 5) for i in range(n)],
    }
    data = pa.table({f.name: pa.array(cols[f.name], f.type) for f in ALL})
    # a NULL in every column, somewhere
    return pa.table({c: pa.array([None if (j + k) % 7 == 0 else v
                                  for j, v in enumerate(data[c].to_pylist())], data[c].type)
                     for k, c in enumerate(data.column_names)})


def _exact(t: pa.Table) -> list:
    """Rows with floats as their bits: NaN equals NaN, -0.0 differs from 0.0."""
    return [{k: struct.pack("<d", v) if isinstance(v, float) else v for k, v in r.items()}
            for r in t.to_pylist()]


def _decode_all(entries, tables):
    return pa.concat_tables([pa.Table.from_batches([columnar.decode(e, tables)[1]])
                             .replace_schema_metadata(None) for e in entries])


def test_every_type_round_trips_value_for_value_across_entries():
    data = _all_types(500)
    weights = [(-1) ** i * (1 + i % 3) for i in range(500)]
    entries = columnar.encode("t", data, ALL, weights=weights, entry_bytes=4096)
    assert len(entries) > 3  # split into several entries
    got = _decode_all(entries, {"t": ALL})
    assert got.schema.names == [*ALL.names, W]
    assert _exact(got.drop_columns([W])) == _exact(data)  # NaN, -0.0, NULL, NUL bytes
    assert got[W].to_pylist() == weights


def test_no_weights_means_one_and_the_producer_schema_is_cast_exactly():
    s = parse_schema("k long, v double")
    data = pa.table({"v": pa.array([1, 2], pa.int32()), "k": pa.array([5, 6], pa.int8())})
    (entry,) = columnar.encode("t", data, s)
    table, rb = columnar.decode(entry, {"t": s})
    assert table == "t" and rb.column(W).to_pylist() == [1, 1]
    assert rb.schema.field("k").type == pa.int64() and rb.column("v").to_pylist() == [1.0, 2.0]
    from headrace.errors import InvalidInput

    with pytest.raises(InvalidInput, match="'x' is not one of the table's"):
        columnar.encode("t", data.append_column("x", pa.array([1, 2])), s)
    with pytest.raises(InvalidInput, match="no column 'k'"):
        columnar.encode("t", data.drop_columns(["k"]), s)
    with pytest.raises(pa.ArrowInvalid):  # a cast that loses values is the producer's error
        columnar.encode("t", pa.table({"k": [1], "v": [2**40]}), parse_schema("k long, v int"))


def _entry(table="t", schema=None, rows=None, **kw):
    schema = schema or parse_schema("k long, v string")
    rows = rows if rows is not None else pa.table({"k": [1, 2], "v": ["a", None]})
    return columnar.encode(table, rows, schema, **kw)[0]


@pytest.mark.parametrize("tables,entry,table,field,what", [
    ({"u": parse_schema("k long, v string")}, None, "t", "table", "unknown table"),
    ({"t": parse_schema("k long, v string, x int")}, None, "t", "x", "missing column"),
    ({"t": parse_schema("k long")}, None, "t", "v", "does not declare"),
    ({"t": parse_schema("k int, v string")}, None, "t", "k", "declared int32"),
    ({"t": parse_schema("v string, k long")}, None, "t", None, "order"),
])
def test_a_schema_that_differs_is_refused_naming_the_field(tables, entry, table, field, what):
    with pytest.raises(ColumnarEntryError) as e:
        columnar.decode(entry or _entry(), tables)
    assert (e.value.table, e.value.field) == (table, field)
    assert what in str(e.value)
    assert isinstance(e.value, ValueError)  # headrace's InvalidInput: a builtin too


def _raw_entry(table: str, schema: pa.Schema, batches, **options) -> bytes:
    sink = pa.BufferOutputStream()
    sink.write(columnar.MAGIC)
    with pa.ipc.new_stream(sink, schema.with_metadata({columnar.TABLE_KEY: table.encode()}),
                           options=pa.ipc.IpcWriteOptions(**options)) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def test_compressed_bodies_extra_batches_and_bad_weights_are_refused():
    s = parse_schema("k long")
    rb = pa.record_batch({"k": pa.array(np.zeros(10_000, np.int64))})
    tables = {"t": s}
    for codec in ("zstd", "lz4"):  # a compressed body declares its own decompressed size
        with pytest.raises(ColumnarEntryError, match="compressed"):
            columnar.decode(_raw_entry("t", s, [rb], compression=codec), tables)
    with pytest.raises(ColumnarEntryError, match="second message"):
        columnar.decode(_raw_entry("t", s, [rb, rb]), tables)
    with pytest.raises(ColumnarEntryError, match="no record batch"):
        columnar.decode(_raw_entry("t", s, []), tables)
    ws = pa.schema([("k", pa.int64()), (W, pa.int64())])
    for w, why in (([1, 0], "is 0"), ([1, None], "is null")):
        bad = pa.record_batch({"k": [1, 2], W: pa.array(w, pa.int64())})
        with pytest.raises(ColumnarEntryError, match=why) as e:
            columnar.decode(_raw_entry("t", ws, [bad]), tables)
        assert e.value.field == W
    with pytest.raises(ColumnarEntryError, match="larger than"):
        columnar.decode(_entry(), {"t": parse_schema("k long, v string")}, max_bytes=16)
    with pytest.raises(ColumnarEntryError, match="does not start"):
        columnar.decode(b'{"table": "t"}', tables)


def test_every_truncation_is_a_columnar_entry_error():
    entry = _entry()
    tables = {"t": parse_schema("k long, v string")}
    for cut in range(len(entry)):
        with pytest.raises(ColumnarEntryError):
            columnar.decode(entry[:cut], tables)


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_entries_decode_validated_or_raise_the_typed_error(data):
    """Random byte flips, insertions and cuts of a valid entry (strings, so offsets can point
    anywhere): decode returns rows of exactly the declared schema that pass Arrow's full
    validation, or raises ColumnarEntryError — nothing else."""
    s = parse_schema("k long, v string, d double")
    rows = pa.table({"k": [1, None, 3], "v": ["a", "bc", None], "d": [0.5, None, -0.0]})
    entry = bytearray(columnar.encode("t", rows, s, weights=[1, -2, 3])[0])
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        at = data.draw(st.integers(0, len(entry) - 1))
        if op == "flip":
            entry[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            entry[at] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del entry[at:]
            if not entry:
                break
        else:
            entry[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    try:
        table, rb = columnar.decode(bytes(entry), {"t": s})
    except ColumnarEntryError:
        return
    assert table == "t" and rb.schema.names == [*s.names, W]
    assert [f.type for f in rb.schema][:3] == [f.type for f in s]
    rb.validate(full=True)
    assert rb.column(W).null_count == 0 and 0 not in rb.column(W).to_pylist()


def _source_rows(entries: list[bytes]) -> pa.RecordBatch:
    n = len(entries)
    return pa.record_batch({"sequence": pa.array([7] * n, pa.int64()),
                            "index": pa.array(range(n), pa.int32()),
                            "entry": pa.array(entries, pa.binary())})


def test_explode_turns_columnar_entries_into_rows_in_place_and_keeps_the_rest():
    a, b = parse_schema("k long, v string"), parse_schema("x double")
    cols = columnar.struct_columns([("ca", "a", a), ("cb", "b", b)])
    good_a = columnar.encode("a", pa.table({"k": [1, 2, 3], "v": ["p", None, "r"]}), a,
                             weights=[1, -1, 2])[0]
    good_b = columnar.encode("b", pa.table({"x": [0.5]}), b)[0]
    wrong = columnar.encode("a", pa.table({"k": [1]}), parse_schema("k long"))[0]  # no v
    empty = columnar.encode("a", pa.table({"k": [1], "v": ["z"]}), a)[0]
    entries = [b'{"table":"a"}', good_a, wrong, good_b, b"junk"]
    pieces = columnar.explode(_source_rows(entries), cols)
    got = pa.Table.from_batches(pieces)
    assert got.schema.names == ["sequence", "index", "entry", "ca", "cb"]
    # entry order kept; decoded rows carry their entry's index and no bytes
    assert got["index"].to_pylist() == [0, 1, 1, 1, 2, 3, 4]
    assert got["entry"].to_pylist() == [entries[0], None, None, None, wrong, None, b"junk"]
    assert got["ca"].to_pylist()[1:4] == [{"k": 1, "v": "p", W: 1}, {"k": 2, "v": None, W: -1},
                                          {"k": 3, "v": "r", W: 2}]
    assert got["cb"].to_pylist()[5] == {"x": 0.5, W: 1}
    assert got["ca"].null_count == 4 and got["cb"].null_count == 6
    # the entry that did not decode is reported by the decoder: describe names the field
    assert describe(wrong, {"a": a, "b": b}, 1 << 20) == ("a", "v", "missing column 'v'")
    assert describe(empty[:20], {"a": a}, 1 << 20)[0] is None
    # a batch with no columnar entry: the same rows, NULL structs, one piece
    (plain,) = columnar.explode(_source_rows([b"{}"]), cols)
    assert plain.num_rows == 1 and plain.column("ca").null_count == 1


def test_shares_of_exploded_rows_cover_every_row_once():
    from headrace.pipeline.exec.queue_source import _share

    pieces = [pa.record_batch({"i": pa.array(range(lo, hi))})
              for lo, hi in ((0, 3), (3, 3), (3, 10), (10, 11))]
    for shares in (1, 2, 3, 4, 12):
        got = [r for s in range(shares) for p in _share(pieces, s, shares)
               for r in p.column("i").to_pylist()]
        assert got == list(range(11))


def test_timestamps_travel_as_sparks_utc_microseconds():
    s = parse_schema("t timestamp")
    ts = pa.array([0, 1, -1], pa.timestamp("us", tz="UTC"))
    (entry,) = columnar.encode("t", pa.table({"t": ts}), s)
    _, rb = columnar.decode(entry, {"t": s})
    assert rb.schema.field("t").type == TIMESTAMP and rb.column("t").equals(ts)
