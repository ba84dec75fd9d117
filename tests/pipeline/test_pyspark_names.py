"""A PySpark user's habits on headrace's Frame: the guide's queries written as PySpark code
(camelCase, ``F.col``, ``df["col"]``/``df.col``, a Column join condition, ``groupBy().agg``,
``withWatermark``) run unchanged, each one *function* applied both to headrace Frames (streamed,
over inserts, then retractions and more inserts) and to Spark DataFrames (batch SQL over the net
rows), with equal results; and what headrace cannot do the same way is refused clearly."""

from __future__ import annotations

import datetime as dt
import random
import time

import pytest

from headrace.errors import InvalidInput
from headrace.testing.queries import (
    batch_result,
    encode_entries,
    produce_entries,
    rows_equal,
)

pytestmark = pytest.mark.spark

SCHEMAS = {"bid": "auction long, bidder long, price long, dateTime timestamp",
           "auction": "id long, seller long, category long",
           "click": "user long, url string, ts timestamp"}
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _rows(seed: int, t0: int):
    rnd = random.Random(seed)
    bids = [{"auction": rnd.choice([1, 2, 3, 4, 5, None]), "bidder": rnd.randint(1, 6),
             "price": rnd.choice([None, rnd.randint(1, 3000)]),
             "dateTime": BASE + dt.timedelta(seconds=rnd.randint(0, 60))} for _ in range(80)]
    auctions = [{"id": i, "seller": rnd.randint(1, 6), "category": rnd.choice([1, 2, None])}
                for i in (1, 2, 3, 4, 9)]
    # clicks only move forward in time across waves: no row is late for the watermark, so the
    # windows' update-mode result is the batch result over every row
    clicks = [{"user": rnd.randint(1, 4), "url": rnd.choice(["/a", "/b", None]),
               "ts": BASE + dt.timedelta(milliseconds=rnd.randint(t0, t0 + 30_000))}
              for _ in range(60)]
    return bids, auctions, clicks


def _F():
    from pyspark.sql import functions as F

    return F


def _per_auction(bid):
    F = _F()
    return bid.groupBy("auction").agg(F.count("*").alias("bids"), F.max("price").alias("top"),
                                      F.count_distinct("bidder").alias("bidders"))


def _window_struct_to_columns(df):
    """Spark's ``window`` struct as headrace's ``window_start``/``window_end`` (the one
    documented difference of a windowed aggregate's output)."""
    F = _F()
    return df.select(F.col("window.start").alias("window_start"),
                     F.col("window.end").alias("window_end"),
                     *[c for c in df.columns if c != "window"])


# name -> the query, as a PySpark user writes it; applied as is to Frames and to DataFrames
QUERIES = {
    "filter_withColumn_selectExpr": lambda s: s["bid"]
        .filter(s["bid"]["price"] > 1000).withColumn("euro", _F().col("price") * 0.908)
        .selectExpr("auction", "euro * 2 AS two_euro", "bidder")
        .withColumnRenamed("bidder", "who"),
    "attribute_columns_and_chained_steps": lambda s: s["bid"]
        .filter(s["bid"].price.isNotNull()).select(s["bid"].auction, (s["bid"].price * 2)
                                                   .alias("p2"), s["bid"].price + 1),
    "groupBy_agg": lambda s: _per_auction(s["bid"]),
    "groupby_sum": lambda s: s["bid"].groupby("bidder").sum("price"),
    "column_join_condition_then_select": lambda s: s["bid"]
        .join(s["auction"], s["bid"]["auction"] == s["auction"]["id"])
        .select("auction", "price", "seller"),
    "two_key_left_join": lambda s: s["bid"]
        .join(s["auction"], (s["bid"].auction == s["auction"].id)
              & (s["auction"].seller == s["bid"].bidder), "left"),
    "semi_join_on_aggregate": lambda s: s["bid"]
        .join(_per_auction(s["bid"]).withColumnRenamed("auction", "a"),
              [s["bid"].auction == _F().col("a"), s["bid"].price == _F().col("top")],
              "left_semi"),
    "unionByName_dropDuplicates": lambda s: s["bid"].select("auction", "bidder")
        .unionByName(s["bid"].filter(_F().col("price") < 500).select("bidder", "auction"))
        .dropDuplicates(),
    "withWatermark_window": lambda s: s["click"]
        .withWatermark("ts", "5 seconds")
        .groupBy(_F().window(s["click"]["ts"], "10 seconds"), "user")
        .agg(_F().count("*").alias("clicks"), _F().count_distinct("url").alias("urls")),
}
BATCH_ONLY = {"withWatermark_window": _window_struct_to_columns}


