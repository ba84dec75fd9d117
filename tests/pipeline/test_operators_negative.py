"""Every kernel that keeps a multiplicity refuses a batch that would take it below zero (a
retraction of a row never inserted): NegativeMultiplicity, its state untouched, naming the
offending keys as the driver finds them again (the kernel's bucket columns, normalised); and
never refuses a retraction of what was inserted, earlier or in the same batch."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from conformance import DictZSet  # noqa: I001  (tests/pipeline is on sys.path)

from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.errors import NegativeMultiplicity
from headrace.pipeline.names import W
from headrace.pipeline.operators import build

TS = pa.timestamp("us", tz="UTC")
ORDERS = pa.schema([("order", pa.int64()), ("customer", pa.string()), ("amount", pa.int64())])
TIMED = pa.schema([("k", pa.int64()), ("t", TS), ("v", pa.int64())])


class ScanZSet(DictZSet):
    """DictZSet with the range reads the event-time layouts use."""

    def scan(self, lo=None, hi=None):
        rows = [(k, v, w) for k in sorted(self.rows) if (lo is None or k >= lo)
                and (hi is None or k < hi) for v, w in self.rows[k].items()]
        if rows:
            yield pa.table({"key": [r[0] for r in rows], "val": [r[1] for r in rows],
                            "w": [r[2] for r in rows]},
                           schema=pa.schema([("key", pa.binary()), ("val", pa.binary()),
                                             ("w", pa.int64())]))


def _t(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    """Rows of ``schema`` with a weight last."""
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(len(schema) + 1)]
    return pa.table([pa.array(c, f.type) for c, f in zip(cols, [*schema, pa.field(W, pa.int64())],
                                                         strict=True)],
                    schema=pa.schema([*schema, pa.field(W, pa.int64())]))


def _at(s: int) -> datetime:
    return datetime.fromtimestamp(s, tz=UTC)


class Case:
    """A kernel, its inputs' schemas and a legitimate history then a bad batch."""

    def __init__(self, kind, schemas, params, history, bad, key_rows, scan=False):
        self.kernel = build(kind, schemas, params)
        self.schemas, self.history, self.bad, self.key_rows = schemas, history, bad, key_rows
        self.scan = scan

    def states(self):
        return [(ScanZSet if self.scan else DictZSet)() for _ in range(self.kernel.state_sides)]

    def deltas(self, batch: list[list[tuple]]) -> list[pa.Table]:
        return [_t(s, rows) for s, rows in zip(self.schemas, batch, strict=True)]

    def expected_keys(self) -> list[bytes]:
        """The bucket keys of ``key_rows`` (input, row), as the driver encodes them."""
        out = []
        for i, row in self.key_rows:
            codec = keys.RowCodec(self.schemas[i], self.kernel.bucket_columns(i), normalize=True)
            out += codec.encode(_t(self.schemas[i], [row])).to_pylist()
        return out


L = pa.schema([("k", pa.int64()), ("a", pa.string())])
R = pa.schema([("k", pa.int64()), ("b", pa.string())])
IL = pa.schema([("k", pa.int64()), ("lt", TS)])
IR = pa.schema([("k", pa.int64()), ("rt", TS)])
AGGS = {"n": "count", "s": "sum(amount)"}

