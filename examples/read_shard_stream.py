"""Reading a pipeline's output shard as a Spark stream: ``format("headrace.shard")`` turns the
output into a change stream any Spark query can follow (to a dashboard, another sink, …).

    python examples/read_shard_stream.py [STORE]

STORE is a new (or empty) local folder, or an s3://… URL; without it, a new temporary folder.
The stream's first micro-batch is the shard's consolidated contents; each later one holds the
changes of the pipeline times since: a changed row arrives as its old version with diff -1 and
its new version with diff +1. Summing the diffs gives back the table, checked here against the
same query in Spark batch SQL.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections import Counter

from headrace.buffer import Producer, ProducerConfig
from headrace.spark import Pipeline, new_store, session

WAVES = [[{"sensor": f"s{i % 4}", "reading": i % 10} for i in range(40)],
         [{"sensor": f"s{i % 6}", "reading": i % 7} for i in range(12)]]  # s4, s5 are new




def produce(root: str, readings: list[dict]) -> None:
    cfg = ProducerConfig(url=root, data_path_prefix="sensors", manifest_path="sensors/manifest")
    with Producer(cfg) as producer:
        entries = [json.dumps({"table": "readings", **r}).encode() for r in readings]
        producer.produce(entries).watcher.await_durable(timeout=60)


def main() -> None:
    root = new_store(sys.argv[1] if len(sys.argv) > 1 else None)
    spark = session("headrace-example")
    p = Pipeline(spark, root, name="sensors", partitions=2)
    src = p.read_queue("sensors", {"readings": "sensor string, reading long"})
    stats = p.aggregate(src["readings"], by=["sensor"],
                        aggs={"n": "count", "total": "sum(reading)"}, name="stats")
    p.write_shard(stats, "sensor_stats")

    # a Spark query following the output shard; its own checkpoint keeps its position
    reader_checkpoint = tempfile.mkdtemp(prefix="headrace-reader-")
    changes: list[tuple] = []

    def collect(df, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in df.select("sensor", "n", "total", "time", "diff")
                      .collect())
        print(f"stream micro-batch {batch_id}: {len(rows)} rows (sensor, n, total, time, diff)")
        for r in rows:
            print(f"  {r}")
        changes.extend(rows)

    def follow() -> None:
        stream = (spark.readStream.format("headrace.shard").option("url", root)
                  .option("shard", "sensor_stats").load())
        query = (stream.writeStream.foreachBatch(collect).trigger(availableNow=True)
                 .option("checkpointLocation", reader_checkpoint).start())
        query.awaitTermination()

    for wave in WAVES:  # the pipeline runs, then the stream reader catches up
        produce(root, wave)
        p.run(until_idle=True)
        follow()

    net = Counter()
    for sensor, n, total, _time, diff in changes:
        net[(sensor, n, total)] += diff
    rows = sorted(row for row, weight in net.items() for _ in range(weight))
    assert all(w >= 0 for w in net.values()), f"negative net weights in {net}"
    spark.createDataFrame([(r["sensor"], r["reading"]) for wave in WAVES for r in wave],
                          "sensor string, reading long").createOrReplaceTempView("readings")
    expected = sorted(tuple(r) for r in spark.sql(
        "SELECT sensor, count(*), sum(reading) FROM readings GROUP BY sensor").collect())
    assert rows == expected, f"summed stream {rows} != Spark batch SQL {expected}"
    print(f"summed diffs: {rows}")
    print("same as Spark batch SQL")
    shutil.rmtree(reader_checkpoint, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
