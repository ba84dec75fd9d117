"""Windowed aggregate with a watermark: bids per auction per 10-second window, each window
written once, when it is final (an append sink), late bids dropped and counted.

    python examples/windowed_aggregate.py [STORE]

STORE is a new (or empty) local folder, or an s3://… URL; without it, a new temporary folder.
Two waves of bids: the second holds three bids whose windows the first wave's watermark has
already closed (late: dropped, as Spark drops them). The append shard is checked against Spark
batch SQL over the bids that were not late, restricted to the windows the final watermark
closed.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from pyspark.sql import functions as F

from headrace.buffer import Producer, ProducerConfig
from headrace.spark import Pipeline, new_store, session

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DELAY_S = 5
SCHEMA = "auction long, price long, dateTime timestamp"


def bid(i: int, second: float) -> dict:
    return {"table": "bid", "auction": i % 3, "price": 10 + (7 * i) % 90,
            "dateTime": (T0 + dt.timedelta(seconds=second)).isoformat()}


WAVE1 = [bid(i, i * 0.5) for i in range(60)]  # 0 s .. 29.5 s: watermark 24.5 s after it
LATE = [bid(i, 3 + i) for i in range(3)]  # windows [0, 10) end before 24.5 s: late
WAVE2 = [bid(i, 30 + (i - 60) * 0.5) for i in range(60, 100)]  # 30 s .. 49.5 s




def produce(root: str, entries: list[dict]) -> None:
    cfg = ProducerConfig(url=root, data_path_prefix="bids", manifest_path="bids/manifest")
    with Producer(cfg) as producer:
        producer.produce([json.dumps(e).encode() for e in entries]).watcher.await_durable(
            timeout=60)


def build(spark, root: str) -> Pipeline:
    p = Pipeline(spark, root, name="hot", partitions=2)
    bids = p.read_queue("bids", {"bid": SCHEMA})["bid"]
    per_window = (bids.with_watermark("dateTime", f"{DELAY_S} seconds")
                  .group_by(F.window("dateTime", "10 seconds"), "auction")
                  .agg(F.count("*").alias("bids"), F.max("price").alias("top")))
    per_window.write_shard("bids_per_window", mode="append")
    return p


def main() -> None:
    root = new_store(sys.argv[1] if len(sys.argv) > 1 else None)
    spark = session("headrace-example")
    late = 0
    for wave in (WAVE1, LATE + WAVE2):
        produce(root, wave)
        p = build(spark, root)  # a new driver per wave: the pipeline resumes where it was
        p.run(until_idle=True)
        late += int(p.metrics["late_rows"])
    out = p.read_shard("bids_per_window").sort_by([("window_start", "ascending"),
                                                    ("auction", "ascending")])
    for r in out.to_pylist():
        print(f"window {r['window_start']:%H:%M:%S}-{r['window_end']:%H:%M:%S} auction "
              f"{r['auction']}: {r['bids']} bids, top {r['top']}")
    print(f"late bids dropped: {late}")
    kept = WAVE1 + WAVE2  # the late bids are not in the result
    rows = [(b["auction"], b["price"], dt.datetime.fromisoformat(b["dateTime"])) for b in kept]
    final = max(r[2] for r in rows) - dt.timedelta(seconds=DELAY_S)
    batch = (spark.createDataFrame(rows, SCHEMA)
             .groupBy(F.window("dateTime", "10 seconds"), "auction")
             .agg(F.count("*").alias("bids"), F.max("price").alias("top"))
             .filter(F.col("window.end") <= F.lit(final))
             .select(F.col("window.start").alias("window_start"), "auction", "bids", "top"))
    want = sorted((r["window_start"].replace(tzinfo=None), r["auction"], r["bids"], r["top"])
                  for r in batch.collect())
    got = sorted((r["window_start"].astimezone(dt.UTC).replace(tzinfo=None), r["auction"],
                  r["bids"], r["top"]) for r in out.to_pylist())
    if got != want or late != len(LATE):
        sys.exit(f"differs from Spark batch SQL: {got} vs {want}, late {late}")
    print("same as Spark batch SQL")
    spark.stop()


if __name__ == "__main__":
    main()
