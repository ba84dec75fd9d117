"""``p.read_stream(df)``: a Spark streaming DataFrame as a pipeline source, exactly once.

A file stream with every awkward value (NULLs, timestamps, decimals, binary, a string holding
NUL and 0x1F) feeds a pass-through, an aggregate and a join with a queue table; each shard must
equal Spark batch SQL over the same files, before and after more files arrive. A replayed batch
id appends nothing (also after the pipeline dequeued it); a SIGKILL after a batch's append, before
Spark commits it, then a restart, loses and duplicates nothing.

Run as a script, this file is the crash test's worker process.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headrace.buffer import QueueConsumer, read_manifest
from headrace.buffer.batch_format import decode_batch
from headrace.errors import InvalidInput
from headrace.pipeline.driver.streams import Intent, entries_block
from headrace.pipeline.encoding.types import parse_schema
from headrace.pipeline.errors import StreamCheckpointLost
from headrace.store import open_store

pytestmark = pytest.mark.spark

DDL = ("user long, ts timestamp, amount decimal(12,2), label string, price double, f float, "
       "flag boolean, day date, blob binary, n int")
ARROW = pa.schema([("user", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")),
                   ("amount", pa.decimal128(12, 2)), ("label", pa.string()),
                   ("price", pa.float64()), ("f", pa.float32()), ("flag", pa.bool_()),
                   ("day", pa.date32()), ("blob", pa.binary()), ("n", pa.int32())])
T0 = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
LABELS = ["a\x00b", "x\x1fy", "", "plain", None]


def _rows(file_no: int, count: int = 12) -> list[dict]:
    out = []
    for i in range(count):
        k = file_no * 100 + i
        out.append({
            "user": None if i % 7 == 3 else k % 4, "ts": None if i == 5 else
            T0 + dt.timedelta(microseconds=k * 1_000_001),
            "amount": None if i % 5 == 4 else decimal.Decimal(f"{k - 40}.{i:02d}"),
            "label": LABELS[k % len(LABELS)],
            "price": [1.5, -0.0, float("nan"), None, 1e308, -float("inf")][i % 6],
            "f": None if i % 6 == 0 else i / 8, "flag": [True, False, None][i % 3],
            "day": dt.date(2026, 1, 1 + i % 28), "blob": [b"\x00\x1f\xff", b"", None][i % 3],
            "n": None if i % 4 == 1 else k - 50})
    return out


def _write_file(folder, file_no: int) -> None:
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(_rows(file_no), schema=ARROW),
                   os.path.join(folder, f"part-{file_no:03d}.parquet"))


def _stream(spark, folder, per_trigger: int | None = None):
    reader = spark.readStream.schema(DDL)
    if per_trigger:
        reader = reader.option("maxFilesPerTrigger", per_trigger)
    return reader.parquet(str(folder))


def _queue_rows(store, queue: str) -> int:
    """Rows the queue holds now (every batch file read, every columnar entry decoded)."""
    from headrace.pipeline.encoding.columnar import decode

    schemas = {"clicks": parse_schema(DDL)}
    return sum(decode(entry, schemas)[1].num_rows
               for e in read_manifest(store, f"{queue}/manifest").entries
               for entry in decode_batch(store.get(e.location).data))


def _batch_files(store, queue: str) -> int:
    return sum(1 for m in store.list(f"{queue}/") if m.key.endswith(".batch"))


def test_entries_block_is_a_batch_file_readers_decode():
    entries = [b"{}", b"", b"\x00\x1f" * 3, b"x" * 5000]
    arr = pa.array(entries, pa.binary())
    assert decode_batch(entries_block(arr)) == entries
    assert decode_batch(entries_block(arr.slice(1, 2))) == entries[1:3]


def test_unsupported_streams_fail_when_defined(spark, tmp_path):
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    p = Pipeline(spark, str(tmp_path / "store"), name="bad")
    rate = spark.readStream.format("rate").load()
    for col, shown in [(F.create_map(F.lit("k"), F.col("value")), "map<string,bigint>"),
                       (F.array(F.col("value")), "array<bigint>"),
                       (F.struct(F.col("value")), "struct<value:bigint>"),
                       (F.col("value").cast("short"), "smallint"),
                       (F.col("timestamp").cast("timestamp_ntz"), "timestamp_ntz")]:
        with pytest.raises(InvalidInput, match=rf"column 'odd' would be {shown}"):
            p.read_stream(rate.select("timestamp", col.alias("odd")), "events")
    with pytest.raises(InvalidInput, match="not a streaming DataFrame"):
        p.read_stream(spark.range(3), "events")
    with pytest.raises(InvalidInput, match=r"\['w'\] collide"):
        p.read_stream(rate.withColumnRenamed("value", "w"), "events")
    with pytest.raises(InvalidInput, match="read_stream name"):
        p.read_stream(rate, "../x")
    assert p.queues == [] and p.streams == []  # nothing half-defined was left behind


def _build(p, spark, folder, per_trigger: int | None = None):
    from pyspark.sql import functions as F

    clicks = p.read_stream(_stream(spark, folder, per_trigger), "clicks")
    users = p.read_queue("users").table("user", "user long, country string")
    clicks.write_shard("raw")
    clicks.group_by("label").agg(
        F.count("*").alias("n"), F.sum("amount").alias("total"), F.max("ts").alias("last"),
        F.count("blob").alias("blobs"), F.avg("n").alias("avg_n")).write_shard("by_label")
    (clicks.join(users, on="user", how="left").group_by("country")
     .agg(F.count("*").alias("n"), F.sum("n").alias("s")).write_shard("by_country"))


def _batch(spark, folder, users):
    from pyspark.sql import functions as F

    df = spark.read.schema(DDL).parquet(str(folder))
    u = spark.createDataFrame(users, "user long, country string")
    return {"raw": df,
            "by_label": df.groupBy("label").agg(
                F.count("*").alias("n"), F.sum("amount").alias("total"),
                F.max("ts").alias("last"), F.count("blob").alias("blobs"),
                F.avg("n").alias("avg_n")),
            "by_country": df.join(u, on="user", how="left").groupBy("country").agg(
                F.count("*").alias("n"), F.sum("n").alias("s"))}


def _assert_equal(p, spark, folder, users):
    from headrace.testing.queries import rows_equal

    for shard, want in _batch(spark, folder, users).items():
        ok, why = rows_equal(p.read_shard(shard), want.toArrow())
        assert ok, f"{shard}: {why}"


def test_file_stream_equals_batch_sql_then_start_adds_only_new_files(spark, tmp_path):
    from headrace.pipeline import Pipeline
    from headrace.pipeline.errors import PipelineError
    from headrace.testing.queries import encode_entries, produce_entries

    root, folder = str(tmp_path / "store"), tmp_path / "in"
    users = [(0, "fr"), (1, "de"), (2, None)]  # user 3 and NULL users match nothing
    produce_entries(root, "users", encode_entries(
        "user", [{"user": u, "country": c} for u, c in users]))
    for i in range(2):
        _write_file(folder, i)
    kw = {"name": "clk", "partitions": 2, "buckets": 4, "checkpoint_dir": str(tmp_path / "ck")}
    p = Pipeline(spark, root, **kw)
    _build(p, spark, folder)
    p.run(until_idle=True, max_runs=1)
    assert p.streams[0].metrics["rows"] == 24
    _assert_equal(p, spark, folder, users)

    # a restart running continuously: the side query runs beside the pipeline; only the new
    # file is ingested, and stop() stops both queries
    _write_file(folder, 2)
    p2 = Pipeline(spark, root, **kw)
    _build(p2, spark, folder)
    ingest = p2.streams[0]
    handle = p2.start(processing_time="200 milliseconds")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                ingest.metrics["rows"] == 12 and p2.bindings.get("clk.stream.clicks", -1) >= 0
                and p2.bindings["clk.stream.clicks"] == read_manifest(
                    p2.store, "clk.stream.clicks/manifest").next_sequence - 1):
            handle.await_termination(0.2)
    finally:
        handle.stop()
    handle.await_termination()
    assert handle.status["streams"]["clicks"]["rows"] == 12
    assert not [q for q in spark.streams.active if q.name == "headrace-clk-clicks"]
    _assert_equal(p2, spark, folder, users)

    # the side query's checkpoint lost: Spark would read every file again; refused instead
    shutil.rmtree(tmp_path / "ck" / "streams" / "clicks")
    p3 = Pipeline(spark, root, **kw)
    _build(p3, spark, folder)
    with pytest.raises(PipelineError, match="StreamCheckpointLost.*deleted or replaced"):
        p3.run(until_idle=True)
    p4 = Pipeline(spark, root, **kw)  # ... and a side query dying stops a continuous run
    _build(p4, spark, folder)
    with pytest.raises(PipelineError, match="StreamCheckpointLost"):
        p4.start(processing_time="200 milliseconds").await_termination(120)
    assert not spark.streams.active
    _assert_equal(p4, spark, folder, users)  # nothing was appended or processed twice


def test_append_sink_behind_an_inner_join_of_two_streams_equals_batch_sql(spark, tmp_path):
    """Tables read from Spark streams are insert-only (the ingest writes weight 1), so an
    inner join of two of them — and a distinct of a stream — may feed an append sink: every
    shard row is an insertion (diff > 0: equal rows count as one with their multiplicity),
    and the shard equals Spark batch SQL after each run."""
    from headrace.pipeline import Pipeline
    from headrace.testing.queries import rows_equal

    root, a, b = str(tmp_path / "store"), tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    p = Pipeline(spark, root, name="app", partitions=2, buckets=4,
                 checkpoint_dir=str(tmp_path / "ck"))
    left = p.read_stream(_stream(spark, a), "left")
    right = p.read_stream(spark.readStream.schema("user long, label string, day date")
                          .parquet(str(b)), "right")
    left.select("user", "price", "label").join(right, on=["user", "label"]) \
        .write_shard("pairs", mode="append")
    right.select("user", "day").distinct().write_shard("days", mode="append")
    with pytest.raises(InvalidInput, match="insert-only rows"):  # a left join may retract
        left.select("user", "price").join(right, on="user", how="left") \
            .write_shard("padded", mode="append")
    with pytest.raises(InvalidInput, match="insert-only rows"):  # a queue may retract
        p.read_queue("users").table("u", "user long").join(left.select("user"), on="user") \
            .write_shard("from_queue", mode="append")

    def right_rows(no: int) -> pa.Table:
        rows = [r for r in _rows(no) if r["user"] is not None or no == 1]
        return pa.table({"user": [r["user"] for r in rows], "label": [r["label"] for r in rows],
                         "day": [r["day"] for r in rows]})

    for run, files in enumerate([(0, 1), (2,)]):
        for i in files:
            _write_file(a, i)
            pq.write_table(right_rows(i), b / f"part-{i:03d}.parquet")
        p.run(until_idle=True, max_runs=1)
        lb = spark.read.schema(DDL).parquet(str(a))
        rb = spark.read.schema("user long, label string, day date").parquet(str(b))
        want = {"pairs": lb.select("user", "price", "label").join(rb, on=["user", "label"]),
                "days": rb.select("user", "day").distinct()}
        for shard, df in want.items():
            got = p.read_shard(shard)
            assert min(got["diff"].to_pylist()) > 0, (shard, run)  # insertions only
            ok, why = rows_equal(got, df.toArrow())
            assert ok, f"{shard} after run {run}: {why}"


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    """The store the ingest's CAS and Create puts meet: a folder, and S3 (moto)."""
    if request.param == "s3":
        return request.getfixturevalue("s3_url")
    return str(tmp_path / "store")