@pytest.fixture(scope="module")
def streamed(spark, tmp_path_factory):
    """Every query in one pipeline over two waves (two runs); the net rows for the batch."""
    from headrace.pipeline import Pipeline

    root = str(tmp_path_factory.mktemp("pyspark-names") / "store")
    ckpt = str(tmp_path_factory.mktemp("pyspark-names-ck"))
    bids, auctions, clicks = _rows(3, 0)
    more_bids, _, more_clicks = _rows(4, 30_000)
    waves = [encode_entries("bid", bids) + encode_entries("auction", auctions)
             + encode_entries("click", clicks),
             encode_entries("bid", bids[:20], weight=-1) + encode_entries("bid", more_bids[:30])
             + encode_entries("auction", auctions[:1], weight=-1)
             + encode_entries("click", more_clicks)]
    p = None
    for wave in waves:
        produce_entries(root, "in", wave)
        p = Pipeline(spark, root, name="pyspark", partitions=2, buckets=4, checkpoint_dir=ckpt)
        frames = p.read_queue("in", SCHEMAS)
        for name, query in QUERIES.items():
            query(frames).write_shard(name)
        p.run(until_idle=True, max_runs=1)
    net = {"bid": bids[20:] + more_bids[:30], "auction": auctions[1:],
           "click": clicks + more_clicks}
    return p, net


@pytest.mark.parametrize("name", list(QUERIES))
def test_pyspark_code_equals_spark_batch(spark, streamed, name):
    p, net = streamed
    query = QUERIES[name]
    batch = batch_result(spark, SCHEMAS, net,
                         lambda s: BATCH_ONLY.get(name, lambda df: df)(query(s)))
    got = p.read_shard(name)
    equal, why = rows_equal(got, batch)
    assert equal, f"{name}: {why}"
    assert batch.num_rows > 0, f"{name}: the data exercises nothing"


def _frames(spark, tmp_path):
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, str(tmp_path / "s"), name="defs", checkpoint_dir=str(tmp_path / "ck"))
    return p, p.read_queue("in", SCHEMAS)


def test_camel_case_names_are_the_snake_case_methods():
    from headrace.pipeline.api.frame import Frame, GroupedFrame
    from headrace.pipeline.api.query import PipelineQuery

    for camel, snake in [("withColumn", "with_column"), ("withColumnRenamed",
                         "with_column_renamed"), ("selectExpr", "select_expr"),
                         ("groupBy", "group_by"), ("groupby", "group_by"),
                         ("withWatermark", "with_watermark"), ("dropDuplicates",
                         "drop_duplicates"), ("unionByName", "union_by_name"),
                         ("unionAll", "union"), ("where", "filter")]:
        assert getattr(Frame, camel) is getattr(Frame, snake), camel
    assert GroupedFrame.mean is GroupedFrame.avg
    assert PipelineQuery.isActive is PipelineQuery.is_active
    assert PipelineQuery.lastProgress is PipelineQuery.last_progress


def test_columns_by_name_and_attribute(spark, tmp_path):
    from pyspark.sql import Column
    from pyspark.sql import types as T

    _, s = _frames(spark, tmp_path)
    bid = s["bid"]
    assert isinstance(bid["price"], Column) and isinstance(bid.price, Column)
    assert str(bid[2]) == str(bid["price"])
    assert bid[["auction", "price"]].columns == ["auction", "price"]
    assert bid[bid.price > 10].columns == bid.columns
    with pytest.raises(InvalidInput, match=r"no column 'nope'.*\['auction', 'bidder', 'price'"):
        bid["nope"]
    with pytest.raises(InvalidInput, match=r"'nope'.*\['auction', 'bidder', 'price'"):
        bid.nope  # noqa: B018
    with pytest.raises(AttributeError):  # so hasattr and copies keep working
        bid.nope  # noqa: B018
    assert not hasattr(bid, "nope") and bid.name == "in.bid"  # methods come first
    # a frame's Column works along its chain of stateless steps, not past a stateful one
    assert bid.filter(bid.price > 1).select(bid.auction).columns == ["auction"]
    with pytest.raises(InvalidInput, match="does not come from it by stateless steps"):
        _per_auction(bid).filter(bid.price > 1)
    # the schema: Arrow's stays (the planning code reads it); Spark's beside it
    assert bid.schema.names == bid.columns and bid.schema.field("price").type.bit_width == 64
    assert bid.spark_schema == T.StructType([
        T.StructField("auction", T.LongType()), T.StructField("bidder", T.LongType()),
        T.StructField("price", T.LongType()), T.StructField("dateTime", T.TimestampType())])
    assert bid.dtypes == [("auction", "bigint"), ("bidder", "bigint"), ("price", "bigint"),
                          ("dateTime", "timestamp")]


