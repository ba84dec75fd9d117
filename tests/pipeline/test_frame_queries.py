"""The fluent API against Spark batch SQL: every query family, written once in headrace's API
and once in PySpark, over the same rows (inserts, then retractions and more inserts in a second
run of the pipeline), must give the same rows, value for value.

One pipeline holds every query (one sink each), so the whole differential costs two runs; its
two tables come from two queues."""

from __future__ import annotations

import datetime as dt
import decimal
import random

import pytest

from headrace.errors import InvalidInput
from headrace.testing.queries import (
    batch_result,
    encode_entries,
    produce_entries,
    rows_equal,
)

pytestmark = pytest.mark.spark

SCHEMAS = {"bid": "auction long, bidder long, price long, dateTime timestamp, channel string",
           "auction": "id long, seller long, category long, reserve double",
           "typed": "k int, amount decimal(12,2), day date, ratio float, blob binary, "
                    "flag boolean"}
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _rows(seed: int):
    rnd = random.Random(seed)
    bids = [{"auction": rnd.choice([1, 2, 3, 4, 5, 6, None]), "bidder": rnd.randint(1, 9),
             "price": rnd.choice([None, rnd.randint(1, 3000), rnd.randint(1, 60)]),
             "dateTime": BASE + dt.timedelta(milliseconds=rnd.randint(0, 40_000)),
             "channel": rnd.choice(["web", "app", None])} for _ in range(160)]
    auctions = [{"id": i, "seller": rnd.randint(1, 3), "category": rnd.choice([1, 2, None]),
                 "reserve": rnd.choice([0.0, -0.0, float("nan"), 10.5, None])}
                for i in (1, 2, 3, 4, 7)]
    typed = [{"k": rnd.randint(-2, 5), "amount": rnd.choice([None, decimal.Decimal(
                  f"{rnd.randint(-99999, 99999)}.{rnd.randint(0, 99):02d}")]),
              "day": dt.date(2026, 1, rnd.randint(1, 3)), "ratio": rnd.choice([0.5, -0.0, 2.25]),
              "blob": rnd.choice([b"\x00\x1f", b"", None, b"\xff" * 3]),
              "flag": rnd.choice([True, False, None])} for _ in range(40)]
    return bids, auctions, typed


def _f():
    from pyspark.sql import functions as F

    return F


def _window_cols(df):
    F = _f()
    return df.select(F.col("window.start").alias("window_start"),
                     F.col("window.end").alias("window_end"),
                     *[c for c in df.columns if c != "window"])


def _aggs():
    F = _f()
    return [F.count("*").alias("n"), F.count("price").alias("np"), F.sum("price").alias("s"),
            F.avg("price").alias("a"), F.min("price").alias("lo"), F.max("price").alias("hi"),
            F.count_distinct("bidder").alias("d")]


# name -> (headrace query over {table: Frame}, the same query in PySpark over DataFrames)
QUERIES = {
    "filter_select": (
        lambda s: s["bid"].filter(_f().col("price") > 100).select(
            "auction", (_f().col("price") * 2).alias("p2"), "channel"),
        lambda s: s["bid"].filter(_f().col("price") > 100).select(
            "auction", (_f().col("price") * 2).alias("p2"), "channel")),
    "sql_strings": (
        lambda s: s["bid"].filter("price < 50 OR channel = 'app'").with_column(
            "half", "price / 2").drop("dateTime"),
        lambda s: s["bid"].filter("price < 50 OR channel = 'app'").withColumn(
            "half", _f().expr("price / 2")).drop("dateTime")),
    "union": (
        lambda s: s["bid"].select("auction", "price").union(
            s["bid"].filter(_f().col("price") < 50).select("auction", "price")),
        lambda s: s["bid"].select("auction", "price").unionByName(
            s["bid"].filter(_f().col("price") < 50).select("auction", "price"))),
    "group_by_all_functions": (
        lambda s: s["bid"].group_by("auction").agg(*_aggs()),
        lambda s: s["bid"].groupBy("auction").agg(*_aggs())),
    "global_aggregate": (
        lambda s: s["bid"].agg(_f().count("*").alias("n"), _f().sum("price").alias("s"),
                               _f().max("dateTime").alias("last")),
        lambda s: s["bid"].agg(_f().count("*").alias("n"), _f().sum("price").alias("s"),
                               _f().max("dateTime").alias("last"))),
    "expression_arguments_and_default_names": (
        lambda s: s["bid"].group_by("channel").agg(_f().sum(_f().col("price") * 2),
                                                   _f().max("bidder")),
        lambda s: s["bid"].groupBy("channel").agg(_f().sum(_f().col("price") * 2),
                                                  _f().max("bidder"))),
    "tumbling_window": (
        lambda s: s["bid"].group_by(_f().window("dateTime", "10 seconds"), "auction").agg(
            _f().count("*").alias("n"), _f().max("price").alias("top")),
        lambda s: _window_cols(s["bid"].groupBy(_f().window("dateTime", "10 seconds"),
                                                "auction").agg(
            _f().count("*").alias("n"), _f().max("price").alias("top")))),
    "hopping_window": (
        lambda s: s["bid"].group_by(_f().window("dateTime", "10 seconds", "5 seconds")).agg(
            _f().count("*").alias("n")),
        lambda s: _window_cols(s["bid"].groupBy(
            _f().window("dateTime", "10 seconds", "5 seconds")).agg(_f().count("*").alias("n")))),
    "inner_join_then_select": (
        lambda s: s["bid"].join(s["auction"], left_on="auction", right_on="id").select(
            "auction", "price", "seller"),
        lambda s: s["bid"].join(s["auction"], s["bid"].auction == s["auction"].id).select(
            "auction", "price", "seller")),
    "full_join": (
        lambda s: s["bid"].join(s["auction"], left_on="auction", right_on="id", how="full"),
        lambda s: s["bid"].join(s["auction"], s["bid"].auction == s["auction"].id, "full")),
    "left_anti_join": (
        lambda s: s["bid"].join(s["auction"], left_on="auction", right_on="id",
                                how="left_anti"),
        lambda s: s["bid"].join(s["auction"], s["bid"].auction == s["auction"].id,
                                "left_anti")),
    "all_types_passthrough": (
        lambda s: s["typed"].filter("k > 0"),
        lambda s: s["typed"].filter("k > 0")),
    "all_types_grouped": (
        lambda s: s["typed"].group_by("day", "flag").agg(
            _f().sum("amount").alias("total"), _f().max("ratio").alias("top"),
            _f().count("blob").alias("blobs"), _f().min("blob").alias("first_blob"),
            _f().count_distinct("amount").alias("amounts")),
        lambda s: s["typed"].groupBy("day", "flag").agg(
            _f().sum("amount").alias("total"), _f().max("ratio").alias("top"),
            _f().count("blob").alias("blobs"), _f().min("blob").alias("first_blob"),
            _f().count_distinct("amount").alias("amounts"))),
    "distinct": (
        lambda s: s["bid"].select("auction", "channel").distinct(),
        lambda s: s["bid"].select("auction", "channel").distinct()),
    "join_then_aggregate_then_aggregate": (
        lambda s: s["bid"].join(s["auction"], left_on="auction", right_on="id")
        .group_by("category").agg(_f().max("price").alias("top"))
        .agg(_f().avg("top").alias("avg_top"), _f().count("*").alias("groups")),
        lambda s: s["bid"].join(s["auction"], s["bid"].auction == s["auction"].id)
        .groupBy("category").agg(_f().max("price").alias("top"))
        .agg(_f().avg("top").alias("avg_top"), _f().count("*").alias("groups"))),
}


