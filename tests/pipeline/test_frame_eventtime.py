"""Event time against Spark: watermarks, late rows, windows closing, append and update sinks.

Two waves of bids; the second holds rows far behind the first wave's watermark (late: Spark
drops them) and one just inside it. The update sink must equal Spark batch SQL over the rows
that were not late; the append sink must hold each window the final watermark closed exactly
once (no retraction), with the same values."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest

from headrace.errors import InvalidInput
from headrace.testing.queries import batch_result, encode_entries, produce_entries, rows_equal

pytestmark = pytest.mark.spark

SCHEMAS = {"bid": "auction long, price long, dateTime timestamp"}
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _bids(seed: int, lo_s: float, hi_s: float, n: int) -> list[dict]:
    rnd = random.Random(seed)
    return [{"auction": rnd.randint(1, 4), "price": rnd.randint(1, 500),
             "dateTime": BASE + dt.timedelta(milliseconds=rnd.randint(int(lo_s * 1000),
                                                                      int(hi_s * 1000)))}
            for _ in range(n)]


def _f():
    from pyspark.sql import functions as F

    return F


def _query(src):
    F = _f()
    return (src["bid"].with_watermark("dateTime", "5 seconds")
            .group_by(F.window("dateTime", "10 seconds"), "auction")
            .agg(F.count("*").alias("n"), F.max("price").alias("top"),
                 F.count_distinct("price").alias("d")))


def _batch(frames):
    F = _f()
    g = frames["bid"].groupBy(F.window("dateTime", "10 seconds"), "auction").agg(
        F.count("*").alias("n"), F.max("price").alias("top"), F.count_distinct("price").alias("d"))
    return g.select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "auction", "n", "top", "d")


@pytest.fixture(scope="module")
def waves():
    first = _bids(1, 0, 30, 120)  # max event time ~30 s -> watermark ~25 s after this wave
    late = _bids(2, 0, 14, 10)  # windows [0,10) and [10,20) end <= 25 s: dropped as late
    inside = _bids(3, 20.5, 29, 5)  # window [20,30) still open: counted
    second = _bids(4, 30, 60, 120)
    return [first, late + inside + second], first + inside + second, late


MODES = ("update", "append")


@pytest.fixture(scope="module")
def windowed(spark, tmp_path_factory, waves):
    """One pipeline over both waves (a restart between) writing the windowed aggregate to an
    update sink and, from a second aggregate (an operator emits either changes or final rows),
    to an append sink: each mode's operator and sink as in a pipeline of its own, one run."""
    from headrace.pipeline import Pipeline

    base = tmp_path_factory.mktemp("windowed")
    root, ckpt = str(base / "store"), str(base / "ck")
    p = None
    for wave in waves[0]:
        produce_entries(root, "in", encode_entries("bid", wave))
        p = Pipeline(spark, root, name="et", partitions=2, buckets=4, checkpoint_dir=ckpt)
        src = p.read_queue("in", SCHEMAS)
        for mode in MODES:
            _query(src).write_shard(f"out_{mode}", mode=mode)
        p.run(until_idle=True, max_runs=1)
    return p


@pytest.mark.parametrize("mode", MODES)
def test_windowed_aggregate_with_watermark_equals_spark(spark, windowed, waves, mode):
    p = windowed
    batches, kept, late = waves
    assert p.metrics["late_rows"] == len(MODES) * len(late)  # each aggregate drops its own
    streamed = p.read_shard(f"out_{mode}")
    expected = batch_result(spark, SCHEMAS, {"bid": kept}, _batch)
    if mode == "append":
        # final watermark = max event time - 5 s: only windows ending by then are emitted
        top = max(r["dateTime"] for r in kept) - dt.timedelta(seconds=5)
        expected = expected.filter(_f_le(expected, top))
        assert expected.num_rows > 0
        shard = p.persist.read_only("out_append").snapshot(p.persist.upper("out_append") - 1)
        assert set(shard["diff"].to_pylist()) == {1}  # each window once, never retracted
    equal, why = rows_equal(streamed, expected)
    assert equal, why


def _f_le(table, top):
    import pyarrow.compute as pc

    return pc.less_equal(table["window_end"], pc.cast(top, table.schema.field("window_end").type))


