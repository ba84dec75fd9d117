"""Ingest + aggregate: producers write orders into a queue, a pipeline keeps revenue per region.

    python examples/ingest_aggregate.py [STORE]

STORE is a new (or empty) local folder, or an s3://… URL; without it, a new temporary folder.
The result is checked against the same query in Spark batch SQL over the net input.
"""

from __future__ import annotations

import json
import sys

from headrace.buffer import Producer, ProducerConfig
from headrace.spark import Pipeline, new_store, session

REGIONS = ["emea", "amer", "apac"]
ORDERS = [{"order_id": i, "region": REGIONS[i % 3], "amount": 10 * (i % 7)} for i in range(300)]
RETRACTED = ORDERS[7]  # sent again with weight -1: the order is cancelled




def produce(root: str) -> None:
    entries = [{"table": "orders", **o} for o in ORDERS]
    entries.append({"table": "orders", **RETRACTED, "w": -1})
    with Producer(ProducerConfig(url=root, manifest_path="ingest/manifest")) as producer:
        handle = producer.produce([json.dumps(e).encode() for e in entries])
        handle.watcher.await_durable(timeout=60)  # durable: the pipeline will see them


def main() -> None:
    root = new_store(sys.argv[1] if len(sys.argv) > 1 else None)
    spark = session("headrace-example")
    produce(root)
    p = Pipeline(spark, root, name="revenue", partitions=2)
    src = p.read_queue("ingest", {"orders": "order_id long, region string, amount long"})
    totals = p.aggregate(src["orders"], by=["region"],
                         aggs={"orders": "count", "revenue": "sum(amount)",
                               "biggest": "max(amount)"}, name="totals")
    p.write_shard(totals, "region_revenue")
    p.run(until_idle=True)
    rows = sorted((r["region"], r["orders"], r["revenue"], r["biggest"])
                  for r in p.read_shard("region_revenue").to_pylist())
    for region, n, revenue, biggest in rows:
        print(f"{region}: {n} orders, revenue {revenue}, biggest {biggest}")

    net = [tuple(o.values()) for o in ORDERS if o is not RETRACTED]
    spark.createDataFrame(net, "order_id long, region string, amount long") \
         .createOrReplaceTempView("orders")
    expected = sorted(tuple(r) for r in spark.sql(
        "SELECT region, count(*), sum(amount), max(amount) FROM orders GROUP BY region").collect())
    assert rows == expected, f"pipeline {rows} != Spark batch SQL {expected}"
    print("same as Spark batch SQL")
    spark.stop()


if __name__ == "__main__":
    main()
