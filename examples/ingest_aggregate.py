"""Ingest + aggregate: producers write orders into a queue, a pipeline keeps revenue per region.

    python examples/ingest_aggregate.py [STORE_DIR]     (default ./example-data)

Runs on a local folder as the object store; give an s3://… URL to run on S3 instead.
"""

from __future__ import annotations

import json
import sys

from headrace.buffer import Producer, ProducerConfig
from headrace.spark import Pipeline, session


def produce(root: str) -> None:
    orders = [{"table": "orders", "order_id": i, "region": ["emea", "amer", "apac"][i % 3],
               "amount": 10 * (i % 7)} for i in range(300)]
    orders.append({"table": "orders", "order_id": 7, "region": "amer", "amount": 0, "w": -1})
    with Producer(ProducerConfig(url=root, manifest_path="ingest/manifest")) as producer:
        handle = producer.produce([json.dumps(o).encode() for o in orders])
        handle.watcher.await_durable(timeout=60)


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else "example-data"
    spark = session("headrace-example")
    produce(root)
    p = Pipeline(spark, root, name="revenue", partitions=2)
    src = p.read_queue("ingest", {"orders": "order_id long, region string, amount long"})
    totals = p.aggregate(src["orders"], by=["region"],
                         aggs={"orders": "count", "revenue": "sum(amount)",
                               "biggest": "max(amount)"}, name="totals")
    p.write_shard(totals, "region_revenue")
    p.run(until_idle=True)
    for row in sorted(p.read_shard("region_revenue").to_pylist(), key=lambda r: r["region"]):
        print(f"{row['region']}: {row['orders']} orders, revenue {row['revenue']}, "
              f"biggest {row['biggest']}")
    spark.stop()


if __name__ == "__main__":
    main()