def test_append_needs_an_event_time_aggregate(spark, tmp_path):
    from headrace.pipeline import Pipeline

    F = _f()
    p = Pipeline(spark, str(tmp_path / "s"), name="bad", checkpoint_dir=str(tmp_path / "ck"))
    bid = p.read_queue("in", SCHEMAS)["bid"]
    with pytest.raises(InvalidInput, match="append"):
        bid.group_by("auction").agg(F.count("*")).write_shard("x", mode="append")
    with pytest.raises(InvalidInput, match="not a timestamp"):
        bid.with_watermark("price", "5 seconds")
    with pytest.raises(InvalidInput, match="duration"):
        bid.with_watermark("dateTime", "soon")
    counts = (bid.with_watermark("dateTime", "5 seconds")
              .group_by(F.window("dateTime", "10 seconds"), "auction").agg(F.count("*")))
    top = counts.group_by("window_start", "auction").agg(F.max("count(1)").alias("m"))
    joined = counts.join(top, on=["auction", "window_start"])  # the state key leads with time
    assert joined.columns == ["auction", "window_start", "window_end", "count(1)", "m"]
    assert joined.node.source.expiry["columns"] == ["window_start", "window_start"]
    with pytest.raises(InvalidInput, match="join"):  # a join's rows are never final
        joined.write_shard("j", mode="append")
    with pytest.raises(InvalidInput, match="feeds"):  # its final rows would be late at top
        counts.write_shard("c", mode="append")
    other = p.read_queue("in2", {"ask": "auction long, t timestamp"})["ask"]
    with pytest.raises(InvalidInput, match="join type 'cross'"):
        bid.join(other, on="auction", how="cross", time_columns=("dateTime", "t"),
                 within=("0 seconds", "1 second"))
    with pytest.raises(InvalidInput, match="within"):
        bid.join(other, on="auction", time_columns=("dateTime", "t"))
    # an outer interval join feeds an append sink only when both time columns are watermarked
    half = bid.with_watermark("dateTime", "5 seconds").join(
        other, on="auction", how="full", time_columns=("dateTime", "t"),
        within=("0 seconds", "1 second"))
    with pytest.raises(InvalidInput, match="interval join of two watermarked"):
        half.write_shard("h", mode="append")
    both = bid.with_watermark("dateTime", "5 seconds").join(
        other.with_watermark("t", "5 seconds"), on="auction", how="full",
        time_columns=("dateTime", "t"), within=("0 seconds", "1 second"))
    both.filter(F.col("price") > 1).write_shard("b", mode="append")
    with pytest.raises(InvalidInput, match="append sink"):
        both.write_shard("b2")


# ---- event time through joins and downstream aggregates (q5's shape); interval joins ----
def _hot(src):
    """Per 10 s window the auctions with the most bids: a count, a max over the counts (a
    downstream aggregate) and a join of the two on the window."""
    F = _f()
    counts = (src["bid"].with_watermark("dateTime", "5 seconds")
              .group_by(F.window("dateTime", "10 seconds"), "auction")
              .agg(F.count("*").alias("n")))
    top = counts.group_by("window_start", "window_end").agg(F.max("n").alias("maxn"))
    return (counts.join(top, on=["window_start", "window_end"])
            .filter(F.col("n") >= F.col("maxn")).select("window_start", "auction", "n"))


def _hot_batch(frames):
    F = _f()
    c = frames["bid"].groupBy(F.window("dateTime", "10 seconds").alias("w"), "auction").agg(
        F.count("*").alias("n")).select(F.col("w.start").alias("window_start"), "auction", "n")
    m = c.groupBy("window_start").agg(F.max("n").alias("maxn"))
    return c.join(m, "window_start").filter("n >= maxn").select("window_start", "auction", "n")


def _state_keys(p, node, side: int) -> pa.Array:
    """Every live state key of one side of an operator, over all buckets."""
    from headrace.pipeline.exec.workers import open_reader
    from headrace.pipeline.plan.progress import STATE_KEY
    from headrace.pipeline.state import BucketLSM

    reader = open_reader(p.root, p.stream, p.bindings[STATE_KEY], None)
    found = [t["key"] for b in range(p.buckets)
             for t in BucketLSM(reader, node.op, side, b).scan()]
    return pa.chunked_array(found, pa.binary()).combine_chunks()


def test_windowed_join_and_downstream_aggregate_expire_and_equal_spark(spark, tmp_path,
                                                                        waves):
    from headrace.pipeline import Pipeline
    from headrace.pipeline.operators.aggregate import ACC
    from headrace.pipeline.plan.nodes import Operator

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    batches, kept, late = waves
    for wave in batches:
        produce_entries(root, "in", encode_entries("bid", wave))
        p = Pipeline(spark, root, name="hot", partitions=2, buckets=4, checkpoint_dir=ckpt)
        _hot(p.read_queue("in", SCHEMAS)).write_shard("out")
        p.run(until_idle=True, max_runs=1)
    assert p.metrics["late_rows"] == len(late)
    equal, why = rows_equal(p.read_shard("out"),
                            batch_result(spark, SCHEMAS, {"bid": kept}, _hot_batch))
    assert equal, why
    # the final watermark (max event time - 5 s, > 50 s) closed every window but [50 s, 60 s):
    # the join's and the downstream aggregate's state hold that window only, on every side
    ops = [n for n in p.nodes if isinstance(n, Operator) and n.expiry]
    join = next(n for n in ops if n.kind == "join")
    top = next(n for n in ops if n.params.get("by") == ["window_start", "window_end"])
    open_window = BASE + dt.timedelta(seconds=50)
    kernel = join.kernel()
    for side, codec in ((0, kernel.lkey), (1, kernel.rkey)):
        starts = codec.decode(_state_keys(p, join, side))["window_start"].to_pylist()
        assert starts and set(starts) == {open_window}, (side, sorted(set(starts)))
    acc = [k for k in _state_keys(p, top, 0).to_pylist() if k[:1] == ACC]
    groups = top.kernel().group_codec.decode(pa.array([k[1:] for k in acc], pa.binary()))
    assert set(groups["window_start"].to_pylist()) == {open_window}


