"""A part added with ``write_shard(start="history")`` starts from the queue's retained history
(history.py): one Spark run with a crash between the history batch's commit and its link."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from test_pipeline_evolve import _rows  # noqa: I001  (tests/pipeline is on sys.path)

BID = "auction long, price long, dateTime timestamp"
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _timed(rows: list[dict], seed: int, lo_s: float, hi_s: float) -> list[dict]:
    """``rows`` with event times drawn from [lo_s, hi_s] seconds after BASE."""
    rnd = random.Random(seed)
    return [{**r, "dateTime": BASE + dt.timedelta(milliseconds=rnd.randint(int(lo_s * 1000),
                                                                          int(hi_s * 1000)))}
            for r in rows]

_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[3])  # tests/pipeline
from headrace.testing.spark import local_spark
from test_pipeline_history import _define
spark = local_spark("history-child", master="local[2]", shuffle_partitions=2)
p = _define(spark, sys.argv[1], sys.argv[2], grown=True)
link = p.driver.link_outputs
def link_then_die(outputs, t, shards):
    link(outputs, t, [s for s in shards if s[0] != "hi.big"])
    os.kill(os.getpid(), signal.SIGKILL)
p.driver.link_outputs = link_then_die
p.recover()
print("not killed", flush=True)
"""

pytestmark = pytest.mark.spark


def _define(spark, root: str, ckpt: str, *, grown: bool):
    """totals = count and sum per auction; grown: + big = count and max of bids > 1000 per
    auction, from the queue's history, a from-now sink of the big bids themselves, and win =
    an event-time part from the history: bids per 10-second window and auction behind a
    5-second watermark."""
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name="hi", partitions=2, buckets=4, checkpoint_dir=ckpt,
                 batches_per_trigger=1, retain_batches=1)
    bids = p.read_queue("in", {"bid": BID})["bid"]
    bids.group_by("auction").agg(F.count("*").alias("n"), F.sum("price").alias("s")) \
        .write_shard("hi.totals")
    if grown:
        big = bids.filter(F.col("price") > 1000)
        big.group_by("auction").agg(F.count("*").alias("n"), F.max("price").alias("top")) \
            .write_shard("hi.big", start="history")
        big.write_shard("hi.big_rows", start="now")
        bids.with_watermark("dateTime", "5 seconds") \
            .group_by(F.window("dateTime", "10 seconds"), "auction") \
            .agg(F.count("*").alias("n"), F.max("price").alias("top")) \
            .write_shard("hi.win", start="history")
    return p


def test_a_new_sink_starts_from_the_retained_history_exactly_once_across_a_crash(spark,
                                                                                 tmp_path):
    """Three queue batches run; the queue keeps the newest two (retain_batches=1, plus the
    run's last batch, which Spark acknowledges when the next run starts). A new aggregate
    with start='history' is added: its history batch replays those kept batches; the driver
    is SIGKILLed after the commit point, before the new shard's link. The restart links the
    replayed history once; then new input runs. The new shard equals batch SQL over the kept
    batch + the new input (the dequeued batch is not history), the old one over everything,
    the from-now sink over the new input only. The event-time part: no history row is late
    (the history is one batch), its watermark then comes from the history (~25 s), so new
    rows in windows ending by then are dropped and counted."""
    import os

    from pyspark.sql import functions as F

    from headrace.buffer import list_entries
    from headrace.persist import PersistClient
    from headrace.store import open_store
    from headrace.testing.queries import (
        batch_result,
        encode_entries,
        produce_entries,
        rows_equal,
    )
    from headrace.testing.spark import run_sigkilled_child

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    first = _timed(_rows(3, 60), 3, 0, 30)  # the history's largest event time: ~30 s
    late = _timed(_rows(5, 8), 5, 0, 14)  # windows [0,10) and [10,20): behind the watermark
    later = _timed(_rows(4, 60), 4, 30, 60)
    produce_entries(root, "in", encode_entries("bid", first[:20]))
    produce_entries(root, "in", encode_entries("bid", first[20:40]))
    produce_entries(root, "in", encode_entries("bid", first[40:])
                    + encode_entries("bid", first[40:45], weight=-1))
    _define(spark, root, ckpt, grown=False).run(until_idle=True)
    # batch 0 dequeued; batch 1 retained; batch 2, the run's last, is acked by the next run
    assert [e.sequence for e in list_entries(open_store(root), "in/manifest", None)] == [1, 2]

    # a child driver defines the grown pipeline and is SIGKILLed inside its history batch,
    # after the commit point, once every shard but the new one is linked
    run_sigkilled_child(_CHILD, root, ckpt, os.path.dirname(os.path.abspath(__file__)))
    persist = PersistClient(open_store(root))
    assert persist.upper("hi.progress") == persist.upper("hi.big") + 1
    assert persist.upper("hi.totals") == persist.upper("hi.progress")

    produce_entries(root, "in", encode_entries("bid", late + later))
    p = _define(spark, root, ckpt, grown=True)
    p.run(until_idle=True)
    assert p.metrics["replayed_batches"] == 1 and p.metrics["history_batches"] == 0
    assert p.metrics["late_rows"] == len(late)

    def per_auction(s):
        return s["bid"].groupBy("auction").agg(F.count("*").alias("n"),
                                               F.sum("price").alias("s"))

    def big(s):
        return s["bid"].filter(F.col("price") > 1000).groupBy("auction").agg(
            F.count("*").alias("n"), F.max("price").alias("top"))

    def big_rows(s):
        return s["bid"].filter(F.col("price") > 1000)

    def per_window(s):
        g = s["bid"].groupBy(F.window("dateTime", "10 seconds"), "auction").agg(
            F.count("*").alias("n"), F.max("price").alias("top"))
        return g.select(F.col("window.start").alias("window_start"),
                        F.col("window.end").alias("window_end"), "auction", "n", "top")

    net = first[:40] + first[45:] + late + later
    history = first[20:40] + first[45:]
    for shard, rows, query in (("hi.totals", net, per_auction),
                               ("hi.big", history + late + later, big),
                               ("hi.big_rows", late + later, big_rows),
                               ("hi.win", history + later, per_window)):
        equal, why = rows_equal(p.read_shard(shard), batch_result(spark, {"bid": BID},
                                                                  {"bid": rows}, query))
        assert equal, f"{shard}: {why}"