def test_a_replayed_batch_id_appends_once(spark, tmp_path, root):
    """The ingest function called as Spark would replay it: same batch id, same rows."""
    from headrace.pipeline import Pipeline

    folder = tmp_path / "in"
    _write_file(folder, 0)
    p = Pipeline(spark, root, name="rp", checkpoint_dir=str(tmp_path / "ck"))
    p.read_stream(_stream(spark, folder), "clicks").write_shard("raw")
    ingest = p.streams[0]
    ingest.file_bytes = 600  # several files per batch: they must land together
    rows = ingest.entries(spark.read.schema(DDL).parquet(str(folder)))
    store, queue = open_store(root), "rp.stream.clicks"

    before = p.store.counts()
    assert ingest.ingest(rows, 0, "q1") == 12
    files = len(read_manifest(store, f"{queue}/manifest").entries)
    assert files > 1
    # the driver's requests for a batch: intent GET + PUT, manifest GET x2 + one PUT for all
    # the batch's files (the files themselves are PUT by the executors)
    spent = {k: v - before.get(k, 0) for k, v in p.store.counts().items()}
    assert (spent["gets"], spent["puts"]) == (3, 2), spent
    assert ingest.ingest(rows, 0, "q1") == 0  # Spark re-ran batch 0: nothing appended
    assert _queue_rows(store, queue) == 12
    assert _batch_files(store, queue) == files  # ... and nothing uploaded

    # the pipeline consumed and dequeued batch 0 before the replay: still appended once
    consumer = QueueConsumer(store, f"{queue}/manifest")
    consumer.initialize()
    consumer.dequeue(files - 1)
    assert ingest.ingest(rows, 0, "q1") == 0
    assert read_manifest(store, f"{queue}/manifest").next_sequence == files

    # the intent of batch 1 was recorded but its append never landed: the replay appends it
    ingest._put_intent(Intent("q1", 1, files), ingest._read_intent()[1])
    assert ingest.ingest(rows, 1, "q1") == 12
    assert ingest.ingest(rows, 1, "q1") == 0
    assert _queue_rows(store, queue) == 12  # batch 0 was dequeued; batch 1 is here once

    # a side query with another id (its checkpoint was lost): refused, nothing appended
    with pytest.raises(StreamCheckpointLost, match="checkpoint was deleted or replaced"):
        ingest.ingest(rows, 2, "q2")
    assert _queue_rows(store, queue) == 12