def test_print_schema_prints_sparks_tree(spark, tmp_path, capsys):
    _, s = _frames(spark, tmp_path)
    s["click"].printSchema()
    assert capsys.readouterr().out == ("root\n |-- user: long (nullable = true)\n"
                                       " |-- url: string (nullable = true)\n"
                                       " |-- ts: timestamp (nullable = true)\n")


def test_join_conditions_other_than_equi_conjunctions_are_refused(spark, tmp_path):
    F = _F()
    _, s = _frames(spark, tmp_path)
    bid, auc = s["bid"], s["auction"]
    eq = bid.auction == auc.id
    for cond, says in [(bid.price > auc.id, "is not an equality"),
                       (eq | (bid.bidder == auc.seller), "is not an equality"),
                       (eq & (bid.price < auc.seller), "is not an equality"),
                       (bid.auction.eqNullSafe(auc.id), "<=>"),
                       ((bid.auction + 1) == auc.id, "expression"),
                       (bid.auction == bid.bidder, "same side"),
                       (F.col("nope") == auc.id, "nope")]:
        with pytest.raises(InvalidInput, match=says) as err:
            bid.join(auc, cond)
        assert "equalities between one column of each side" in str(err.value) or says == "nope"
    with pytest.raises(InvalidInput, match="another frame"):
        bid.join(auc, _per_auction(bid)["auction"] == auc.id)
    with pytest.raises(InvalidInput, match="same frame"):
        bid.join(bid.filter("price > 1"), bid.auction == bid.bidder)
    with pytest.raises(InvalidInput, match="different types"):
        bid.join(s["click"], bid.auction == s["click"].url)
    per_auction = _per_auction(bid)
    with pytest.raises(InvalidInput, match=r"both sides have column\(s\) \['auction'\]"):
        bid.join(per_auction, bid.auction == per_auction.auction)


def test_union_and_drop_duplicates_refuse_what_differs_from_spark(spark, tmp_path):
    _, s = _frames(spark, tmp_path)
    bid = s["bid"]
    two = bid.select("auction", "price")
    with pytest.raises(InvalidInput, match=r"unionByName.*lacks column\(s\) \['price'\].*extra "
                                           r"column\(s\) \['bidder'\]"):
        two.unionByName(bid.select("auction", "bidder"))
    padded = two.unionByName(bid.select("bidder", "auction"), allowMissingColumns=True)
    assert padded.columns == ["auction", "price", "bidder"]
    with pytest.raises(InvalidInput, match="cast"):
        two.unionByName(s["click"].select(s["click"].url.alias("auction"), "user")
                        .withColumnRenamed("user", "price"))
    with pytest.raises(InvalidInput, match="by position.*unionByName"):
        two.union(bid.select("price", "auction"))
    with pytest.raises(InvalidInput, match=r"dropDuplicates.*arbitrary row.*distinct"):
        bid.dropDuplicates(["auction"])
    with pytest.raises(InvalidInput, match="no column"):
        bid.dropDuplicates(["nope"])
    assert bid.dropDuplicates(["price", "auction", "bidder", "dateTime"]).columns == bid.columns


def test_started_pipeline_has_streaming_query_names(spark, tmp_path):
    root = str(tmp_path / "store")
    produce_entries(root, "in", encode_entries("click", [
        {"user": i % 2, "url": "/a", "ts": BASE} for i in range(6)]))
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name="named", partitions=2, buckets=2,
                 checkpoint_dir=str(tmp_path / "ck"))
    c = p.read_queue("in", SCHEMAS)["click"]
    c.groupBy("user").count().write_shard("per_user")
    q = p.start(processing_time="500 milliseconds")
    try:
        assert q.name == "named" and q.exception() is None
        assert q.awaitTermination(0.1) is False and q.isActive
        deadline = time.monotonic() + 120
        while q.lastProgress is None and time.monotonic() < deadline and q.isActive:
            time.sleep(0.2)
        assert q.lastProgress is not None and q.lastProgress["input_rows"] == 6
        assert q.recentProgress == list(q.recent_progress) and isinstance(q.recentProgress, list)
    finally:
        q.stop()
    assert not q.isActive and q.awaitTermination() is None and q.exception() is None
    assert sorted((r["user"], r["count"]) for r in p.read_shard("per_user").to_pylist()) == \
        [(0, 3), (1, 3)]
