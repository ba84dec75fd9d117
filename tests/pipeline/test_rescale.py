"""Rescaling (a restart with another ``buckets``): the state is re-bucketed once, exactly once.

No Spark: every operator kind's state keys give back their bucket columns; the layout check
in evolve. With Spark: a join + group-by pipeline rescaled 4 -> 7 -> 2 equals Spark batch SQL
and holds the same state, bucket by bucket, as a pipeline that ran with 7 buckets from the
start; an event-time windowed aggregate (max, count distinct, expiry) across a rescale; a driver
SIGKILLed after the rescale's checkpoint, before its commit, then restarted.
"""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from conformance import DictZSet  # noqa: I001  (tests/pipeline is on sys.path)

from headrace.pipeline import operators
from headrace.pipeline.encoding.rowkeys import decode_columns_at
from headrace.pipeline.errors import GraphChanged
from headrace.pipeline.exec.rescale_tasks import key_layout
from headrace.pipeline.names import W
from headrace.pipeline.operators.kernel import ZSET_SCHEMA

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class ScanZSet(DictZSet):
    """DictZSet with the range scan and deletes event-time kernels use."""

    def scan(self, lo=None, hi=None):
        ks = sorted(k for k in self.rows if (lo is None or k >= lo) and (hi is None or k < hi))
        rows = [(k, v, w) for k in ks for v, w in sorted(self.rows[k].items())]
        if rows:
            yield pa.table({"key": [r[0] for r in rows], "val": [r[1] for r in rows],
                            "w": [r[2] for r in rows]}, schema=ZSET_SCHEMA)

    def delete_range(self, lo, hi):
        for k in [k for k in self.rows if lo <= k < hi]:
            del self.rows[k]

    def delete_keys(self, keys):
        for k in keys.to_pylist():
            self.rows.pop(k, None)


def _rows(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows, strict=True))
    arrays = [pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)]
    return pa.Table.from_arrays([*arrays, pa.array([1] * len(rows), pa.int64())],
                                schema=pa.schema([*schema, pa.field(W, pa.int64())]))


def _canon(v):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else v + 0.0  # -0.0 and 0.0 are one key
    return v


A = pa.schema([("k", pa.int64()), ("s", pa.string()), ("x", pa.float64()),
               ("t", pa.timestamp("us", tz="UTC")), ("v", pa.int64())])
B = pa.schema([("k2", pa.int64()), ("s2", pa.string()), ("t2", pa.timestamp("us", tz="UTC")),
               ("u", pa.int64())])
ROWS_A = [(1, "a", 0.0, T0, 5), (1, "a", -0.0, T0 + dt.timedelta(seconds=1), 7),
          (2, "b\x00\x1f", float("nan"), T0 + dt.timedelta(seconds=30), 5),
          (None, "", 1.5, T0 + dt.timedelta(seconds=2), 9), (3, None, -2.5, T0, 1)]
ROWS_B = [(1, "a", T0 + dt.timedelta(seconds=1), 10), (2, "b\x00\x1f", T0, 11),
          (None, "z", T0, 12), (9, "q", T0 + dt.timedelta(seconds=5), 13)]
AGGS = {"n": "count", "lo": "min(v)", "hi": "max(x)", "d": "count_distinct(v)",
        "ds": "sum_distinct(v)"}
KERNELS = [
    ("aggregate", [A], {"by": ["k", "s", "x"], "aggs": AGGS}),
    ("aggregate", [A], {"by": [], "aggs": AGGS}),
    ("distinct", [A], {}),
    ("join", [A, B], {"how": "full", "left_on": ["k", "s"], "right_on": ["k2", "s2"]}),
    ("join", [A, B], {"how": "left", "left_on": ["k", "s"], "right_on": ["k2", "s2"],
                      "interval": {"left": "t", "right": "t2", "lower_us": -5_000_000,
                                   "upper_us": 5_000_000}}),
    ("session", [A], {"by": ["s", "k"], "time": "t", "gap_us": 2_000_000, "aggs": AGGS,
                      "expiring": True}),
    ("session", [A], {"by": ["s"], "time": "t", "gap_us": 2_000_000, "aggs": AGGS}),
    ("over", [A], {"partition_by": ["s", "x"], "order_by": [["v", "asc", None]],
                   "funcs": [["rn", "row_number", None, None], ["m", "sum", "v", None]]}),
]


@pytest.mark.parametrize("kind,schemas,params", KERNELS,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(KERNELS)])
def test_every_state_key_gives_back_its_rows_bucket_columns(kind, schemas, params):
    """Each state row a kernel writes decodes to the bucket columns of the rows that made it:
    what re-bucketing hashes (the Spark job also checks it against the old bucket)."""
    kernel = operators.build(kind, schemas, params)
    states = [ScanZSet() for _ in range(kernel.state_sides)]
    deltas = [_rows(schemas[0], ROWS_A)] + ([_rows(schemas[1], ROWS_B)] if len(schemas) > 1
                                            else [])
    kernel.apply(deltas, states)
    for side, state in enumerate(states):
        codec, offset = key_layout(kernel, side)
        cols = kernel.bucket_columns(side)
        stored = pa.array(list(state.rows), pa.binary())
        assert len(stored) > 0
        if not cols:
            assert codec is None
            continue
        assert codec.columns == cols
        got = decode_columns_at(codec, offset, stored)
        assert got.column_names == cols
        expected = {tuple(_canon(r[c]) for c in cols) for r in deltas[side].to_pylist()}
        decoded = [tuple(_canon(v) for v in r.values()) for r in got.to_pylist()]
        assert set(decoded) <= expected, (set(decoded) - expected)
        # every row with state shows up (the join's NULL keys only where they are stored)
        if kind != "join":
            assert set(decoded) == expected


