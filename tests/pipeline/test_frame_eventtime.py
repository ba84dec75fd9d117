"""Event time against Spark: watermarks, late rows, windows closing, append and update sinks.

Two waves of bids; the second holds rows far behind the first wave's watermark (late: Spark
drops them) and one just inside it. The update sink must equal Spark batch SQL over the rows
that were not late; the append sink must hold each window the final watermark closed exactly
once (no retraction), with the same values."""

from __future__ import annotations

import datetime as dt
import random

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


@pytest.mark.parametrize("mode", ["update", "append"])
def test_windowed_aggregate_with_watermark_equals_spark(spark, tmp_path, waves, mode):
    from headrace.pipeline.runner import Pipeline

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    batches, kept, late = waves
    p = None
    for wave in batches:
        produce_entries(root, "in", encode_entries("bid", wave))
        p = Pipeline(spark, root, name="et", partitions=2, buckets=4, checkpoint_dir=ckpt)
        _query(p.read_queue("in", SCHEMAS)).write_shard("out", mode=mode)
        p.run(until_idle=True)
    assert p.metrics["late_rows"] == len(late)
    streamed = p.read_shard("out")
    expected = batch_result(spark, SCHEMAS, {"bid": kept}, _batch)
    if mode == "append":
        # final watermark = max event time - 5 s: only windows ending by then are emitted
        top = max(r["dateTime"] for r in kept) - dt.timedelta(seconds=5)
        expected = expected.filter(_f_le(expected, top))
        assert expected.num_rows > 0
        shard = p.persist.read_only("out").snapshot(p.persist.upper("out") - 1)
        assert set(shard["diff"].to_pylist()) == {1}  # each window once, never retracted
    equal, why = rows_equal(streamed, expected)
    assert equal, why


def _f_le(table, top):
    import pyarrow.compute as pc

    return pc.less_equal(table["window_end"], pc.cast(top, table.schema.field("window_end").type))


def test_append_needs_an_event_time_aggregate(spark, tmp_path):
    from headrace.pipeline.runner import Pipeline

    F = _f()
    p = Pipeline(spark, str(tmp_path / "s"), name="bad", checkpoint_dir=str(tmp_path / "ck"))
    bid = p.read_queue("in", SCHEMAS)["bid"]
    with pytest.raises(InvalidInput, match="append"):
        bid.group_by("auction").agg(F.count("*")).write_shard("x", mode="append")
    with pytest.raises(InvalidInput, match="not a timestamp"):
        bid.with_watermark("price", "5 seconds")
    with pytest.raises(InvalidInput, match="duration"):
        bid.with_watermark("dateTime", "soon")
