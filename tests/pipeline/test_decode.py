"""The decoder parses each entry once, as the union of its queue's tables, and falls back to
the one table an entry names when that parse refuses it or the table declares a name another
table types otherwise: the result must be the table's own parse, entry for entry (decode.py).
A missing field is a bad entry, or NULL for a table read with ``missing_fields="null"``."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from headrace.errors import InvalidInput
from headrace.pipeline.encoding.types import parse_schema
from headrace.pipeline.exec.decode import Decoder, _union_columns, describe
from headrace.pipeline.plan.nodes import SourceTable, check_missing_fields


def _tables(missing_null=(), **ddls):
    return [SourceTable(name=f"q.{t}", queue="q", table=t, schema=parse_schema(d),
                        missing_fields="null" if t in missing_null else "bad")
            for t, d in ddls.items()]


def _decode(spark, sources, entries):
    df = spark.createDataFrame([("q", 7, i, e if isinstance(e, bytes) else json.dumps(e).encode())
                                for i, e in enumerate(entries)],
                               "queue string, sequence long, index int, entry binary")
    decoder = Decoder(sources)
    frames, checked = decoder.split(decoder.parse(df))
    rows = {n: sorted((tuple(r) for r in f.collect()), key=repr) for n, f in frames.items()}
    bad = sorted(r["index"] for r in checked.collect() if r["index"] is not None)
    return rows, bad


@pytest.mark.parametrize("conflict", [False, True], ids=["one-parse", "per-table"])
def test_each_entry_is_its_own_tables_parse(spark, conflict):
    sources = _tables(a="k long, v double", b="k long, n long" if not conflict else
                      "k string, n long")
    assert ("k" in _union_columns(sources)) != conflict
    entries = [
        {"table": "a", "k": 1, "v": 1.5},
        {"table": "a", "k": 2, "v": 2.5, "n": "not a long"},  # b's column, wrong for b only
        {"table": "b", "k": 3, "n": 4, "w": -2},
        {"table": "a", "k": "x", "v": 1.0},                     # its own column's type: bad
        {"table": "c", "k": 1},                                  # unknown table: bad
        b"[1, 2]",                                               # not an object: bad
        {"table": "b", "k": 5, "n": None},                       # explicit null: fine
        {"k": 6, "n": 1},                                        # no table: bad
    ]
    rows, bad = _decode(spark, sources, entries)
    k3 = "3" if conflict else 3
    k5 = "5" if conflict else 5
    assert rows["q.a"] == [(1, 1.5, 1), (2, 2.5, 1)]
    assert rows["q.b"] == sorted([(k3, 4, -2), (k5, None, 1)])
    assert bad == [3, 4, 5, 7]


def test_the_one_parse_holds_the_names_every_table_types_alike():
    assert _union_columns(_tables(a="k long", b="K long")) == {}  # case: parsed per table
    assert _union_columns(_tables(a="k long", b="k long, s string")) == {
        "k": pa.int64(), "s": pa.string()}
    # a and b type v two ways: each is parsed as itself, only c's columns are in the union
    assert _union_columns(_tables(a="k long, v long", b="k long, v double")) == {}
    assert _union_columns(_tables(a="k long, v long", b="k long, v double",
                                  c="k long, s string")) == {"k": pa.int64(), "s": pa.string()}
    assert _union_columns(_tables(a="k long, Table string", b="k long")) == {"k": pa.int64()}


def test_missing_fields_are_bad_or_null_per_table(spark):
    """``o`` (the default) refuses an entry that omits a column; ``n`` reads it as NULL, as
    from_json does. An explicit null is NULL in both; no ``table`` is bad in both; no ``w``
    weighs 1. A NULL column beside a NaN still finds its field (the field list comes from
    Spark's own JSON parser)."""
    sources = _tables(missing_null=("n",), o="k long, v double", n="k long, v double")
    entries = [
        {"table": "o", "k": 1},                                  # 0 no v: bad
        {"table": "n", "k": 1},                                  # 1 no v: NULL
        {"table": "n", "v": 2.5, "w": -1},                       # 2 no k: NULL
        {"table": "o", "k": 3, "v": None},                       # 3 explicit null
        {"v": 1.0, "k": 4},                                      # 4 no table: bad
        b'{"table":"o","k":null,"v":NaN}',                        # 5 NULL beside NaN
        b'{"table":"n","k":6,"v":Infinity}',                      # 6
        {"table": "n"},                                          # 7 nothing but the table
    ]
    rows, bad = _decode(spark, sources, entries)
    assert bad == [0, 4]
    assert rows["q.n"] == sorted([(1, None, 1), (None, 2.5, -1), (6, float("inf"), 1),
                                  (None, None, 1)], key=repr)
    assert len(rows["q.o"]) == 2 and (3, None, 1) in rows["q.o"]
    nan = [r for r in rows["q.o"] if r[0] is None][0][1]
    assert nan != nan  # NaN


def test_a_bad_entry_names_a_missing_field_only_where_it_is_bad():
    schema = parse_schema("k long, v double")
    entry = b'{"table":"o","k":"x"}'  # k of the wrong type, v missing
    assert describe(entry, {"o": schema}, 1 << 20) == (
        "o", "k", "value 'x' is not of type int64")
    assert describe(b'{"table":"o"}', {"o": schema}, 1 << 20) == (
        "o", "k", "missing column 'k' (int64)")
    assert describe(entry, {"o": schema}, 1 << 20, frozenset({"o"}))[1] == "k"
    assert describe(b'{"table":"o","k":1,"v":"NaN"}', {"o": schema}, 1 << 20)[1] is None


def test_missing_fields_takes_bad_or_null():
    from test_pipeline_evolve import Plan  # tests/pipeline is on sys.path

    assert check_missing_fields("null", "x") == "null"
    for wrong in ("NULL", "maybe", None, 1):
        with pytest.raises(InvalidInput, match=f"missing_fields .*got {wrong!r}"):
            check_missing_fields(wrong, "x")
    p = Plan()
    with pytest.raises(InvalidInput, match=r"read_queue\('q'\).*got 'maybe'"):
        p.read_queue("q", {"t": "k long"}, missing_fields="maybe")
    assert not p.nodes  # nothing was added
    p.missing_fields = "null"  # as Pipeline(missing_fields="null") sets it
    t = p.read_queue("q", {"t": "k long"})["t"]
    u = p.read_queue("q").table("u", "k long", missing_fields="bad")
    assert (t.node.missing_fields, u.node.missing_fields) == ("null", "bad")
