"""DistinctKernel against Spark SQL (conformance) and its own edge cases."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from conformance import (  # noqa: I001  (tests/pipeline is on sys.path)
    I64_MAX,
    I64_MIN,
    INF,
    NAN,
    NEG_NAN,
    DictZSet,
    KernelConformance,
    canon_row,
    fixed_stream,
    out_counter,
    table,
)

from headrace.pipeline.operators.distinct import DistinctKernel

SCHEMA = pa.schema([("d", pa.float64()), ("s", pa.string()), ("x", pa.int64()),
                    ("b", pa.binary())])
D_VALUES = [0.0, -0.0, NAN, NEG_NAN, INF, -INF, 1e308, None]
S_VALUES = ["", "\x00", "\x1f", "a\x1f", None]
X_VALUES = [0, I64_MAX, I64_MIN, None]
B_VALUES = [b"", b"\x00", b"\x1f\x00", None]


def norm(v):
    if isinstance(v, float):
        return 0.0 if v == 0 else (NAN if v != v else v)
    return v


class TestDistinct(KernelConformance):
    schemas = [SCHEMA]
    sql = "SELECT DISTINCT * FROM in0"

    def make_kernel(self):
        return DistinctKernel(SCHEMA)

    def model(self, net):
        return Counter({row: 1 for row in {canon_row(norm(v) for v in r) for r in net[0]}})

    def value_lists(self, input_index, spark):
        return [D_VALUES, S_VALUES, X_VALUES, B_VALUES]

    def awkward_stream(self):
        pool = [[(0.0, "\x00", I64_MAX, b"\x00"), (-0.0, "\x00", I64_MAX, b"\x00"),
                 (NAN, "\x1f", None, None), (NEG_NAN, "\x1f", None, None),
                 (None, None, None, None), (1e308, "", I64_MIN, b"")]]
        return fixed_stream(pool, [
            [[(0, 1), (1, 1), (2, 1)]],  # 0.0 and -0.0 are one row; so are the NaNs below
            [[(3, 2), (4, 1), (0, -1)]],  # -0.0 still there: the row stays
            [[]],
            [[(1, -1), (2, -1), (5, 1)]],  # last zero leaves: retract
            [[(3, -2), (4, -1), (5, -1)]],
        ], restarts=[False, True, False, True, False])


def test_distinct_row_leaves_only_with_its_last_copy():
    k = DistinctKernel(SCHEMA)
    state = DictZSet()
    row = (1.0, "\x1f", 1, b"\x00")
    assert out_counter(k.apply([table([row], [2], SCHEMA)], [state])) == Counter(
        {canon_row(row): 1})
    assert k.apply([table([row], [-1], SCHEMA)], [state]).num_rows == 0
    assert out_counter(k.apply([table([row], [-1], SCHEMA)], [state])) == Counter(
        {canon_row(row): -1})
    assert state.rows == {}
