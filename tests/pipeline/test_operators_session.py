"""Session windows (operators/session.py): the kernel, in both state layouts, against a
pure-Python model and Spark SQL (conformance: inserts that merge sessions, retractions that
split them, random batch splits, restarts), its edge cases, and watermark expiry with bounded
state. The fluent API against Spark: test_frame_sessions.py."""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter, defaultdict
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from conformance import (  # noqa: I001  (tests/pipeline is on sys.path)
    I64_MAX,
    INF,
    NAN,
    NEG_NAN,
    DictZSet,
    ExpectOverflow,
    KernelConformance,
    canon_row,
    fixed_stream,
    out_counter,
    table,
)
from test_operators_aggregate import norm_key
from test_state_expiry import Stream

from headrace.errors import InvalidInput
from headrace.pipeline.errors import ArithmeticOverflow
from headrace.pipeline.names import W
from headrace.pipeline.operators import build
from headrace.pipeline.operators.aggregate import Agg
from headrace.pipeline.operators.kernel import RoutesKeys
from headrace.pipeline.operators.session import ENDS, ROWS, SessionKernel
from headrace.pipeline.plan.eventtime import bound_key

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000_000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def ts(us: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=us)


def exact_mean(vals: list[float]):
    """Spark's avg of doubles: the (here exact) double sum, then / count."""
    if not vals:
        return None
    if any(v != v for v in vals) or (INF in vals and -INF in vals):
        return NAN
    if INF in vals or -INF in vals:
        return INF if INF in vals else -INF
    total = sum((Fraction(v) for v in vals), Fraction(0))
    try:
        return float(total) / len(vals)
    except OverflowError:
        return INF if total > 0 else -INF


def spark_order(v: float):
    """Spark's order for doubles (NaN above all); -0.0 below 0.0, as the kernel picks."""
    return (v != v, 0.0 if v != v else v, math.copysign(1, v) > 0)


def sessions_model(rows: list[tuple], by: list[int], t_idx: int, gap: int, aggs) -> Counter:
    """Spark SQL's GROUP BY session_window(t, gap), by: rows with a NULL time dropped; per key,
    rows by time, a row at most the current end away joins (end = max(end, t + gap))."""
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for r in rows:
        if r[t_idx] is not None:
            groups[canon_row(norm_key(r[i]) for i in by)].append(r)
    out: Counter = Counter()
    for key, rs in groups.items():
        sessions: list[list] = []
        for r in sorted(rs, key=lambda r: r[t_idx]):
            t = r[t_idx]
            if sessions and t <= sessions[-1][1]:
                sessions[-1][1] = max(sessions[-1][1], t + gap)
                sessions[-1][2].append(r)
            else:
                sessions.append([t, t + gap, [r]])
        for start, end, members in sessions:
            out[key + (ts(start), ts(end)) + canon_row(aggs(key, members))] += 1
    return out


class ScanZSet(DictZSet):
    """DictZSet with the range reads and deletes of the event-time layout (BucketLSM's)."""

    def scan(self, lo=None, hi=None):
        found = [k for k in sorted(self.rows) if (lo is None or k >= lo)
                 and (hi is None or k < hi)]
        rows = [(k, v, w) for k in found for v, w in self.rows[k].items()]
        if rows:
            yield pa.table({"key": pa.array([r[0] for r in rows], pa.binary()),
                            "val": pa.array([r[1] for r in rows], pa.binary()),
                            "w": pa.array([r[2] for r in rows], pa.int64())})

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        for k in [k for k in self.rows if lo <= k < hi]:
            del self.rows[k]


class SessionConformance(KernelConformance):
    """Spark's naive timestamps (local time) become UTC instants, as the kernel's are; the
    event-time layout's kernels run on a DictZSet that also scans."""

    expiring = False

    def check_stream(self, stream, spark=None):
        import conformance

        plain = conformance.DictZSet
        conformance.DictZSet = ScanZSet
        try:
            super().check_stream(stream, spark)
        finally:
            conformance.DictZSet = plain

    def run_spark(self, spark, net):
        got = super().run_spark(spark, net)
        if got == "overflow":
            return got
        names, rows = got
        fixed: Counter = Counter()
        for row, n in rows.items():
            fixed[tuple(v.astimezone(dt.UTC) if isinstance(v, dt.datetime) else v
                        for v in row)] += n
        return names, fixed


