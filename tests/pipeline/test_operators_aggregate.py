"""AggregateKernel against Spark SQL (conformance) and its own edge cases."""

from __future__ import annotations

import decimal
import math
from collections import Counter, defaultdict
from fractions import Fraction

import pyarrow as pa
import pytest
from conformance import (  # noqa: I001  (tests/pipeline is on sys.path)
    I64_MAX,
    I64_MIN,
    INF,
    NAN,
    NEG_NAN,
    DictZSet,
    ExpectOverflow,
    KernelConformance,
    canon,
    canon_row,
    fixed_stream,
    out_counter,
    table,
)

from headrace.errors import InvalidInput
from headrace.pipeline.errors import ArithmeticOverflow
from headrace.pipeline.names import W
from headrace.pipeline.operators.aggregate import MULTISET, Agg, AggregateKernel

SCHEMA = pa.schema([("g", pa.float64()), ("k", pa.string()), ("x", pa.int64()),
                    ("d", pa.float64()), ("s", pa.string())])
AGGS = [Agg("count", None, "n"), Agg("count", "x", "nx"), Agg("sum", "x", "sx"),
        Agg("sum", "d", "sd"), Agg("avg", "d", "ad"), Agg("avg", "x", "ax"),
        Agg("min", "d", "mind"), Agg("max", "d", "maxd"), Agg("min", "s", "mins"),
        Agg("max", "s", "maxs"), Agg("count_distinct", "d", "cdd"),
        Agg("count_distinct", "s", "cds"), Agg("count_distinct", ("d", "s"), "cdds"),
        Agg("count", ("x", "s"), "nxs"), Agg("sum_distinct", "x", "sdx"),
        Agg("avg_distinct", "x", "avx"), Agg("sum_distinct", "d", "sdd"),
        Agg("avg_distinct", "d", "avd")]
SELECT = ("count(*) AS n, count(x) AS nx, sum(x) AS sx, sum(d) AS sd, avg(d) AS ad, "
          "avg(x) AS ax, min(d) AS mind, max(d) AS maxd, min(s) AS mins, max(s) AS maxs, "
          "count(DISTINCT d) AS cdd, count(DISTINCT s) AS cds, count(DISTINCT d, s) AS cdds, "
          "count(x, s) AS nxs, sum(DISTINCT x) AS sdx, avg(DISTINCT x) AS avx, "
          "sum(DISTINCT d) AS sdd, avg(DISTINCT d) AS avd")

G_VALUES = [0.0, -0.0, NAN, NEG_NAN, None, 1.5]
K_VALUES = ["", "\x00", "\x1f", None, "a"]
S_VALUES = ["", "\x00", "a\x1fb", "é", None, "b"]
# extremes rarer than small values, so that most streams do not end in an overflow
X_MODEL = [0, 1, -1, 5, None, 2, 3, 0, 1, -1, 5, None, 2, 3, I64_MAX, I64_MIN]
X_SPARK = [0, 1, -1, 5, None, 2]
D_MODEL = [0.0, -0.0, NAN, INF, -INF, 1e308, -1e308, 5e-324, 0.1, 1.5, None]
# dyadic and small: a naive (Spark) sum of these is exact in any order
D_SPARK = [0.0, -0.0, NAN, INF, -INF, 1.5, -2.0, 0.5, None]


def norm_key(v):
    if isinstance(v, float):
        return 0.0 if v == 0 else (NAN if v != v else v)
    return v


def exact_double_sum(vals: list[float]):
    if not vals:
        return None
    if any(v != v for v in vals) or (INF in vals and -INF in vals):
        return NAN
    if INF in vals:
        return INF
    if -INF in vals:
        return -INF
    total = sum((Fraction(v) for v in vals), Fraction(0))
    try:
        return float(total)
    except OverflowError:
        return INF if total > 0 else -INF


def spark_order(v: float):
    """Spark's order for doubles (NaN above all); -0.0 below 0.0 as the kernel picks."""
    return (v != v, 0.0 if v != v else v, math.copysign(1, v) > 0)