CLICKS = {"click": "ad long, ct timestamp, c long", "view": "ad long, vt timestamp, v long"}


def _clicks(seed: int, lo_s: float, hi_s: float, n: int, kind: str) -> list[dict]:
    rnd = random.Random(seed)
    t, x = ("ct", "c") if kind == "click" else ("vt", "v")
    return [{"ad": rnd.randint(1, 3), x: i,
             t: BASE + dt.timedelta(milliseconds=rnd.randint(int(lo_s * 1000), int(hi_s * 1000)))}
            for i in range(n)]


JOINS = (("left", "update"), ("full", "append"))  # one pipeline runs both


def test_interval_join_equals_spark_and_forgets_rows_that_cannot_match(spark, tmp_path):
    """Views within [click - 5 s, click + 10 s] of a click on the same ad, in three waves
    (each a restart); the second holds rows behind the watermark (late: dropped, counted),
    the third only rows ~1000 s later on ads that match nothing, which moves the watermark past
    every earlier row. A left join to an update sink: the shard equals Spark batch SQL over every
    row not late; a full join to an append sink: each row once, never retracted, equal to Spark
    over the first two waves' rows (final), none of the third's (not final)."""
    from headrace.pipeline import Pipeline

    F = _f()
    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    first = {"click": _clicks(1, 0, 30, 60, "click"), "view": _clicks(2, 0, 30, 60, "view")}
    marks = [max(r[t] for r in first[k]) for k, t in (("click", "ct"), ("view", "vt"))]
    watermark = min(marks) - dt.timedelta(seconds=5)
    second = {"click": _clicks(3, 5, 60, 60, "click"), "view": _clicks(4, 5, 60, 60, "view")}
    late = sum(r[t] <= watermark for k, t in (("click", "ct"), ("view", "vt")) for r in second[k])
    kept = {k: first[k] + [r for r in second[k] if r[t] > watermark]
            for k, t in (("click", "ct"), ("view", "vt"))}
    third = {"click": [dict(r, ad=r["ad"] + 10) for r in _clicks(5, 1000, 1010, 5, "click")],
             "view": [dict(r, ad=r["ad"] + 20) for r in _clicks(6, 1000, 1010, 5, "view")]}
    assert 0 < late < 60
    p = None
    for wave in (first, second, third):
        produce_entries(root, "in", [e for k in wave for e in encode_entries(k, wave[k])])
        p = Pipeline(spark, root, name="iv", partitions=2, buckets=4, checkpoint_dir=ckpt)
        src = p.read_queue("in", CLICKS)
        clicks = src["click"].with_watermark("ct", "5 seconds")
        views = src["view"].with_watermark("vt", "5 seconds")
        for how, mode in JOINS:
            clicks.join(views, on="ad", how=how, time_columns=("ct", "vt"),
                        within=("-5 seconds", "10 seconds"), name=f"j_{how}").write_shard(
                f"out_{how}", mode=mode)
        p.run(until_idle=True, max_runs=1)
        if wave is second:  # metrics are the run's (each join drops and counts them)
            assert p.metrics["late_rows"] == len(JOINS) * late

    for how, mode in JOINS:
        def batch(frames, how=how):
            c, v = frames["click"].alias("c"), frames["view"].alias("v")
            on = (F.col("c.ad") == F.col("v.ad")) & F.expr(
                "v.vt BETWEEN c.ct - INTERVAL 5 SECONDS AND c.ct + INTERVAL 10 SECONDS")
            key = {"right": F.col("v.ad"), "full": F.coalesce("c.ad", "v.ad")}.get(
                how, F.col("c.ad"))
            return c.join(v, on, how).select(key.alias("ad"), "c.ct", "c.c", "v.vt", "v.v")

        rows = kept if mode == "append" else {k: kept[k] + third[k] for k in kept}
        equal, why = rows_equal(p.read_shard(f"out_{how}"),
                                batch_result(spark, CLICKS, rows, batch))
        assert equal, (how, why)
        if mode == "append":
            shard = p.persist.read_only(f"out_{how}").snapshot(
                p.persist.upper(f"out_{how}") - 1)
            assert set(shard["diff"].to_pylist()) == {1}  # each row once, never retracted
        join = next(n for n in p.nodes if n.name == f"j_{how}")
        # the first two waves' rows are final: the state holds the third wave's only (a key
        # leads with its slot: 8 bytes, big-endian, sign bit flipped; slots are 15 s wide)
        third_us = (BASE - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
                    + dt.timedelta(seconds=1000 - 15)) // dt.timedelta(microseconds=1)
        for side in (0, 1):
            slots = [int.from_bytes(k[:8], "big") ^ (1 << 63)
                     for k in _state_keys(p, join, side).to_pylist()]
            assert slots and min(slots) * 15_000_000 >= third_us, (how, side, slots)