# ---- conformance: string keys, every aggregate, merges and splits ----------------------------

SCHEMA = pa.schema([("k", pa.string()), ("t", TS), ("v", pa.int64()), ("d", pa.float64())])
GAP = 5 * SEC
AGGS = [Agg("count", None, "n"), Agg("count", "v", "cv"), Agg("sum", "v", "sv"),
        Agg("avg", "d", "ad"), Agg("min", "d", "mn"), Agg("count_distinct", "v", "dv")]
SQL = ("SELECT k, session_window.start AS session_window_start, "
       "session_window.end AS session_window_end, count(*) AS n, count(v) AS cv, sum(v) AS sv, "
       "avg(d) AS ad, min(d) AS mn, count(DISTINCT v) AS dv "
       "FROM in0 GROUP BY session_window(t, '5 seconds'), k")
# times 0..21 s: chains 0-2-5-7-10 touch (gap 5 s), 13 s and 21 s stand apart unless bridged
T_VALUES = [s * SEC for s in (0, 2, 5, 7, 10, 13, 21)] + [None, 5 * SEC + 1]
K_VALUES = ["", "\x00", None, "a"]
X_MODEL = [0, 1, -1, 5, None, 2, 3, 0, 1, 5, None, I64_MAX]
X_SPARK = [0, 1, -1, 5, None, 2]
D_MODEL = [0.0, -0.0, NAN, INF, -INF, 1e308, 0.1, 1.5, None]
D_SPARK = [0.0, -0.0, NAN, INF, -INF, 1.5, -2.0, 0.5, None]  # dyadic: Spark's sum is exact


def _aggs(key, rs):
    xs = [r[2] for r in rs if r[2] is not None]
    ds = [r[3] for r in rs if r[3] is not None]
    sx = sum(xs) if xs else None
    if sx is not None and not -(2**63) <= sx < 2**63:
        raise ExpectOverflow(key)
    return (len(rs), len(xs), sx, exact_mean(ds), min(ds, key=spark_order) if ds else None,
            len(set(xs)))


def _kernel(schema=SCHEMA, by=("k",), aggs=AGGS, expiring=False, name="session_window"):
    return build("session", [schema], {
        "by": list(by), "time": "t", "gap_us": GAP, "name": name, "expiring": expiring,
        "aggs": {a.name: [a.func, a.column] for a in aggs}})


class TestSessionWindows(SessionConformance):
    """The event-time layout (rows keyed by session end, moved as sessions grow)."""

    schemas = [SCHEMA]
    sql = SQL
    spark_loose_zero = frozenset({"mn"})
    expiring = True

    def make_kernel(self):
        return _kernel(expiring=self.expiring)

    def model(self, net):
        return sessions_model(net[0], [0], 1, GAP, _aggs)

    def value_lists(self, input_index, spark):
        return [K_VALUES, T_VALUES, X_SPARK if spark else X_MODEL, D_SPARK if spark else D_MODEL]

    def awkward_stream(self):
        s = SEC
        pool = [[("a", 0, 1, 1.5), ("a", 10 * s, 2, -0.0), ("a", 5 * s, None, NAN),
                 ("a", 5 * s, 5, 0.5), ("\x00", None, 5, 0.0), (None, 3 * s, I64_MAX, INF),
                 (None, 4 * s, 1, None), ("a", 15 * s, 2, -INF), ("", 21 * s, None, None)]]
        return fixed_stream(pool, [
            [[(0, 1), (1, 1), (8, 1)]],  # a: [0,5) and [10,15)
            [[(2, 1), (4, 1)]],  # 5 s touches both: one session [0,15); NULL time: none
            [[(2, -1)]],  # its retraction splits it again
            [[(2, 2), (3, 1), (7, 1)]],  # merged again; 15 s touches 10 s + 5 s: [0,20)
            [[]],
            [[(0, -1), (1, -1)]],  # the first row and the bridge at 10 s leave: [5,10), [15,20)
            [[(5, 1)]],  # a NULL key is a key
            [[(6, 1)]],  # I64_MAX + 1 in one session overflows (Spark raises too)
        ], restarts=[False, True, False, False, True, False, True, False])