def test_a_key_in_an_unknown_section_is_a_format_error():
    from headrace.errors import FormatError

    kernel = operators.build(*KERNELS[0][:2], KERNELS[0][2])
    codec, offset = key_layout(kernel, 0)
    with pytest.raises(FormatError, match="unknown section tag 7"):
        decode_columns_at(codec, offset, pa.array([b"\x07\x01abc"], pa.binary()))
    with pytest.raises(FormatError, match="ends inside bucket column 'k'"):
        decode_columns_at(codec, offset, pa.array([b"\x00\x01\x00"], pa.binary()))


def test_only_a_different_bucket_count_is_accepted_by_evolve():
    from test_pipeline_evolve import Plan, base

    stored = base().committed(**{"in": 9})
    evo = base(Plan(buckets=9)).evolve(stored)
    assert evo.rescale_from == 4 and evo.new_ops == [] and evo.removed == []
    assert base(Plan(buckets=4)).evolve(stored).rescale_from is None
    with pytest.raises(GraphChanged, match="state layout differs .*state_backend is not "
                                           "'local\\+backup'"):
        base(Plan(buckets=4, backend="local+backup")).evolve(stored)
    local = base(Plan(buckets=4, backend="local+backup")).committed(**{"in": 9})
    with pytest.raises(GraphChanged, match="has 4 buckets, buckets=8 now: re-bucketing the "
                                           "state needs state_backend='reservoir'"):
        base(Plan(buckets=8, backend="local+backup")).evolve(local)
    grown = base(Plan(buckets=9))  # a rescale and a new part at once: both
    bids = grown.nodes[0]
    grown.write_shard(grown.distinct(bids, "d"), "ds")
    evo = grown.evolve(stored)
    assert evo.rescale_from == 4 and evo.new_ops == ["d"]




# ---- with Spark --------------------------------------------------------------------------------
SPEC_ARGS = {"seed": 7, "customers": 25, "orders": 240, "update_every": 13, "cancel_every": 9}


