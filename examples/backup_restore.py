"""Backup and restore of local state: a pipeline with ``state_backend="local+backup"`` keeps each
bucket's state in a directory on the executor's disk and backs the changes up to the object store
at every micro-batch. Here the local directory is lost between two runs (a new machine, a wiped
disk); the next run restores what it needs from the backups and continues where it left off.

    python examples/backup_restore.py [STORE]

STORE is a new (or empty) local folder, or an s3://… URL; without it, a new temporary folder.
The result is checked against the same query in Spark batch SQL over all the input.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from headrace.buffer import Producer, ProducerConfig
from headrace.spark import Pipeline, new_store, session
from headrace.store import open_store

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]
WAVES = [  # two days of clicks; users 25..39 come back on the second
    [{"user": u, "page": PAGES[(u * u + i) % 5]} for u in range(40) for i in range(1 + u % 3)],
    [{"user": u, "page": PAGES[(u + 2 * i) % 5]} for u in range(25, 60) for i in range(1 + u % 2)],
]




def produce(root: str, clicks: list[dict]) -> None:
    cfg = ProducerConfig(url=root, data_path_prefix="clicks", manifest_path="clicks/manifest")
    with Producer(cfg) as producer:
        entries = [json.dumps({"table": "clicks", **c}).encode() for c in clicks]
        producer.produce(entries).watcher.await_durable(timeout=60)


def pipeline(spark, root: str, local_root: str) -> Pipeline:
    """The same definition at every start: a pipeline is resumed by name from the store."""
    p = Pipeline(spark, root, name="pages", partitions=2, buckets=4,
                 state_backend="local+backup", local_root=local_root)
    src = p.read_queue("clicks", {"clicks": "user long, page string"})
    stats = p.aggregate(src["clicks"], by=["page"],
                        aggs={"clicks": "count", "users": "count_distinct(user)"}, name="stats")
    p.write_shard(stats, "page_stats")
    return p


def files(folder: Path) -> int:
    return sum(1 for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0


def main() -> None:
    root = new_store(sys.argv[1] if len(sys.argv) > 1 else None)
    local = Path(tempfile.mkdtemp(prefix="headrace-local-state-"))  # the executor's disk
    spark = session("headrace-example")

    produce(root, WAVES[0])
    first = pipeline(spark, root, str(local))
    first.run(until_idle=True)
    backups = list(open_store(root).list("pages.backup/"))
    print(f"run 1: {first.time} micro-batch(es); local state {files(local)} files; "
          f"backups in the store: {len(backups)} objects under pages.backup/")

    shutil.rmtree(local)  # the local state is lost
    print(f"local state directory deleted: {files(local)} files")

    produce(root, WAVES[1])
    second = pipeline(spark, root, str(local))  # a new driver, an empty local disk
    second.run(until_idle=True)
    print(f"run 2: restored from the backups ({int(second.metrics['task_bytes_read'])} bytes "
          f"read by the tasks), now {files(local)} local files; pipeline time {second.time}")

    rows = sorted((r["page"], r["clicks"], r["users"])
                  for r in second.read_shard("page_stats").to_pylist())
    for page, clicks, users in rows:
        print(f"{page}: {clicks} clicks by {users} users")
    spark.createDataFrame([(c["user"], c["page"]) for wave in WAVES for c in wave],
                          "user long, page string").createOrReplaceTempView("clicks")
    expected = sorted(tuple(r) for r in spark.sql(
        "SELECT page, count(*), count(DISTINCT user) FROM clicks GROUP BY page").collect())
    assert rows == expected, f"pipeline {rows} != Spark batch SQL {expected}"
    print("same as Spark batch SQL over both runs' input")
    shutil.rmtree(local, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
