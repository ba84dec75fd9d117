"""The demo workload: customers and orders with updates, joined and aggregated by region.

Used by ``headrace demo``, by the pipeline tests and by the benchmark. The event stream is a
pure function of its seed, so the expected result can be recomputed from scratch with plain
PySpark DataFrames (``expected_totals``) and compared with the pipeline's output shard.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pyarrow as pa

QUEUE = "ingest"
ORDERS = "order_id long, customer_id long, amount long"
CUSTOMERS = "customer_id long, region string"
REGIONS = ["emea", "amer", "apac", "latam", "anz"]
OUTPUT_SHARD = "region_totals"


@dataclass(frozen=True)
class DemoSpec:
    seed: int = 7
    customers: int = 200
    orders: int = 20_000
    update_every: int = 50  # one customer moves region every this many orders
    cancel_every: int = 40  # one order is cancelled (retracted) every this many orders


def generate_events(spec: DemoSpec) -> list[dict]:
    """Customers first, then orders interleaved with region moves and cancellations."""
    rng = random.Random(spec.seed)
    region = {c: rng.choice(REGIONS) for c in range(spec.customers)}
    events = [{"table": "customers", "w": 1, "customer_id": c, "region": r}
              for c, r in region.items()]
    placed = []
    for i in range(spec.orders):
        order = {"table": "orders", "w": 1, "order_id": i,
                 "customer_id": rng.randrange(spec.customers),
                 "amount": rng.randint(1, 500)}
        events.append(order)
        placed.append(order)
        if spec.update_every and i % spec.update_every == spec.update_every - 1:
            c = rng.randrange(spec.customers)
            new = rng.choice([r for r in REGIONS if r != region[c]])
            events.append({"table": "customers", "w": -1, "customer_id": c, "region": region[c]})
            events.append({"table": "customers", "w": 1, "customer_id": c, "region": new})
            region[c] = new
        if spec.cancel_every and i % spec.cancel_every == spec.cancel_every - 1:
            victim = placed[rng.randrange(len(placed))]
            if victim.get("cancelled"):
                continue
            victim["cancelled"] = True
            events.append({**{k: v for k, v in victim.items() if k != "cancelled"}, "w": -1})
    for e in events:
        e.pop("cancelled", None)
    return events


def encode(events: list[dict]) -> list[bytes]:
    return [json.dumps(e, separators=(",", ":")).encode() for e in events]


def produce(root: str, payloads: list[bytes], chunk: int = 250) -> None:
    """Write the events into the demo queue and wait until all are durable."""
    from headrace.buffer import Producer, ProducerConfig

    cfg = ProducerConfig(url=root, data_path_prefix=QUEUE, manifest_path=f"{QUEUE}/manifest",
                         flush_interval_s=0.05)
    with Producer(cfg) as producer:
        handles = [producer.produce(payloads[i : i + chunk])
                   for i in range(0, len(payloads), chunk)]
        for h in handles:
            h.watcher.await_durable(timeout=120)


def build_pipeline(spark, root: str, *, partitions: int = 4, name: str = "demo", **kwargs):
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name=name, partitions=partitions, **kwargs)
    src = p.read_queue(QUEUE, {"orders": ORDERS, "customers": CUSTOMERS})
    enriched = p.join(src["orders"], src["customers"], on=["customer_id"], name="enriched")
    totals = p.aggregate(enriched, by=["region"],
                         aggs={"orders": "count", "revenue": "sum(amount)"}, name="totals")
    p.write_shard(totals, OUTPUT_SHARD)
    return p


def expected_totals(spark, events: list[dict]) -> pa.Table:
    """The same answer computed from scratch by plain PySpark over all events."""
    from pyspark.sql import functions as F

    orders = spark.createDataFrame(
        [(e["order_id"], e["customer_id"], e["amount"], e["w"]) for e in events
         if e["table"] == "orders"], "order_id long, customer_id long, amount long, w long")
    customers = spark.createDataFrame(
        [(e["customer_id"], e["region"], e["w"]) for e in events if e["table"] == "customers"],
        "customer_id long, region string, w long")
    o = orders.groupBy("order_id", "customer_id", "amount").agg(F.sum("w").alias("ow")) \
        .filter("ow != 0")
    c = customers.groupBy("customer_id", "region").agg(F.sum("w").alias("cw")) \
        .filter("cw != 0")
    j = o.join(c, "customer_id").withColumn("w", F.col("ow") * F.col("cw"))
    agg = j.groupBy("region").agg(F.sum("w").alias("orders"),
                                  F.sum(F.col("w") * F.col("amount")).alias("revenue"))
    return agg.filter("orders != 0").toArrow()


def normalize_totals(table: pa.Table) -> list[tuple]:
    """Rows (region, orders, revenue) of a snapshot or expected table, sorted, diff == 1."""
    rows = table.to_pylist()
    out = []
    for r in rows:
        n = r.get("diff", 1)
        if n != 1:
            raise AssertionError(f"output row with multiplicity {n}: {r}")
        out.append((r["region"], int(r["orders"]), int(r["revenue"])))
    return sorted(out)