def aggregate_model(rows: list[tuple], by: list[int]) -> Counter:
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for r in rows:
        groups[canon_row(norm_key(r[i]) for i in by)].append(r)
    if not by and not groups:
        groups[()] = []
    out: Counter = Counter()
    for key, rs in groups.items():
        xs = [r[2] for r in rs if r[2] is not None]
        ds = [r[3] for r in rs if r[3] is not None]
        ss = [r[4] for r in rs if r[4] is not None]
        sx = sum(xs) if xs else None
        # DISTINCT: one NaN, 0.0 = -0.0 (normalised as Spark groups them)
        dx = set(xs)
        dd = list({canon(norm_key(v)): norm_key(v) for v in ds}.values())
        sdx = sum(dx) if dx else None
        if any(v is not None and not I64_MIN <= v <= I64_MAX for v in (sx, sdx)):
            raise ExpectOverflow(key)
        sdxd = exact_double_sum([float(x) for x in dx])
        sdd = exact_double_sum(dd)
        sd = exact_double_sum(ds)
        ad = None if sd is None else sd / len(ds)
        sxd = exact_double_sum([float(x) for x in xs])
        ax = None if sxd is None else sxd / len(xs)
        row = (len(rs), len(xs), sx, sd, ad, ax,
               min(ds, key=spark_order) if ds else None,
               max(ds, key=spark_order) if ds else None,
               min(ss) if ss else None, max(ss) if ss else None,
               len({canon(norm_key(v)) for v in ds}), len(set(ss)),
               len({(canon(norm_key(r[3])), r[4]) for r in rs
                    if r[3] is not None and r[4] is not None}),
               sum(1 for r in rs if r[2] is not None and r[4] is not None),
               sdx, None if sdxd is None else sdxd / len(dx),
               sdd, None if sdd is None else sdd / len(dd))
        out[key + canon_row(row)] += 1
    return out


class AggregateConformance(KernelConformance):
    schemas = [SCHEMA]
    by: list[str] = []
    spark_loose_zero = frozenset({"mind", "maxd"})

    def make_kernel(self):
        return AggregateKernel(SCHEMA, self.by, AGGS)

    def model(self, net):
        return aggregate_model(net[0], [SCHEMA.names.index(c) for c in self.by])

    def value_lists(self, input_index, spark):
        return [G_VALUES, K_VALUES, X_SPARK if spark else X_MODEL,
                D_SPARK if spark else D_MODEL, S_VALUES]

    def spark_may_raise(self, net):
        by = [SCHEMA.names.index(c) for c in self.by]
        xs: dict = defaultdict(list)
        for r in net[0]:
            if r[2] is not None:
                xs[canon_row(norm_key(r[i]) for i in by)].append(r[2])
        return any(sum(v for v in vals if v > 0) > I64_MAX
                   or sum(v for v in vals if v < 0) < I64_MIN
                   for group in xs.values() for vals in (group, set(group)))

    def awkward_stream(self):
        pool = [[
            (0.0, "\x00", 1, 1e308, "\x1f"),
            (-0.0, "\x00", 2, 1e308, ""),
            (NAN, None, None, INF, None),
            (NEG_NAN, None, 3, -0.0, "\x00"),
            (None, "", I64_MAX, None, "a"),
            (None, "", I64_MIN, 5e-324, None),
            (1.5, "a", 7, -INF, "b"),
            (1.5, "a", None, INF, "é"),
        ]]
        return fixed_stream(pool, [
            [[]],  # an empty first batch
            [[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]],
            [[(0, -1), (2, -1), (5, 1)]],  # 1e308 + 1e308 retracted: 1e308; +inf retracted
            [[(6, 1), (7, 1), (6, -1), (6, 1)]],
            [[(6, -1), (4, -1), (3, -1)]],
            [[(6, 1), (3, 1), (7, -1)]],  # rows whose last copy left come back; 7 leaves
        ], restarts=[False, False, True, False, True, False])