class TestSessionWindowsKeyed(TestSessionWindows):
    """The layout without event time (rows keyed by key)."""

    expiring = False
    spark_examples = 1


# ---- conformance: float keys (-0.0 = 0.0, one NaN, NULL), a timestamp max ------------------

FSCHEMA = pa.schema([("g", pa.float64()), ("t", TS), ("v", pa.int64())])
FAGGS = [Agg("count", None, "n"), Agg("max", "t", "last")]


class TestSessionFloatKeys(SessionConformance):
    schemas = [FSCHEMA]
    sql = ("SELECT g, session_window.start AS session_window_start, session_window.end AS "
           "session_window_end, count(*) AS n, max(t) AS last "
           "FROM in0 GROUP BY session_window(t, '5 seconds'), g")
    spark_examples = 1

    expiring = True

    def make_kernel(self):
        return _kernel(FSCHEMA, ("g",), FAGGS, expiring=True)

    def model(self, net):
        return sessions_model(net[0], [0], 1, GAP,
                              lambda key, rs: (len(rs), ts(max(r[1] for r in rs))))

    def value_lists(self, input_index, spark):
        return [[0.0, -0.0, NAN, NEG_NAN, None, 1.5], T_VALUES, [1, None]]

    def awkward_stream(self):
        pool = [[(0.0, 0, 1), (-0.0, 3 * SEC, 1), (NAN, 0, 1), (NEG_NAN, 4 * SEC, None),
                 (None, 0, 1), (None, 9 * SEC, 1)]]
        return fixed_stream(pool, [[[(0, 1), (1, 1), (2, 1), (3, 1)]],
                                   [[(4, 1), (5, 1), (1, -1)]]], restarts=[False, True])


# ---- edge cases -----------------------------------------------------------------------------

def _delta(rows, schema=SCHEMA):
    return table([r[:-1] for r in rows], [r[-1] for r in rows], schema)


def _changes(out: pa.Table) -> list[tuple]:
    return sorted((r["session_window_start"], r["session_window_end"], r["n"], r[W])
                  for r in out.to_pylist())


@pytest.mark.parametrize("expiring", [False, True], ids=["keyed", "event_time"])
def test_an_insert_that_bridges_two_sessions_retracts_both_and_emits_the_merge(expiring):
    k, st = _kernel(expiring=expiring), ScanZSet()
    k.apply([_delta([("a", 0, 1, 1.0, 1), ("a", 8 * SEC, 2, 2.0, 1)])], [st])
    out = k.apply([_delta([("a", 4 * SEC, 3, 3.0, 1)])], [st])
    assert _changes(out) == [(ts(0), ts(5 * SEC), 1, -1), (ts(0), ts(13 * SEC), 3, 1),
                             (ts(8 * SEC), ts(13 * SEC), 1, -1)]
    back = k.apply([_delta([("a", 4 * SEC, 3, 3.0, -1)])], [st])  # and its retraction splits
    assert _changes(back) == [(ts(0), ts(5 * SEC), 1, 1), (ts(0), ts(13 * SEC), 3, -1),
                              (ts(8 * SEC), ts(13 * SEC), 1, 1)]


def test_only_the_touched_keys_are_read():
    """Keyed: one lookup of the key's rows. Event time: the index is scanned (one small row
    per open session), and only the touched key's sessions' rows are read."""
    c_key = _kernel().group_codec.encode(_delta([("c", 0, 1, 1.0, 1)]))[0].as_py()
    for expiring in (False, True):
        k, st = _kernel(expiring=expiring), ScanZSet()
        k.apply([_delta([(x, t * SEC, 1, 1.0, 1) for x in "abcdef" for t in (0, 20)])], [st])
        st.looked_up.clear()
        k.apply([_delta([("c", SEC, 1, 1.0, 1)])], [st])
        if not expiring:
            assert st.looked_up == [ROWS + c_key]
            continue
        assert len(st.looked_up) == 2  # c's two sessions
        assert all(key[:1] == ROWS and key.endswith(c_key) for key in st.looked_up)


