"""Differential tests: incremental kernels over random delta streams == from-scratch results."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_model import DictZSet  # noqa: I001  (tests/spark is on sys.path)

from headrace.spark.kernels import AggregateKernel, DistinctKernel, JoinKernel, W
from headrace.spark.state import BucketState

ORDERS = pa.schema([("order_id", pa.int64()), ("customer_id", pa.int64()),
                    ("amount", pa.int64()), ("item", pa.string())])
CUSTOMERS = pa.schema([("customer_id", pa.int64()), ("region", pa.string())])


def spine_state():
    """The real thing: a headrace Spine (string keys/vals), as the pipeline's tasks use it."""
    return BucketState(None, op=0, side=0, bucket=0)


STATES = [DictZSet, spine_state]


def as_counter(table: pa.Table, weight: str) -> Counter:
    c: Counter = Counter()
    cols = [n for n in table.column_names if n != weight]
    for row in table.to_pylist():
        c[tuple(row[n] for n in cols)] += row[weight]
    return +c if all(v >= 0 for v in c.values()) else Counter({k: v for k, v in c.items() if v})


order_rows = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 4), st.integers(-50, 50),
                                st.sampled_from(["a", "b", "c,d", ""]),
                                st.sampled_from([1, 1, 1, -1, 2])), max_size=12)


def table(rows, schema):
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(len(schema) + 1)]
    arrays = [pa.array(list(c), f.type) for c, f in zip(cols, schema, strict=False)]
    return pa.Table.from_arrays(arrays + [pa.array(list(cols[-1]), pa.int64())],
                                names=schema.names + [W])


def integrate(out_tables, weight="diff") -> Counter:
    total: Counter = Counter()
    for t in out_tables:
        total.update(as_counter(t, weight))
    return Counter({k: v for k, v in total.items() if v})


@pytest.mark.parametrize("make_state", STATES, ids=["model", "spine"])
@settings(max_examples=40, deadline=None)
@given(st.lists(order_rows, min_size=1, max_size=5))
def test_aggregate_matches_recomputation(make_state, batches):
    k = AggregateKernel(ORDERS, by=["customer_id"], aggs={"n": "count", "total": "sum(amount)"})
    state = make_state()
    outs = [k.apply(table(b, ORDERS), state) for b in batches]
    got = integrate(outs)
    # from scratch: per customer, Σw and Σw*amount; groups with Σw == 0 are absent
    n: Counter = Counter()
    s: Counter = Counter()
    for b in batches:
        for (_o, c, a, _i, w) in b:
            n[c] += w
            s[c] += w * a
    want = Counter({(c, n[c], s[c]): 1 for c in n if n[c] != 0})
    assert got == want


@pytest.mark.parametrize("make_state", STATES, ids=["model", "spine"])
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(order_rows, st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from(["eu", "us", "apac"]),
              st.sampled_from([1, -1, 1])), max_size=4)), min_size=1, max_size=5))
def test_join_matches_recomputation(make_state, batches):
    k = JoinKernel(ORDERS, CUSTOMERS, on=["customer_id"])
    left, right = make_state(), make_state()
    outs = [k.apply(table(o, ORDERS), table(c, CUSTOMERS), left, right) for o, c in batches]
    got = integrate(outs)
    lz: Counter = Counter()
    rz: Counter = Counter()
    for o, c in batches:
        for (oid, cid, a, i, w) in o:
            lz[(oid, cid, a, i)] += w
        for (cid, r, w) in c:
            rz[(cid, r)] += w
    want: Counter = Counter()
    for (oid, cid, a, i), lw in lz.items():
        for (cid2, r), rw in rz.items():
            if cid == cid2 and lw * rw:
                want[(cid, oid, a, i, r)] += lw * rw
    assert got == Counter({k: v for k, v in want.items() if v})


@pytest.mark.parametrize("make_state", STATES, ids=["model", "spine"])
@settings(max_examples=40, deadline=None)
@given(st.lists(order_rows, min_size=1, max_size=5))
def test_distinct_matches_recomputation(make_state, batches):
    schema = pa.schema([("customer_id", pa.int64()), ("item", pa.string())])
    k = DistinctKernel(schema)
    state = make_state()
    outs = []
    total: Counter = Counter()
    for b in batches:
        rows = [(c, i, w) for (_o, c, _a, i, w) in b]
        outs.append(k.apply(table(rows, schema), state))
        for (c, i, w) in rows:
            total[(c, i)] += w
    assert integrate(outs) == Counter({r: 1 for r, w in total.items() if w > 0})