def _demo_waves(n: int) -> list[list[bytes]]:
    from headrace.spark.demo import DemoSpec, encode, generate_events

    payloads = encode(generate_events(DemoSpec(**SPEC_ARGS)))
    step = -(-len(payloads) // n)
    return [payloads[i: i + step] for i in range(0, len(payloads), step)]


def _expected(spark):
    from headrace.spark.demo import DemoSpec, expected_totals, generate_events, normalize_totals

    return normalize_totals(expected_totals(spark, generate_events(DemoSpec(**SPEC_ARGS))))


def _state(p) -> dict:
    """Every live state row of the committed version: (op, side, bucket) -> sorted rows."""
    from headrace.pipeline.plan.progress import STATE_KEY
    from headrace.pipeline.state import BucketLSM
    from headrace.reservoir import ReservoirReader

    reader = ReservoirReader.open(p.store, stream=p.stream, version=p.bindings[STATE_KEY])
    out = {}
    for n in p.nodes:
        for side in range(getattr(n, "state_sides", 0)):
            for b in range(p.buckets):
                rows = sorted(r for t in BucketLSM(reader, n.op, side, b).scan()
                              for r in zip(*(t[c].to_pylist() for c in ("key", "val", "w")),
                                           strict=True))
                if rows:
                    out[(n.op, side, b)] = rows
    return out


@pytest.mark.spark
def test_join_and_group_by_rescaled_4_7_2_equal_spark_and_a_7_bucket_run(spark, tmp_path):
    """The demo (a join with state on both sides, then a group-by) runs with 4 buckets, is
    restarted with 7, then with 2: each restart re-buckets the state once, as an empty batch,
    and the final shard equals Spark batch SQL. After the 4 -> 7 rescale the state is, bucket
    by bucket, the state of a pipeline that ran with 7 buckets from the start."""
    from headrace.spark.demo import OUTPUT_SHARD, build_pipeline, normalize_totals, produce

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    waves = _demo_waves(3)

    def run(buckets, wave, at=root, ck=ckpt):
        if wave is not None:
            produce(at, wave)
        p = build_pipeline(spark, at, partitions=3, buckets=buckets, checkpoint_dir=ck)
        p.run(until_idle=True, max_runs=1)
        return p

    p4 = run(4, waves[0])
    assert "rescales" not in p4.metrics
    p7 = run(7, waves[1])
    assert p7.metrics["rescales"] == 1
    r = p7.last_rescale
    assert (r["from"], r["to"], r["time"]) == (4, 7, p4.time) and r["rows"] > 0
    assert 0 < r["moved"] < r["rows"]
    assert p7.read_shard(OUTPUT_SHARD, as_of=r["time"]).num_rows > 0  # the empty batch
    fresh = str(tmp_path / "fresh")  # the same input, 7 buckets from the start
    produce(fresh, waves[0])
    fresh = run(7, waves[1], fresh, str(tmp_path / "ck2"))
    assert _state(p7) == _state(fresh)
    p2 = run(2, waves[2])
    assert p2.last_rescale["from"] == 7 and p2.last_rescale["to"] == 2
    assert normalize_totals(p2.read_shard(OUTPUT_SHARD)) == _expected(spark)
    # the new layout is committed: no second rescale (a rescale happens in recover(), as the
    # empty batch of `back.recover()` below; a trigger with no input would add nothing here)
    again = build_pipeline(spark, root, partitions=3, buckets=2, checkpoint_dir=ckpt)
    assert again.recover() == p2.time
    assert "rescales" not in again.metrics and again.time == p2.time


@pytest.mark.spark
def test_event_time_window_aggregate_across_a_rescale(spark, tmp_path):
    """Windows with a watermark (max and count distinct state, expired windows' ranges
    deleted) re-bucketed 4 -> 7 between the waves: equal to Spark batch SQL."""
    from test_frame_eventtime import SCHEMAS, _batch, _bids, _query

    from headrace.pipeline import Pipeline
    from headrace.testing.queries import batch_result, encode_entries, produce_entries, rows_equal

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    first, late = _bids(1, 0, 30, 120), _bids(2, 0, 14, 10)
    inside, second = _bids(3, 20.5, 29, 5), _bids(4, 30, 60, 120)
    p = None
    for buckets, wave in ((4, first), (7, late + inside + second)):
        produce_entries(root, "in", encode_entries("bid", wave))
        p = Pipeline(spark, root, name="et", partitions=2, buckets=buckets, checkpoint_dir=ckpt)
        _query(p.read_queue("in", SCHEMAS)).write_shard("out", mode="update")
        p.run(until_idle=True, max_runs=1)
    assert p.metrics["rescales"] == 1 and p.last_rescale["rows"] > 0
    assert p.metrics["late_rows"] == len(late)
    expected = batch_result(spark, SCHEMAS, {"bid": first + inside + second}, _batch)
    equal, why = rows_equal(p.read_shard("out"), expected)
    assert equal, why


_CHILD = """
import sys
from headrace.spark.demo import build_pipeline
from headrace.testing.spark import local_spark

spark = local_spark("rescale-child", shuffle_partitions=2)
build_pipeline(spark, sys.argv[1], partitions=3, buckets=7, checkpoint_dir=sys.argv[2]).recover()
print("not killed", flush=True)
"""


@pytest.mark.spark
def test_a_rescale_killed_after_its_checkpoint_is_redone_or_undone_on_restart(spark, tmp_path):
    """A driver SIGKILLed after the rescale's state checkpoint, before its progress commit:
    the old layout stays committed. A restart with the old buckets rewrites the state with
    them (the landed checkpoint holds the new layout, which batches of the old one must not
    build on); a restart with the new ones redoes the rescale. Nothing lost or duplicated."""

    from headrace.pipeline.driver.rescale import KILL_ENV
    from headrace.pipeline.plan.progress import STATE_KEY, progress_at
    from headrace.reservoir import ReservoirStorage
    from headrace.spark.demo import OUTPUT_SHARD, build_pipeline, normalize_totals, produce

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    waves = _demo_waves(3)
    produce(root, waves[0])
    p4 = build_pipeline(spark, root, partitions=3, buckets=4, checkpoint_dir=ckpt)
    p4.run(until_idle=True, max_runs=1)
    committed = dict(p4.bindings)
    from headrace.testing.spark import run_sigkilled_child

    run_sigkilled_child(_CHILD, root, ckpt, **{KILL_ENV: "after_checkpoint"})
    assert p4.persist.upper(p4.progress_shard) == p4.time  # nothing committed ...
    assert progress_at(p4.persist, p4.progress_shard, p4.time - 1) == committed
    landed = ReservoirStorage.open(root, stream=p4.stream)
    assert landed.version > committed[STATE_KEY]  # ... but the new layout's pages landed
    landed.close()

    back = build_pipeline(spark, root, partitions=3, buckets=4, checkpoint_dir=ckpt)
    back.recover()  # the old buckets: the state is rewritten with them, committed
    assert (back.last_rescale["from"], back.last_rescale["to"]) == (4, 4)
    produce(root, waves[1])
    back.run(until_idle=True, max_runs=1)
    produce(root, waves[2])
    p7 = build_pipeline(spark, root, partitions=3, buckets=7, checkpoint_dir=ckpt)
    p7.run(until_idle=True, max_runs=1)
    assert p7.last_rescale["from"] == 4 and p7.last_rescale["to"] == 7
    assert normalize_totals(p7.read_shard(OUTPUT_SHARD)) == _expected(spark)
