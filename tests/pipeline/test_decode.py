"""The decoder parses each entry once, as the union of its queue's tables, and falls back to
the one table an entry names when that parse refuses it: the result must be the table's own
parse, entry for entry (decode.py)."""

from __future__ import annotations

import json

import pytest

from headrace.pipeline.encoding.types import parse_schema
from headrace.pipeline.exec.decode import Decoder, _union_ddl
from headrace.pipeline.plan.nodes import SourceTable


def _tables(**ddls):
    return [SourceTable(name=f"q.{t}", queue="q", table=t, schema=parse_schema(d))
            for t, d in ddls.items()]


def _decode(spark, sources, entries):
    df = spark.createDataFrame([("q", 7, i, e if isinstance(e, bytes) else json.dumps(e).encode())
                                for i, e in enumerate(entries)],
                               "queue string, sequence long, index int, entry binary")
    decoder = Decoder(sources)
    frames, checked = decoder.split(decoder.parse(df))
    rows = {n: sorted(tuple(r) for r in f.collect()) for n, f in frames.items()}
    bad = sorted(r["index"] for r in checked.collect() if r["index"] is not None)
    return rows, bad


@pytest.mark.parametrize("conflict", [False, True], ids=["one-parse", "per-table"])
def test_each_entry_is_its_own_tables_parse(spark, conflict):
    sources = _tables(a="k long, v double", b="k long, n long" if not conflict else
                      "k string, n long")
    assert (_union_ddl(sources) is None) == conflict
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


def test_names_differing_only_in_case_are_parsed_per_table():
    assert _union_ddl(_tables(a="k long", b="K long")) is None
    assert _union_ddl(_tables(a="k long", b="k long, s string")) is not None
