"""JoinKernel against Spark SQL (conformance, every join type) and its own edge cases."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from conformance import (  # noqa: I001  (tests/pipeline is on sys.path)
    I64_MAX,
    I64_MIN,
    NAN,
    NEG_NAN,
    DictZSet,
    KernelConformance,
    canon_row,
    fixed_stream,
    out_counter,
    table,
)

from headrace.errors import InvalidInput
from headrace.pipeline.operators.join import JoinKernel

LEFT = pa.schema([("k", pa.float64()), ("s", pa.string()), ("a", pa.int64())])
RIGHT = pa.schema([("k", pa.float64()), ("s", pa.string()), ("b", pa.string())])
K_VALUES = [0.0, -0.0, NAN, NEG_NAN, None, 1.0]
S_VALUES = ["\x00", "", "\x1f", None]
A_VALUES = [1, 2, I64_MAX, I64_MIN, None]
B_VALUES = ["x", "\x00y", "", None]
SQL_HOW = {"inner": "INNER", "left": "LEFT OUTER", "right": "RIGHT OUTER",
           "full": "FULL OUTER", "left_semi": "LEFT SEMI", "left_anti": "LEFT ANTI"}


def norm(v):
    if isinstance(v, float):
        return 0.0 if v == 0 else (NAN if v != v else v)
    return v


def key_of(row, idx):
    vals = [row[i] for i in idx]
    if any(v is None for v in vals):
        return None  # a NULL key never matches
    return canon_row(norm(v) for v in vals)


def join_model(left, right, how, lk, rk, layout) -> Counter:
    """Spark's join over lists of rows; ``layout(l, r)`` builds one output row."""
    out: Counter = Counter()
    rkeys = [key_of(r, rk) for r in right]
    lmatched = [False] * len(left)
    rmatched = [False] * len(right)
    for i, lrow in enumerate(left):
        lkey = key_of(lrow, lk)
        for j, rrow in enumerate(right):
            if lkey is not None and lkey == rkeys[j]:
                lmatched[i] = rmatched[j] = True
                if how not in ("left_semi", "left_anti"):
                    out[canon_row(layout(lrow, rrow))] += 1
    for i, lrow in enumerate(left):
        if (how in ("left", "full", "left_anti") and not lmatched[i]) or (
                how == "left_semi" and lmatched[i]):
            out[canon_row(layout(lrow, None))] += 1
    if how in ("right", "full"):
        for j, rrow in enumerate(right):
            if not rmatched[j]:
                out[canon_row(layout(None, rrow))] += 1
    return out


class UsingJoin(KernelConformance):
    """``JOIN ... USING (k, s)``: keys first (the left's, the right's for a right join, either
    for a full join), then the other left columns, then the other right columns."""

    schemas = [LEFT, RIGHT]
    how = "inner"
    max_examples = 40

    @property
    def sql(self):
        return f"SELECT * FROM in0 {SQL_HOW[self.how]} JOIN in1 USING (k, s)"

    def make_kernel(self):
        return JoinKernel(LEFT, RIGHT, self.how, on=["k", "s"])

    def layout(self, lrow, rrow):
        keysrc = rrow if self.how == "right" or lrow is None else lrow
        row = (keysrc[0], keysrc[1], lrow[2] if lrow else None)
        return row if self.how in ("left_semi", "left_anti") else row + (
            rrow[2] if rrow else None,)

    def model(self, net):
        return join_model(net[0], net[1], self.how, [0, 1], [0, 1], self.layout)

    def value_lists(self, input_index, spark):
        return [K_VALUES, S_VALUES, A_VALUES if input_index == 0 else B_VALUES]

    def awkward_stream(self):
        left = [(-0.0, "\x00", 1), (NAN, "\x1f", 2), (None, "", 3), (1.0, None, I64_MAX),
                (0.0, "\x00", I64_MIN)]
        right = [(0.0, "\x00", "x"), (NEG_NAN, "\x1f", "\x00y"), (None, "", ""),
                 (1.0, None, None), (0.0, "\x00", None)]
        return fixed_stream([left, right], [
            [[(0, 1), (2, 1), (3, 1)], []],  # left rows alone: padded for outer joins
            [[], [(0, 1), (2, 1), (3, 1)]],  # first match for -0.0 = 0.0; NULLs never match
            [[(1, 1), (4, 2)], [(1, 1), (4, 1)]],  # NaN = NaN; both sides in one batch
            [[], []],  # an empty batch
            [[(4, -1)], [(0, -1), (4, -1)]],  # the last match leaves: padding comes back
            [[(0, -1), (4, -1), (1, 1), (1, -1)], [(1, -1)]],
        ], restarts=[False, True, False, False, True, False])


class TestInnerJoin(UsingJoin):
    how = "inner"


class TestLeftJoin(UsingJoin):
    how = "left"


class TestRightJoin(UsingJoin):
    how = "right"


class TestFullJoin(UsingJoin):
    how = "full"


class TestLeftSemiJoin(UsingJoin):
    how = "left_semi"


class TestLeftAntiJoin(UsingJoin):
    how = "left_anti"