class TestGroupedAggregate(AggregateConformance):
    by = ["g", "k"]
    sql = f"SELECT g, k, {SELECT} FROM in0 GROUP BY g, k"


class TestGlobalAggregate(AggregateConformance):
    by: list[str] = []
    sql = f"SELECT {SELECT} FROM in0"


# -- edge cases --------------------------------------------------------------------------


def delta(rows, ws):
    return table(rows, ws, SCHEMA)


def test_global_aggregate_emits_its_row_on_an_empty_first_batch():
    k = AggregateKernel(SCHEMA, [], AGGS)
    out = k.apply([delta([], [])], [DictZSet()])
    assert out.num_rows == 1
    row = out.to_pylist()[0]
    assert row["n"] == 0 and row["cdd"] == 0 and row[W] == 1
    assert row["sx"] is None and row["sd"] is None and row["mind"] is None


def test_long_sum_overflow_raises_and_leaves_state_untouched():
    k = AggregateKernel(SCHEMA, ["k"], [Agg("sum", "x", "sx")])
    state = DictZSet()
    k.apply([delta([(0.0, "a", I64_MAX, None, None)], [1])], [state])
    before = state.snapshot()
    with pytest.raises(ArithmeticOverflow, match="sum\\(x\\).*overflows int64 in group.*'a'"):
        k.apply([delta([(0.0, "a", 1, None, None)], [1])], [state])
    assert state.snapshot() == before
    assert isinstance(ArithmeticOverflow("x"), ArithmeticError)
    # the same +1 cancelled within its batch is no overflow: the net input is what counts
    out = k.apply([delta([(0.0, "a", 1, None, None), (0.0, "a", 1, None, None)], [1, -1])],
                  [state])
    assert out.num_rows == 0


@pytest.mark.spark
def test_long_sum_overflow_matches_spark(spark):
    class Overflow(TestGroupedAggregate):
        def awkward_stream(self):
            return fixed_stream([[(0.0, "a", I64_MAX, None, None), (0.0, "a", 1, None, None),
                                  (0.0, "b", I64_MIN, None, None)]],
                                [[[(0, 1), (2, 1)]], [[(1, 1), (1, -1)]], [[(1, 1)]]])

    Overflow().check_stream(Overflow().awkward_stream(), spark)


def test_double_sum_is_exact_under_retraction():
    k = AggregateKernel(SCHEMA, [], [Agg("sum", "d", "sd"), Agg("avg", "d", "ad")])
    state = DictZSet()
    total: Counter = Counter()

    def step(rows, ws):
        nonlocal total
        out = k.apply([delta([(None, None, None, d, None) for d in rows], ws)], [state])
        for row, n in out_counter(out).items():
            total[row] += n
        total = +total
        return [r for r in total]

    assert step([1e308, 1e308], [1, 1]) == [(canon(INF), canon(INF))]
    assert step([1e308], [-1]) == [(canon(1e308), canon(1e308))]
    assert step([INF], [1]) == [(canon(INF), canon(INF))]
    assert step([INF], [-1]) == [(canon(1e308), canon(1e308))]
    big = float(Fraction(1e308) + Fraction(0.1) + Fraction(0.2))
    assert step([0.1, 0.2], [1, 1]) == [(canon(big), canon(big / 3))]
    assert step([1e308, 0.1], [-1, -1]) == [(canon(0.2), canon(0.2))]


def test_min_max_read_the_multiset_only_when_the_extreme_is_retracted():
    k = AggregateKernel(SCHEMA, ["k"], [Agg("max", "x", "top"), Agg("min", "s", "low")])
    state = DictZSet()
    rows = [(None, "a", x, None, s) for x, s in ((5, "m"), (7, "z"), (3, "b"))]
    for r in rows:
        k.apply([delta([r], [1])], [state])
    assert not [key for key in state.looked_up if key.startswith(MULTISET)]
    out = k.apply([delta([rows[0]], [-1])], [state])  # neither extreme leaves
    assert not [key for key in state.looked_up if key.startswith(MULTISET)]
    assert out.num_rows == 0  # the visible row (a, 7, b) did not change
    out = k.apply([delta([rows[1]], [-1])], [state])  # the max (7) leaves
    assert [key for key in state.looked_up if key.startswith(MULTISET)]
    got = out_counter(out)
    assert got == Counter({("a", 7, "b"): -1, ("a", 3, "b"): 1})