@pytest.mark.parametrize("expiring", [False, True], ids=["keyed", "event_time"])
def test_null_times_and_empty_deltas_emit_nothing_and_read_nothing(expiring):
    k, st = _kernel(expiring=expiring), ScanZSet()
    assert k.apply([_delta([("a", None, 1, 1.0, 1), ("b", None, 2, 2.0, 3)])], [st]).num_rows == 0
    assert k.apply([_delta([])], [st]).num_rows == 0
    assert st.looked_up == [] and not st.rows


@pytest.mark.parametrize("expiring", [False, True], ids=["keyed", "event_time"])
def test_long_sum_overflow_raises_and_leaves_state_untouched(expiring):
    k, st = _kernel(expiring=expiring), ScanZSet()
    k.apply([_delta([("a", 0, I64_MAX, 1.0, 1)])], [st])
    before = st.snapshot()
    with pytest.raises(ArithmeticOverflow, match="sv"):
        k.apply([_delta([("a", 3 * SEC, 1, 1.0, 1)])], [st])
    assert st.snapshot() == before
    # in another session the same value fits
    out = k.apply([_delta([("a", 30 * SEC, 1, 1.0, 1)])], [st])
    assert [r["sv"] for r in out.to_pylist()] == [1]


@pytest.mark.parametrize("expiring", [False, True], ids=["keyed", "event_time"])
def test_without_group_keys_all_rows_form_the_sessions(expiring):
    k, st = _kernel(by=(), expiring=expiring), ScanZSet()
    out = k.apply([_delta([("a", 0, 1, 1.0, 1), ("b", 2 * SEC, 1, 1.0, 1),
                           ("c", 30 * SEC, 1, 1.0, 1)])], [st])
    assert out.column_names[:2] == ["session_window_start", "session_window_end"]
    assert _changes(out) == [(ts(0), ts(7 * SEC), 2, 1), (ts(30 * SEC), ts(35 * SEC), 1, 1)]


@pytest.mark.parametrize("params, needle", [
    ({"time": "v"}, "not a timestamp"),
    ({"time": "nope"}, "no time column"),
    ({"gap_us": 0}, "positive"),
    ({"gap_us": -5}, "positive"),
    ({"name": "x", "by": ["x_start"]}, "repeat"),
    ({"aggs": {"session_window_end": ["count", None]}}, "repeat"),
])
def test_bad_definitions_are_refused_naming_what(params, needle):
    schema = pa.schema([*SCHEMA, pa.field("x_start", pa.int64())])
    base = {"by": ["k"], "time": "t", "gap_us": GAP, "aggs": {"n": ["count", None]}}
    with pytest.raises(InvalidInput, match=needle):
        build("session", [schema], {**base, **params})


@pytest.mark.parametrize("expiring", [False, True], ids=["keyed", "event_time"])
def test_bulk_many_keys_match_the_model(expiring):
    """Thousands of rows over 200 keys and 60 s, in 5 batches with retractions."""
    rnd = random.Random(3)
    pool = [(rnd.choice([f"k{i}" for i in range(200)]), rnd.randrange(60 * SEC),
             rnd.choice(X_SPARK), rnd.choice(D_SPARK)) for _ in range(3000)]
    k, st, total, net = _kernel(expiring=expiring), ScanZSet(), Counter(), Counter()
    for b in range(5):
        ops = []
        for _ in range(1500):
            i, w = rnd.randrange(len(pool)), rnd.choice([1, 1, 2, -1])
            if net[i] + w >= 0:  # only retract what is there
                net[i] += w
                ops.append((i, w))
        out = k.apply([_delta([(*pool[i], w) for i, w in ops])], [st])
        for row, n in out_counter(out).items():
            total[row] += n
        total = Counter({r: n for r, n in total.items() if n})
        rows = [pool[i] for i, n in net.items() for _ in range(n)]
        assert total == sessions_model(rows, [0], 1, GAP, _aggs), b