class TestFullJoinLeftOnRightOn(UsingJoin):
    """``left_on``/``right_on``: every column of both sides, left then right."""

    how = "full"
    schemas = [pa.schema([("lk", pa.float64()), ("s", pa.string()), ("a", pa.int64())]),
               pa.schema([("rk", pa.float64()), ("t", pa.string()), ("b", pa.string())])]
    sql = "SELECT * FROM in0 FULL OUTER JOIN in1 ON in0.lk = in1.rk AND in0.s = in1.t"

    def make_kernel(self):
        return JoinKernel(self.schemas[0], self.schemas[1], "full", left_on=["lk", "s"],
                          right_on=["rk", "t"])

    def layout(self, lrow, rrow):
        return (lrow or (None, None, None)) + (rrow or (None, None, None))


# -- edge cases --------------------------------------------------------------------------


def delta(rows, ws, schema):
    return table(rows, ws, schema)


def test_inner_join_never_matches_null_keys_and_keeps_no_state_for_them():
    k = JoinKernel(LEFT, RIGHT, "inner", on=["k", "s"])
    states = [DictZSet(), DictZSet()]
    out = k.apply([delta([(None, "a", 1), (1.0, None, 2)], [1, 1], LEFT),
                   delta([(None, "a", "x"), (1.0, None, "y")], [1, 1], RIGHT)], states)
    assert out.num_rows == 0
    assert states[0].rows == {} and states[1].rows == {}


def test_left_join_padding_flips_with_first_and_last_match():
    k = JoinKernel(LEFT, RIGHT, "left", on=["k", "s"])
    states = [DictZSet(), DictZSet()]
    lrow, rrow = (2.0, "q", 7), (2.0, "q", "r")
    out = k.apply([delta([lrow], [1], LEFT), delta([], [], RIGHT)], states)
    assert out_counter(out) == Counter({(("f", "0x1.0000000000000p+1"), "q", 7, None): 1})
    out = k.apply([delta([], [], LEFT), delta([rrow], [2], RIGHT)], states)
    assert out_counter(out) == Counter({(("f", "0x1.0000000000000p+1"), "q", 7, None): -1,
                                        (("f", "0x1.0000000000000p+1"), "q", 7, "r"): 2})
    out = k.apply([delta([], [], LEFT), delta([rrow], [-2], RIGHT)], states)
    assert out_counter(out) == Counter({(("f", "0x1.0000000000000p+1"), "q", 7, None): 1,
                                        (("f", "0x1.0000000000000p+1"), "q", 7, "r"): -2})


def test_join_keys_of_different_types_are_refused():
    other = pa.schema([("k", pa.int64()), ("s", pa.string()), ("b", pa.string())])
    with pytest.raises(InvalidInput, match="join key 'k' is double on the left"):
        JoinKernel(LEFT, other, "inner", on=["k"])


CLASHING = pa.schema([("k", pa.float64()), ("a", pa.int64())])


@pytest.mark.parametrize("right, kwargs, match", [
    (RIGHT, {"how": "cross", "on": ["k"]}, "join type"),
    (RIGHT, {"how": "inner"}, "either on="),
    (RIGHT, {"how": "inner", "on": ["k"], "left_on": ["k"]}, "either on="),
    (RIGHT, {"how": "inner", "on": ["zz"]}, "not a left column"),
    (RIGHT, {"how": "inner", "left_on": ["k"], "right_on": ["k", "s"]}, "equal length"),
    (CLASHING, {"how": "inner", "on": ["k"]}, "both join inputs have columns"),
])
def test_bad_join_definitions_are_refused(right, kwargs, match):
    with pytest.raises(InvalidInput, match=match):
        JoinKernel(LEFT, right, **kwargs)


def test_outputs_keep_minus_zero_of_the_side_they_come_from():
    k = JoinKernel(LEFT, RIGHT, "right", on=["k", "s"])
    states = [DictZSet(), DictZSet()]
    out = k.apply([delta([(-0.0, "", 1)], [1], LEFT), delta([(0.0, "", "x")], [1], RIGHT)],
                  states)
    assert out.to_pylist() == [{"k": 0.0, "s": "", "a": 1, "b": "x", "__hr_w": 1}]
    assert str(out["k"][0].as_py()) == "0.0"
    k = JoinKernel(LEFT, RIGHT, "inner", on=["k", "s"])
    states = [DictZSet(), DictZSet()]
    out = k.apply([delta([(-0.0, "", 1)], [1], LEFT), delta([(0.0, "", "x")], [1], RIGHT)],
                  states)
    assert str(out["k"][0].as_py()) == "-0.0"


def test_deltas_with_large_strings_give_the_declared_output_types():
    """Spark may hand Arrow batches with 64-bit offsets; outputs keep the plan's types."""
    k = JoinKernel(LEFT, RIGHT, "full", on=["k", "s"])
    large_l = pa.schema([("k", pa.float64()), ("s", pa.large_string()), ("a", pa.int64())])
    large_r = pa.schema([("k", pa.float64()), ("s", pa.large_string()),
                         ("b", pa.large_string())])
    out = k.apply([delta([(None, "\x00", 1), (1.0, "a", 2)], [1, 1], large_l),
                   delta([(1.0, "a", "x"), (2.0, None, "y")], [1, 1], large_r)],
                  [DictZSet(), DictZSet()])
    assert out.schema.field("s").type == pa.string() and out.schema.field("b").type == pa.string()
    assert out_counter(out) == Counter({(None, "\x00", 1, None): 1,
                                        (("f", "0x1.0000000000000p+0"), "a", 2, "x"): 1,
                                        (("f", "0x1.0000000000000p+1"), None, None, "y"): 1})