def test_group_disappears_when_its_count_reaches_zero():
    k = AggregateKernel(SCHEMA, ["k"], [Agg("count", None, "n")])
    state = DictZSet()
    k.apply([delta([(None, "a", 1, None, None)], [2])], [state])
    out = k.apply([delta([(None, "a", 1, None, None)], [-2])], [state])
    assert out_counter(out) == Counter({("a", 2): -1})
    assert state.rows == {}


@pytest.mark.parametrize("aggs, match", [
    ([], "at least one"),
    ([Agg("median", "x", "m")], "unknown function"),
    ([Agg("sum", None, "m")], "needs a column"),
    ([Agg("sum", "s", "m")], "sum of string"),
    ([Agg("count", "nope", "m")], "unknown column"),
    ([Agg("count", None, "k")], "repeats a column name"),
    ([Agg("count", None, "__hr_n")], "reserved prefix"),
])
def test_bad_definitions_are_refused(aggs, match):
    with pytest.raises(InvalidInput, match=match):
        AggregateKernel(SCHEMA, ["k"], aggs)


DEC_SCHEMA = pa.schema([("k", pa.string()), ("m", pa.decimal128(10, 2)),
                        ("big", pa.decimal128(38, 0))])
BIG = 9 * 10**37
LIMIT = 10**38 - 1


class TestDecimalSum(KernelConformance):
    """sum(decimal(p, s)) is decimal(min(38, p + 10), s), exact, and raises past it."""

    schemas = [DEC_SCHEMA]
    sql = "SELECT k, sum(m) AS sm, sum(big) AS sb, count(*) AS n FROM in0 GROUP BY k"

    def make_kernel(self):
        return AggregateKernel(DEC_SCHEMA, ["k"], [Agg("sum", "m", "sm"), Agg("sum", "big", "sb"),
                                                   Agg("count", None, "n")])

    def model(self, net):
        with decimal.localcontext(decimal.Context(prec=100)):
            return self._model(net)

    def _model(self, net):
        groups: dict = defaultdict(list)
        for r in net[0]:
            groups[r[0]].append(r)
        out: Counter = Counter()
        for k, rs in groups.items():
            ms = [r[1] for r in rs if r[1] is not None]
            bs = [r[2] for r in rs if r[2] is not None]
            sb = sum(bs) if bs else None
            if sb is not None and abs(sb) > LIMIT:
                raise ExpectOverflow(k)
            out[(k, sum(ms) if ms else None, sb, len(rs))] += 1
        return out

    def value_lists(self, input_index, spark):
        d = decimal.Decimal
        return [["a", "\x00", None], [d("99999999.99"), d("-0.01"), d("0.00"), None],
                [d(BIG), d(-BIG), d(1), d(1), None]]

    def spark_may_raise(self, net):
        pos: Counter = Counter()
        neg: Counter = Counter()
        for r in net[0]:
            if r[2] is not None:
                (pos if r[2] > 0 else neg)[r[0]] += r[2]
        return any(v > LIMIT for v in pos.values()) or any(v < -LIMIT for v in neg.values())

    def awkward_stream(self):
        d = decimal.Decimal
        pool = [[("a", d("99999999.99"), d(BIG)), ("a", d("-0.01"), d(1)),
                 ("a", None, d(BIG))]]
        return fixed_stream(pool, [[[(0, 1), (1, 1)]], [[(0, 2), (1, -1)]],
                                   [[(2, 1)]]])  # 9e37 + 9e37 > 10^38 - 1: overflow
