"""Join with a dead-letter table: orders joined with customers, revenue per region, while
malformed queue entries go to the pipeline's dead-letter shard instead of stopping it.

    python examples/join_dead_letter.py [STORE]

STORE is a new (or empty) local folder, or an s3://… URL; without it, a new temporary folder.
With the default ``on_bad_entry="fail"`` the same input would stop the first micro-batch,
naming the bad entry; ``"dead_letter"`` keeps each one (raw bytes, queue position, table, field,
reason) in the ``<pipeline>.dead_letter`` shard and counts it in ``metrics["bad_entries"]``.
"""

from __future__ import annotations

import json
import sys

from headrace.buffer import Producer, ProducerConfig
from headrace.spark import Pipeline, new_store, session

REGIONS = ["emea", "amer", "apac"]
CUSTOMERS = [{"customer_id": c, "region": REGIONS[c % 3]} for c in range(10)]
# customers 10 and 11 never arrive: an inner join leaves their orders out
ORDERS = [{"order_id": i, "customer_id": i % 12, "amount": 5 + i % 9} for i in range(120)]
BAD = [
    b"order 121: 7 EUR",  # not JSON
    b'{"table": "orders", "order_id": "122", "customer_id": 1, "amount": 3}',  # wrong type
    b'{"table": "orders", "order_id": 123, "amount": 3}',  # no customer_id
    b'{"table": "refunds", "order_id": 3, "amount": 8}',  # a table the pipeline does not read
]




def produce(root: str) -> None:
    good = ([json.dumps({"table": "customers", **c}).encode() for c in CUSTOMERS]
            + [json.dumps({"table": "orders", **o}).encode() for o in ORDERS])
    entries = good[:50] + BAD + good[50:]  # bad entries in the middle of good ones
    cfg = ProducerConfig(url=root, data_path_prefix="shop", manifest_path="shop/manifest")
    with Producer(cfg) as producer:
        producer.produce(entries).watcher.await_durable(timeout=60)


def main() -> None:
    root = new_store(sys.argv[1] if len(sys.argv) > 1 else None)
    spark = session("headrace-example")
    produce(root)
    p = Pipeline(spark, root, name="sales", partitions=2, on_bad_entry="dead_letter")
    src = p.read_queue("shop", {"orders": "order_id long, customer_id long, amount long",
                                "customers": "customer_id long, region string"})
    enriched = p.join(src["orders"], src["customers"], on=["customer_id"], name="enriched")
    totals = p.aggregate(enriched, by=["region"],
                         aggs={"orders": "count", "revenue": "sum(amount)"}, name="totals")
    p.write_shard(totals, "region_revenue")
    p.run(until_idle=True)

    rows = sorted((r["region"], r["orders"], r["revenue"])
                  for r in p.read_shard("region_revenue").to_pylist())
    for region, n, revenue in rows:
        print(f"{region}: {n} orders, revenue {revenue}")
    spark.createDataFrame([tuple(o.values()) for o in ORDERS],
                          "order_id long, customer_id long, amount long") \
         .createOrReplaceTempView("orders")
    spark.createDataFrame([tuple(c.values()) for c in CUSTOMERS],
                          "customer_id long, region string").createOrReplaceTempView("customers")
    expected = sorted(tuple(r) for r in spark.sql(
        "SELECT region, count(*), sum(amount) FROM orders JOIN customers USING (customer_id) "
        "GROUP BY region").collect())
    assert rows == expected, f"pipeline {rows} != Spark batch SQL {expected}"
    print("same as Spark batch SQL")

    # the dead-letter shard is a table like any output: here read through Spark
    dead = (spark.read.format("headrace.shard").option("url", root)
            .option("shard", "sales.dead_letter").load().orderBy("sequence", "index").collect())
    print(f"dead letters: {len(dead)} (metrics: {int(p.metrics['bad_entries'])} bad entries)")
    for d in dead:
        print(f"  queue sequence {d['sequence']} entry {d['index']}: table={d['table']} "
              f"field={d['field']} reason={d['reason']!r} entry={bytes(d['entry'])!r}")
    assert sorted(bytes(d["entry"]) for d in dead) == sorted(BAD)
    assert p.metrics["bad_entries"] == len(BAD)
    spark.stop()


if __name__ == "__main__":
    main()