CASES = {
    # the example: the group's count(*) reaches 0 while its sum is -89
    "aggregate_count_zero_sum_left": Case(
        "aggregate", [ORDERS], {"by": ["customer"], "aggs": AGGS},
        [[[(1, "c", 10, 1)]]], [[(9, "c", 99, -1)]], [(0, (9, "c", 99, -1))]),
    "aggregate_count_below_zero": Case(
        "aggregate", [ORDERS], {"by": ["customer"], "aggs": {"n": "count"}},
        [[[(1, "c", 10, 1)]]], [[(1, "c", 10, -2)]], [(0, (1, "c", 10, -2))]),
    "aggregate_global_double_sum": Case(
        "aggregate", [ORDERS], {"by": [], "aggs": {"n": "count", "a": "avg(amount)"}},
        [[[(1, "c", None, 1)]]], [[(2, "c", 5, -1)]], [(0, (2, "c", 5, -1))]),
    # count(amount) would be -1 while count(*) is 1: a non-NULL value retracted that never was
    "aggregate_column_count_below_zero": Case(
        "aggregate", [ORDERS], {"by": ["customer"], "aggs": {"n": "count", "c": "count(amount)"}},
        [[[(1, "c", None, 1), (2, "c", None, 1)]]], [[(3, "c", 5, -1)]],
        [(0, (3, "c", 5, -1))]),
    # the max retracted twice: its multiset is read (the extreme left) and holds -1 of it
    "aggregate_max_multiset": Case(
        "aggregate", [ORDERS], {"by": ["customer"], "aggs": {"m": "max(amount)"}},
        [[[(1, "c", 10, 1), (2, "c", 20, 1), (3, "c", 30, 1)]]], [[(3, "c", 30, -2)]],
        [(0, (3, "c", 30, -2))]),
    "aggregate_distinct_value": Case(
        "aggregate", [ORDERS], {"by": ["customer"], "aggs": {"d": "count_distinct(amount)"}},
        [[[(1, "c", 10, 1), (2, "c", 20, 1)]]], [[(3, "c", 30, -1)]],
        [(0, (3, "c", 30, -1))]),
    "distinct": Case(
        "distinct", [ORDERS], {}, [[[(1, "c", 10, 1)]]], [[(1, "c", 10, 1), (1, "c", 10, -3)]],
        [(0, (1, "c", 10, 1))]),
    "join_left_row": Case(
        "join", [L, R], {"how": "inner", "on": ["k"]},
        [[[(1, "x", 1)], [(1, "y", 1)]]], [[(1, "z", -1)], []], [(0, (1, "z", -1))]),
    "left_semi_join_right_key": Case(
        "join", [L, R], {"how": "left_semi", "on": ["k"]},
        [[[(1, "x", 1)], [(1, "y", 1)]]], [[], [(1, "y", -2)]], [(1, (1, "y", -2))]),
    "interval_join_inner": Case(  # neither side counted: the retracted keys are looked up
        "join", [IL, IR], {"how": "inner", "on": ["k"], "interval": {
            "left": "lt", "right": "rt", "lower_us": 0, "upper_us": 10_000_000}},
        [[[(1, _at(100), 1)], [(1, _at(105), 1)]]], [[], [(1, _at(300), -1)]],
        [(1, (1, _at(300), -1))]),
    "interval_join_left_outer": Case(  # the left side counted: its new weights are checked
        "join", [IL, IR], {"how": "left", "on": ["k"], "interval": {
            "left": "lt", "right": "rt", "lower_us": 0, "upper_us": 10_000_000}},
        [[[(1, _at(100), 1)], []]], [[(1, _at(100), -2)], []], [(0, (1, _at(100), -2))]),
    "over": Case(
        "over", [ORDERS], {"partition_by": ["customer"], "order_by": [["order", "asc", None]],
                           "funcs": [["rn", "row_number", None, None]]},
        [[[(1, "c", 10, 1)]]], [[(2, "c", 10, -1)]], [(0, (2, "c", 10, -1))]),
    "session": Case(
        "session", [TIMED], {"by": ["k"], "time": "t", "gap_us": 5_000_000,
                             "aggs": {"n": "count"}},
        [[[(1, _at(100), 1, 1)]]], [[(1, _at(101), 1, -1)]], [(0, (1, _at(101), 1, -1))]),
    "session_event_time": Case(
        "session", [TIMED], {"by": ["k"], "time": "t", "gap_us": 5_000_000,
                             "aggs": {"n": "count"}, "expiring": True},
        [[[(1, _at(100), 1, 1)]]], [[(1, _at(100), 1, -2)]], [(0, (1, _at(100), 1, -2))],
        scan=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_retraction_never_inserted_is_refused_with_the_state_untouched(name):
    case = CASES[name]
    states = case.states()
    for batch in case.history:
        case.kernel.apply(case.deltas(batch), states)
    before = [s.snapshot() for s in states]
    with pytest.raises(NegativeMultiplicity) as info:
        case.kernel.apply(case.deltas(case.bad), states)
    assert [s.snapshot() for s in states] == before
    assert info.value.keys == case.expected_keys()
    assert info.value.what


@pytest.mark.parametrize("name", sorted(CASES))
def test_retractions_of_inserted_rows_are_never_refused(name):
    """Each row of the history retracted in a later batch, then inserted and retracted again
    within one batch (the retraction first): never refused, and the state never holds a
    weight below zero."""
    case = CASES[name]
    states = case.states()
    for batch in case.history:
        case.kernel.apply(case.deltas(batch), states)
    for batch in case.history:
        case.kernel.apply(case.deltas([[(*r[:-1], -r[-1]) for r in rows] for rows in batch]),
                          states)
    for batch in case.history:
        twice = [[*[(*r[:-1], -r[-1]) for r in rows], *rows] for rows in batch]
        case.kernel.apply(case.deltas(twice), states)
    assert all(w > 0 for s in states for vals in s.rows.values() for w in vals.values())


def test_a_group_retracted_to_nothing_leaves_no_state():
    """The example's legitimate twin: the same row retracted leaves the group empty, so a
    later insert starts it afresh (count 1, sum 30)."""
    case = CASES["aggregate_count_zero_sum_left"]
    states = case.states()
    case.kernel.apply(case.deltas([[(1, "c", 10, 1)]]), states)
    case.kernel.apply(case.deltas([[(1, "c", 10, -1)]]), states)
    out = case.kernel.apply(case.deltas([[(3, "c", 30, 1)]]), states)
    assert out.to_pylist() == [{"customer": "c", "n": 1, "s": 30, W: 1}]
