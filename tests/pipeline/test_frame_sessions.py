"""Session windows through the fluent API (``group_by(F.session_window(t, gap), ...)``)
against Spark batch SQL: update and append sinks under a watermark across a restart, and what
is refused when a query is written. The kernel's own tests: test_operators_session.py."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from headrace.errors import InvalidInput

pytestmark = pytest.mark.spark

SEC = 1_000_000
SCHEMAS = {"bid": "bidder long, price long, dateTime timestamp"}
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _bids(seed: int, lo_s: float, hi_s: float, n: int) -> list[dict]:
    rnd = random.Random(seed)
    return [{"bidder": rnd.choice([1, 2, 3, 4, None]), "price": rnd.choice([None, *range(1, 500)]),
             "dateTime": BASE + dt.timedelta(milliseconds=rnd.randint(int(lo_s * 1000),
                                                                      int(hi_s * 1000)))}
            for _ in range(n)]


def _sessions(frame):
    from pyspark.sql import functions as F

    return frame.group_by(F.session_window("dateTime", "3 seconds"), "bidder").agg(
        F.count("*").alias("n"), F.sum("price").alias("volume"), F.max("price").alias("top"))


def test_session_windows_with_watermark_equal_spark_in_update_and_append(spark, tmp_path):
    """Two waves (two runs: a restart between): the second holds late rows (their own session
    ended at the first wave's watermark: dropped, counted), rows that extend or merge open
    sessions, and NULL times (in no session, as Spark). The update sink equals Spark batch
    SQL over the rows kept; the append sink holds exactly the sessions the final watermark
    closed, each once."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline
    from headrace.testing.queries import batch_result, encode_entries, produce_entries, rows_equal

    first = _bids(1, 0, 30, 60) + [{"bidder": 1, "price": 7, "dateTime": BASE + dt.timedelta(
        seconds=30)}]  # watermark after it: 25 s
    late = _bids(2, 0, 21.9, 6)  # t + 3 s <= 25 s: late
    inside = _bids(3, 25.5, 29, 8)  # open sessions: extended, merged
    nulls = [{"bidder": 2, "price": 1, "dateTime": None}]
    second = _bids(4, 30, 50, 60)
    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    p = None
    for wave in (first, late + inside + nulls + second):
        produce_entries(root, "in", encode_entries("bid", wave))
        p = Pipeline(spark, root, name="sess", partitions=1, buckets=2, checkpoint_dir=ckpt)
        bid = p.read_queue("in", SCHEMAS)["bid"].with_watermark("dateTime", "5 seconds")
        _sessions(bid).write_shard("upd")
        _sessions(bid).write_shard("app", mode="append")
        p.run(until_idle=True, max_runs=1)
    assert p.metrics["late_rows"] == 2 * len(late)  # each session operator drops them
    kept = first + inside + nulls + second
    assert any(a["bidder"] == b["bidder"] and abs(a["dateTime"] - b["dateTime"])
               <= dt.timedelta(seconds=3) for a in inside for b in first)  # sessions extended

    def batch(frames):
        g = frames["bid"].groupBy(F.session_window("dateTime", "3 seconds"), "bidder").agg(
            F.count("*").alias("n"), F.sum("price").alias("volume"), F.max("price").alias("top"))
        return g.select(F.col("session_window.start").alias("session_window_start"),
                        F.col("session_window.end").alias("session_window_end"),
                        "bidder", "n", "volume", "top")

    expected = batch_result(spark, SCHEMAS, {"bid": kept}, batch)
    equal, why = rows_equal(p.read_shard("upd"), expected)
    assert equal, why
    wm = max(r["dateTime"] for r in kept if r["dateTime"] is not None) - dt.timedelta(seconds=5)
    closed = expected.filter(pc.less_equal(
        expected["session_window_end"], pc.cast(wm, expected.schema.field(
            "session_window_end").type)))
    assert 0 < closed.num_rows < expected.num_rows
    equal, why = rows_equal(p.read_shard("app"), closed)
    assert equal, why
    shard = p.persist.read_only("app").snapshot(p.persist.upper("app") - 1)
    assert set(shard["diff"].to_pylist()) == {1}  # each session once, never retracted


def test_session_window_definitions(spark, tmp_path):
    """Column names and order as Spark's (the struct as two columns), aliases, and what is
    refused when written: dynamic or month gaps, a time expression, two session windows,
    append without event time."""
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    p = Pipeline(spark, str(tmp_path / "s"), name="defs", checkpoint_dir=str(tmp_path / "ck"))
    bid = p.read_queue("in", SCHEMAS)["bid"]
    out = bid.group_by("bidder", F.session_window("dateTime", "1 minute")).agg(F.count("*"))
    assert out.columns == ["bidder", "session_window_start", "session_window_end", "count(1)"]
    aliased = bid.group_by(F.session_window("dateTime", "1 day 2 hours").alias("s")).agg(
        F.avg("price"))
    assert aliased.columns == ["s_start", "s_end", "avg(price)"]
    assert aliased.node.params["gap_us"] == 26 * 3600 * SEC
    sql = bid.group_by(F.expr("session_window(dateTime, '10 seconds')")).count()
    assert sql.columns == ["session_window_start", "session_window_end", "count"]
    bad = [
        (F.session_window("dateTime", F.when(F.col("price") > 1, "5 seconds")
                          .otherwise("1 second")), "not a constant"),
        (F.session_window("dateTime", "1 month"), "months"),
        (F.session_window(F.col("dateTime") + F.expr("INTERVAL 1 SECOND"), "1 minute"),
         "expression"),
        (F.session_window("dateTime", "-5 seconds"), "not positive"),
    ]
    for key, needle in bad:
        with pytest.raises(InvalidInput, match=needle):
            bid.group_by(key).count()
    with pytest.raises(InvalidInput):
        bid.group_by(F.session_window("dateTime", "1 minute"),
                     F.session_window("dateTime", "2 minutes")).count()
    with pytest.raises(InvalidInput, match="append"):
        out.write_shard("x", mode="append")  # no watermark: no session is ever final
    assert out.node.expiry is None
