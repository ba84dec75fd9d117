"""Event-time state in joins, at the kernel level (no Spark): a join on a window deletes exactly
the closed windows' rows from both sides; an interval join matches what the SQL condition
says (brute force), and deleting its expired state never changes the output for rows that are
not late."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pytest
from conformance import DictZSet, canon_row  # noqa: I001  (tests/pipeline is on sys.path)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_operators_interval import IntervalJoin

from headrace.errors import InvalidInput
from headrace.pipeline.names import W
from headrace.pipeline.operators.aggregate import Agg, AggregateKernel
from headrace.pipeline.operators.interval import IntervalJoinKernel, expiry_bounds
from headrace.pipeline.operators.join import JoinKernel
from headrace.pipeline.operators.kernel import ZSET_SCHEMA
from headrace.pipeline.plan.eventtime import bound_key

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000_000


class RangeZSet(DictZSet):
    """DictZSet plus the two calls expiry makes: an ordered range scan and key deletion."""

    def scan(self, lo: bytes | None = None, hi: bytes | None = None):
        rows = [(k, v, w) for k in sorted(self.rows) if (lo is None or k >= lo)
                and (hi is None or k < hi) for v, w in self.rows[k].items()]
        if rows:
            yield pa.table({"key": [r[0] for r in rows], "val": [r[1] for r in rows],
                            "w": [r[2] for r in rows]}, schema=ZSET_SCHEMA)

    def delete_keys(self, keys) -> None:
        for k in keys.to_pylist():
            self.rows.pop(k, None)

    def count(self) -> int:
        return sum(len(v) for v in self.rows.values())

    def insert_updates(self, updates: pa.Table) -> None:
        self.looked_up += updates["key"].to_pylist()  # touched: route_keys must name it
        super().insert_updates(updates)


def _ts(us: list[int]) -> pa.Array:
    return pa.array(us, pa.int64()).cast(TS)


def _out(table: pa.Table) -> Counter:
    cols = [c for c in table.column_names if c != W]
    c: Counter = Counter()
    for row in table.to_pylist():
        c[canon_row(row[n] for n in cols)] += row[W]
    return c


def _add(total: Counter, delta: Counter) -> Counter:
    total = total + Counter()  # copy without zeros
    for k, v in delta.items():
        total[k] += v
    return Counter({k: v for k, v in total.items() if v})


# ---- a join on a window: expiry ---------------------------------------------------------
WIN = pa.schema([("window_start", TS), ("k", pa.int64()), ("v", pa.int64())])
TOP = pa.schema([("window_start", TS), ("k", pa.int64()), ("top", pa.int64())])


def _windows(rows: list[tuple[int, int, int]], schema: pa.Schema) -> pa.Table:
    ws, k, v = zip(*rows, strict=True)
    return pa.table({"window_start": _ts([s * 10 * SEC for s in ws]), "k": list(k),
                     schema.names[2]: list(v), W: [1] * len(rows)})


@pytest.mark.parametrize("how", ["inner", "left", "full", "left_anti"])
def test_join_expiry_deletes_exactly_the_closed_windows_on_both_sides(how):
    """Windows 0..4 (10 s) on both sides; at watermark 30 s windows 0..2 are closed: their
    rows go from both spines, the open windows' rows stay, and a later (non-late) row joins
    exactly as it would have without the deletion."""
    import copy

    kernel = JoinKernel(WIN, TOP, how, on=["window_start", "k"])
    states = [RangeZSet(), RangeZSet()]
    left = [(w, k, 10 * w + k) for w in range(5) for k in (1, 2)]
    right = [(w, k, 7) for w in range(5) for k in (1, 2, 3)]
    kernel.apply([_windows(left, WIN), _windows(right, TOP)], states)
    assert [s.count() for s in states] == [10, 15]
    untouched = copy.deepcopy(states)
    kernel.expire(states, bound_key(WIN, "window_start", 30 * SEC - 10 * SEC), False)
    assert [s.count() for s in states] == [4, 6]  # windows 3 and 4 only, on both sides
    for s in states:
        starts = JoinKernel(WIN, TOP, how, on=["window_start", "k"]).lkey.decode(
            pa.array(list(s.rows), pa.binary()))["window_start"]
        assert min(starts.to_pylist()) == dt.datetime(1970, 1, 1, 0, 0, 30, tzinfo=dt.UTC)
    later = [_windows([(4, 3, 99), (3, 1, 5), (4, 5, 1)], WIN), _windows([(4, 2, 8), (3, 3, 1)], TOP)]
    got = _out(kernel.apply(later, states))
    assert got == _out(kernel.apply(later, untouched)) and got


def test_aggregate_expiry_takes_the_spines_as_a_list_too():
    kernel = AggregateKernel(pa.schema([("window_start", TS), ("k", pa.int64())]),
                             ["window_start", "k"], [Agg("count", None, "n")])
    state = RangeZSet()
    kernel.apply([pa.table({"window_start": _ts([0, 10 * SEC]), "k": [1, 1], W: [1, 1]})],
                  [state])
    kernel.expire([state], bound_key(kernel.input_schema, "window_start", 0), False)
    assert state.count() == 1  # the closed window [0, 10 s) left, the open one stayed


# ---- interval joins ---------------------------------------------------------------------
L = pa.schema([("k", pa.int64()), ("lt", TS), ("a", pa.int64())])
R = pa.schema([("k", pa.int64()), ("rt", TS), ("b", pa.int64())])


def _table(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(4)]
    return pa.table({schema.names[0]: pa.array(cols[0], pa.int64()),
                     schema.names[1]: _ts(list(cols[1])),
                     schema.names[2]: pa.array(cols[2], pa.int64()),
                     W: pa.array(cols[3], pa.int64())})


def _model(how, lrows, rrows, lower, upper) -> Counter:
    """The SQL: SELECT ... FROM l {how} JOIN r ON l.k = r.k AND r.rt BETWEEN lt + lower AND
    lt + upper, over the net multiset of each side (the conformance class's model)."""
    net = []
    for rows in (lrows, rrows):
        c: Counter = Counter()
        for k, t, a, w in rows:
            c[(k, t, a)] += w
        assert all(n >= 0 for n in c.values())
        net.append([r for r, n in sorted(c.items(), key=repr) for _ in range(n)])
    model = IntervalJoin()
    model.how, model.lower, model.upper = how, lower, upper
    return model.model(net)


_row = st.tuples(st.sampled_from([1, 2, None]), st.integers(0, 40), st.integers(0, 3))
HOWS = ["inner", "left", "right", "full", "left_semi", "left_anti"]


@settings(max_examples=90, deadline=None)
@given(lrows=st.lists(_row, min_size=8, max_size=25),
       rrows=st.lists(_row, min_size=8, max_size=25),
       lower=st.integers(-12, 6), span=st.integers(0, 14), seed=st.integers(0, 2**16),
       how=st.sampled_from(HOWS), mode=st.sampled_from(["none", "update", "append"]))
def test_interval_join_equals_the_sql_condition_and_expiry_never_changes_it(
        lrows, rrows, lower, span, seed, how, mode):
    """Random rows (times in seconds) arrive in random batches, with retractions; with
    expiry (``mode`` update or append), a watermark moves up between batches: rows already
    late are dropped (as the stage drops them) and final state is deleted. Update mode: the
    integrated output of ``apply`` must equal the SQL result over the rows that were not late.
    Append mode: only ``expire(emit=True)`` output counts (the stage drops ``apply``'s); it
    is never retracted, never more than the final result, and equal to it once a last
    watermark has made every row final."""
    rnd = np.random.default_rng(seed)
    lower_us, upper_us = lower * SEC, (lower + span) * SEC
    interval = {"left": "lt", "right": "rt", "lower_us": lower_us, "upper_us": upper_us}
    kernel = IntervalJoinKernel(L, R, how, on=["k"], interval=interval)
    states = [RangeZSet(), RangeZSet()]
    sides = [[(k, t * SEC, a, 1) for k, t, a in lrows], [(k, t * SEC, b, 1) for k, t, b in rrows]]
    for side in sides:  # retract a third of the rows later (a retraction follows its insert)
        side += [(k, t, a, -1) for (k, t, a, _) in side if rnd.random() < 0.33]
    batches = [[[], []] for _ in range(4)]
    for s, rows in enumerate(sides):
        at: dict = defaultdict(int)  # a retraction goes in its insert's batch or later
        for r in rows:  # roughly in time order, as a stream: the batch of its 10 s, +-1
            b = min(3, max(0, r[1] // (10 * SEC) + int(rnd.integers(-1, 2))))
            b = at[r[:3]] = max(at[r[:3]], b)
            batches[b][s].append(r)
    kept = [[], []]
    total: Counter = Counter()
    emitted = []
    watermark = None
    for i, (lb, rb) in enumerate(batches):
        if mode != "none" and watermark is not None:  # the stage drops late rows
            lb = [r for r in lb if r[1] > watermark]
            rb = [r for r in rb if r[1] > watermark]
        kept[0] += lb
        kept[1] += rb
        deltas = [_table(L, lb), _table(R, rb)]
        routed = {k for _, ks in kernel.route_keys(deltas) for k in ks.to_pylist()}
        for s in states:
            s.looked_up = []
        out = _out(kernel.apply(deltas, states))
        # one call for all of a task's buckets routes each key it touches by route_keys
        assert {k for s in states for k in s.looked_up} <= routed - {None}
        if mode != "append":
            total = _add(total, out)
        if mode != "none":
            watermark = (i + 1) * 10 * SEC - 5 * SEC
            final = _out(kernel.expire(states, expiry_bounds(interval, [0, 0], watermark),
                                       mode == "append"))
            assert mode == "append" or not final
            emitted.append(final)
            total = _add(total, final)
    if mode == "append":  # a watermark past every time: everything is final
        total = _add(total, _out(kernel.expire(states, expiry_bounds(
            interval, [0, 0], 10**9 * SEC), True)))
        assert [s.count() for s in states] == [0, 0]
    # a retraction is never earlier than its insert, so it is late only if its insert was
    # late or kept: the oracle sees exactly the rows the kernel saw
    want = _model(how, kept[0], kept[1], lower_us, upper_us)
    assert total == want
    for final in emitted:  # append mode: final rows only, never retracted
        assert all(0 < n <= want[row] for row, n in final.items()), final


@pytest.mark.parametrize("how", ["inner", "left", "full", "left_anti"])
def test_interval_join_state_shrinks_as_the_watermark_passes(how):
    """Rows at 0..99 s and one at 59.999999 s on both sides, within (-5 s, +5 s): slots are
    10 s wide. A left row goes once lt + 5 s <= watermark (its partners would be late), a right
    row once rt + 5 s <= watermark; a slot goes when all its rows have: the slot [50 s, 60 s)
    exactly when the watermark reaches 64.999999 s, not a microsecond before. Outer joins
    keep one entry per row (its match count rides in it) and lose it with the row."""
    interval = {"left": "lt", "right": "rt", "lower_us": -5 * SEC, "upper_us": 5 * SEC}
    kernel = IntervalJoinKernel(L, R, how, on=["k"], interval=interval)
    states = [RangeZSet(), RangeZSet()]
    rows = [(1, t * SEC, t, 1) for t in range(100)] + [(1, 60 * SEC - 1, -1, 1)]
    kernel.apply([_table(L, rows), _table(R, rows)], states)
    assert [s.count() for s in states] == [101, 101]
    for watermark, left in ((65 * SEC - 2, 51), (65 * SEC - 1, 40)):
        kernel.expire(states, expiry_bounds(interval, [0, 0], watermark), False)
        assert [s.count() for s in states] == [left, left], watermark


def test_interval_join_refuses_bad_kinds_and_bounds():
    with pytest.raises(InvalidInput, match="join type 'cross'"):
        IntervalJoinKernel(L, R, "cross", on=["k"], interval={
            "left": "lt", "right": "rt", "lower_us": 0, "upper_us": SEC})
    with pytest.raises(InvalidInput, match="lower <= upper"):
        IntervalJoinKernel(L, R, "inner", on=["k"], interval={
            "left": "lt", "right": "rt", "lower_us": SEC, "upper_us": 0})
    with pytest.raises(InvalidInput, match="not a timestamp"):
        IntervalJoinKernel(L, R, "inner", on=["k"], interval={
            "left": "a", "right": "rt", "lower_us": 0, "upper_us": SEC})


def test_aggregate_expiry_keeps_the_group_of_a_null_event_time():
    """A NULL time is never final (never late, as in Spark): its group must survive expiry, so
    that a later NULL-time row updates it (-old +new) instead of adding a second row."""
    kernel = AggregateKernel(pa.schema([("window_start", TS), ("k", pa.int64())]),
                             ["window_start", "k"], [Agg("count", None, "n")])
    state = RangeZSet()
    batch = pa.table({"window_start": _ts([None, 0]), "k": [1, 1], W: [1, 1]})
    total = _out(kernel.apply([batch], [state]))
    kernel.expire([state], bound_key(kernel.input_schema, "window_start", 10 * SEC), False)
    assert state.count() == 1  # the closed window [0, 10 s) went, the NULL group stayed
    total = _add(total, _out(kernel.apply([batch.slice(0, 1)], [state])))
    nulls = {row: w for row, w in total.items() if row[0] is None}
    assert nulls == {(None, 1, 2): 1}


@pytest.mark.parametrize("emit", [False, True])
def test_outer_interval_join_rows_that_never_match(emit):
    """A left join: a row with a NULL key is padded (update mode: at once) and kept until
    final, so that append mode emits it then; a row with a NULL time is padded at once in
    update mode, never stored, and never final (never emitted in append mode, as in Spark)."""
    interval = {"left": "lt", "right": "rt", "lower_us": 0, "upper_us": SEC}
    kernel = IntervalJoinKernel(L, R, "left", on=["k"], interval=interval)
    states = [RangeZSet(), RangeZSet()]
    left = pa.table({"k": pa.array([None, 1], pa.int64()), "lt": _ts([5 * SEC, None]),
                     "a": [1, 2], W: [1, 1]})
    out = _out(kernel.apply([left, _table(R, [(None, 5 * SEC, 9, 1)])], states))
    padded = {canon_row([None, dt.datetime(1970, 1, 1, 0, 0, 5, tzinfo=dt.UTC), 1, None, None]): 1,
              canon_row([1, None, 2, None, None]): 1}
    assert out == padded
    assert [s.count() for s in states] == [1, 0]  # the NULL-key row, until final
    final = _out(kernel.expire(states, expiry_bounds(interval, [0, 0], 6 * SEC), emit))
    assert [s.count() for s in states] == [1, 0]  # its slot [5 s, 6 s) is not all final
    final += _out(kernel.expire(states, expiry_bounds(interval, [0, 0], 7 * SEC), emit))
    assert [s.count() for s in states] == [0, 0]
    assert final == (Counter({k: v for k, v in padded.items() if k[1] is not None}) if emit
                     else Counter())