# ---- event time: expiry keeps the state of the open sessions only --------------------------

ESCHEMA = pa.schema([("k", pa.int64()), ("t", TS), ("price", pa.int64())])
SPAN, DELAY, EGAP = 2 * SEC, 3 * SEC, 3 * SEC


def test_expiring_sessions_emit_once_and_state_stays_that_of_the_open_sessions(tmp_path):
    """60 batches of 2 s; key k visits for 4 batches, then idles for 4 (sessions with a 3 s
    gap, closing after the visit); the watermark trails the batch's end by 3 s. Every closed
    session is emitted once with its exact count and max, the state holds the rows of the
    open sessions only (and an index entry per open session), and the live state stays flat
    (with the rows keyed by key alone it rose and fell between 40 KB and 740 KB)."""
    kernel = SessionKernel(ESCHEMA, ["k"], "t", EGAP,
                           [Agg("count", None, "n"), Agg("max", "price", "top")])
    stream = Stream(tmp_path)
    rng = np.random.default_rng(7)
    every: list[tuple] = []
    emitted: Counter = Counter()
    live, compact = [], []
    watermark = 0
    for b in range(60):
        k = rng.integers(0, 600, 1600)
        k = k[((k + b) // 4) % 2 == 0]  # visits of 4 batches, 4 idle (8 s > the gap)
        t = b * SPAN + rng.integers(0, SPAN, len(k))
        price = rng.integers(0, 10_000, len(k))
        late = t + EGAP <= watermark  # as eventtime.prepare drops them (none here)
        assert not late.any()
        every += list(zip(k.tolist(), t.tolist(), price.tolist(), strict=True))
        delta = pa.table({"k": k, "t": pa.array(t, pa.int64()).cast(TS), "price": price,
                          W: np.ones(len(k), np.int64)})
        lsm = stream.open()
        kernel.apply([delta], [lsm])
        watermark = (b + 1) * SPAN - DELAY
        below = bound_key(ESCHEMA, "t", watermark)
        final = kernel.expire([lsm], below, True)
        for row in final.to_pylist():
            emitted[(row["k"], row["session_window_start"], row["session_window_end"],
                     row["n"], row["top"])] += row[W]
        stream.commit([lsm])
        live.append(stream.live_bytes())
        compact.append(stream.compact_bytes())
        if b % 20 == 19:
            model = sessions_model(every, [0], 1, EGAP,
                                   lambda key, rs: (len(rs), max(r[2] for r in rs)))
            open_rows = sum(n for (key, s, e, n, top) in model if e > ts(watermark))
            rows = [t for t in stream.open().scan(ROWS, ENDS)]
            assert sum(sum(t["w"].to_pylist()) for t in rows) == open_rows
            index = [t for t in stream.open().scan(ENDS, ENDS + b"\xff")]
            assert sum(t.num_rows for t in index) == sum(1 for r in model if r[2] > ts(watermark))
    closed = Counter({r: n for r, n in model.items() if r[2] <= ts(watermark)})
    assert closed and emitted == closed
    # flat: the second half's largest no larger than the second quarter's (measured: live
    # state 47 / 83 / 116 KB, repeating, against 46 KB of open sessions written compactly:
    # each batch rewrites the sessions it extends, and merges come every third batch)
    half = len(live) // 2
    assert max(live[half:]) <= 1.1 * max(live[half // 2:half]), live
    assert all(got <= 3 * need + 4096 for got, need in
               zip(live[half:], compact[half:], strict=True)), (live, compact)


def test_expire_before_any_watermark_and_without_event_time():
    k, st = _kernel(expiring=True), ScanZSet()
    k.apply([_delta([("a", 0, 1, 1.0, 1)])], [st])
    assert k.expire([st], b"", True).num_rows == 0  # no watermark yet: nothing final
    with pytest.raises(InvalidInput, match="not event time"):
        _kernel().expire([DictZSet()], b"", True)
    assert not isinstance(_kernel(expiring=True), RoutesKeys)  # runs per bucket (exec/tasks.py)
    assert isinstance(_kernel(), RoutesKeys)