@pytest.fixture(scope="module")
def results(spark, tmp_path_factory):
    """Run every query in one pipeline over two waves; the batch rows are the net input."""
    from headrace.pipeline import Pipeline

    root = str(tmp_path_factory.mktemp("frames") / "store")
    ckpt = str(tmp_path_factory.mktemp("frames-ck"))
    bids, auctions, typed = _rows(7)
    more_bids, _, more_typed = _rows(8)
    gone_bids, gone_auctions = bids[:40], auctions[:1]
    # bids and auctions come from two queues: one pipeline reads both
    waves = [(encode_entries("bid", bids) + encode_entries("typed", typed),
              encode_entries("auction", auctions)),
             (encode_entries("bid", gone_bids, weight=-1) + encode_entries("bid", more_bids[:60])
              + encode_entries("typed", typed[:10], weight=-1)
              + encode_entries("typed", more_typed[:10]),
              encode_entries("auction", gone_auctions, weight=-1))]
    p = None
    for bid_entries, auction_entries in waves:
        produce_entries(root, "bids", bid_entries)
        produce_entries(root, "auctions", auction_entries)
        p = Pipeline(spark, root, name="frames", partitions=2, buckets=4, checkpoint_dir=ckpt)
        src = {**p.read_queue("bids", {"bid": SCHEMAS["bid"], "typed": SCHEMAS["typed"]}),
               **p.read_queue("auctions", {"auction": SCHEMAS["auction"]})}
        for name, (query, _) in QUERIES.items():
            query(src).write_shard(name)
        p.run(until_idle=True, max_runs=1)
    net = {"bid": bids[40:] + more_bids[:60], "auction": auctions[1:],
           "typed": typed[10:] + more_typed[:10]}
    return p, net


@pytest.mark.parametrize("name", list(QUERIES))
def test_query_equals_spark_batch(spark, results, name):
    p, net = results
    streamed = p.read_shard(name)
    batch = batch_result(spark, SCHEMAS, net, QUERIES[name][1])
    equal, why = rows_equal(streamed, batch)
    assert equal, f"{name}: {why}"


def test_definition_errors_are_clear(spark, tmp_path):
    from headrace.pipeline import Pipeline

    F = _f()
    p = Pipeline(spark, str(tmp_path / "s"), name="bad", checkpoint_dir=str(tmp_path / "ck"))
    bid = p.read_queue("bids", SCHEMAS)["bid"]
    with pytest.raises(InvalidInput, match="nope"):
        bid.filter(F.col("nope") > 1)
    with pytest.raises(InvalidInput, match="not supported"):
        bid.group_by("auction").agg(F.stddev("price"))
    with pytest.raises(InvalidInput, match="reserved prefix"):
        bid.with_column("__hr_x", F.lit(1))
    with pytest.raises(InvalidInput, match="type the pipeline does not carry"):
        bid.with_column("arr", F.array("price"))
    with pytest.raises(InvalidInput, match="union"):
        bid.union(bid.select("auction"))
    with pytest.raises(InvalidInput, match="time"):
        bid.select(F.col("price").alias("time")).write_shard("x")