def _worker(root: str, folder: str, ckpt: str, step: str, batch: int) -> None:
    """The crash test's process: ingest + pipeline; SIGKILL of the whole process group (JVM
    and Python workers too) right after ``step`` of ingest batch ``batch``."""
    from headrace.pipeline import Pipeline
    from headrace.testing.spark import local_spark

    spark = local_spark()
    p = Pipeline(spark, root, name="ks", partitions=2, buckets=4, checkpoint_dir=ckpt)
    p.read_stream(_stream(spark, folder, per_trigger=1), "clicks").write_shard("raw")

    def on_step(s: str, b: int) -> None:
        if (s, b) == (step, batch):
            os.killpg(os.getpgid(0), signal.SIGKILL)

    p.streams[0].on_step = on_step
    p.run(until_idle=True, max_runs=1)


def test_sigkill_after_an_append_before_spark_commits_then_restart(spark, tmp_path):
    from headrace.pipeline import Pipeline
    from headrace.testing.queries import rows_equal

    root, folder, ckpt = str(tmp_path / "store"), tmp_path / "in", str(tmp_path / "ck")
    for i in range(3):
        _write_file(folder, i)
    from headrace.testing.spark import child_env

    env = child_env(SPARK_LOCAL_IP="127.0.0.1")
    # dies after batch 1's append, before Spark commits batch 1 (a crash after the intent
    # only is test_a_replayed_batch_id_appends_once's batch 1)
    proc = subprocess.run([sys.executable, __file__, root, str(folder), ckpt, "append", "1"],
                          env=env, start_new_session=True, timeout=300, capture_output=True,
                          text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not os.path.exists(os.path.join(ckpt, "streams", "clicks", "commits", "1"))
    p = Pipeline(spark, root, name="ks", partitions=2, buckets=4, checkpoint_dir=ckpt)
    p.read_stream(_stream(spark, folder, per_trigger=1), "clicks").write_shard("raw")
    p.run(until_idle=True, max_runs=1)
    assert p.streams[0].metrics["replayed_batches"] == 1  # batch 1 had landed: not again
    ok, why = rows_equal(p.read_shard("raw"),
                         spark.read.schema(DDL).parquet(str(folder)).toArrow())
    assert ok, why


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
