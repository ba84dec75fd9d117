"""Columnar queue entries through real Spark: mixed with JSON entries in the same queue batches,
on the static plan and the per-batch job, across an interrupted batch that a restart re-reads
from the queue; a columnar entry that does not decode fails the batch naming it, or goes to the
dead-letter shard — never dropped."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from headrace.testing.queries import (
    batch_result,
    encode_columnar,
    encode_entries,
    produce_entries,
    rows_equal,
)

pytestmark = pytest.mark.spark

T, U = "k long, v double, s string", "k long, tag string"


def _rows(seed: int, n: int) -> list[dict]:
    rnd = random.Random(seed)
    return [{"k": rnd.choice([None, *range(6)]),
             "v": rnd.choice([None, -0.0, 0.0, float("nan"), rnd.uniform(-9, 9)]),
             "s": rnd.choice([None, "\x00", "\x1f", "a", "é"])} for _ in range(n)]


def _tags(seed: int) -> list[dict]:
    rnd = random.Random(seed)
    return [{"k": k, "tag": rnd.choice([None, "x", "y"])} for k in [None, *range(6)]]


def _define(spark, root, ckpt, static, store=None, **kw):
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name="col", partitions=2, buckets=4, checkpoint_dir=ckpt,
                 batches_per_trigger=1, static_plan=static, store=store, **kw)
    src = p.read_queue("in", {"t": T, "u": U})
    joined = p.join(src["t"], src["u"], on=["k"], name="j")
    p.write_shard(p.aggregate(joined, by=["tag"], aggs={"n": "count", "c": "count(s)",
                                                         "m": "max(v)"}, name="agg"), "col.out")
    return p


def _expected(spark, t_rows, u_rows):
    from pyspark.sql import functions as F

    return batch_result(spark, {"t": T, "u": U}, {"t": t_rows, "u": u_rows},
                        lambda s: s["t"].join(s["u"], "k").groupBy("tag").agg(
                            F.count("*").alias("n"), F.count("s").alias("c"),
                            F.max("v").alias("m")))


def test_columnar_and_json_entries_equal_spark_batch_sql_across_a_restart(spark, tmp_path):
    """Three queue batches mixing columnar entries (several per batch, retractions as weights)
    and JSON entries, on the static plan; the second batch fails at its state checkpoint and a
    new Pipeline re-reads it from the queue (the recovery range). The shard equals Spark batch
    SQL over the net input: NULL keys never match, -0.0/NaN values, NUL and 0x1F in strings.
    (The per-batch job reads columnar entries in the dead-letter test below.)"""
    from headrace.store import FaultyStore, open_store

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    a, b, c, tags = _rows(1, 60), _rows(2, 60), _rows(3, 60), _tags(4)
    produce_entries(root, "in", encode_columnar("t", a, T, entry_bytes=600)
                    + encode_columnar("u", tags, U) + encode_entries("t", b[:5]))
    produce_entries(root, "in", encode_entries("t", a[:7], weight=-1)
                    + encode_columnar("t", b[5:], T, entry_bytes=900))
    produce_entries(root, "in", encode_columnar("t", c, T)
                    + encode_columnar("u", tags[:2], U, weight=-1))

    class FailAtSecondCheckpoint(FaultyStore):
        def put(self, key, data, *args, **kw):
            if key.startswith("col.state/") and p1.time >= 1:
                raise OSError("injected: the driver died at the state checkpoint")
            return super().put(key, data, *args, **kw)

    p1 = _define(spark, root, ckpt, True, store=FailAtSecondCheckpoint(open_store(root)))
    with pytest.raises(Exception, match="injected"):
        p1.run(until_idle=True)
    assert p1.time == 1
    p2 = _define(spark, root, ckpt, True)
    p2.run(until_idle=True)
    assert p2.time == 3
    assert p2.metrics["static_batches"] == 2
    equal, why = rows_equal(p2.read_shard("col.out"),
                            _expected(spark, a[7:] + b + c, tags[2:]))
    assert equal, why


def _poison(table: str = "t") -> bytes:
    from headrace.pipeline.encoding import columnar
    from headrace.pipeline.encoding.types import parse_schema

    # declares `s` as binary where the table says string
    return columnar.encode(table, pa.table({"k": [1], "v": [1.0], "s": [b"x"]}),
                           parse_schema("k long, v double, s binary"))[0]


def test_a_columnar_entry_that_does_not_decode_fails_the_batch_naming_it(spark, tmp_path):
    root = str(tmp_path / "store")
    produce_entries(root, "in", encode_columnar("t", _rows(5, 10), T) + [_poison()])
    p = _define(spark, root, str(tmp_path / "ck"), True)
    with pytest.raises(Exception, match=r"sequence 0 entry 1, table 't', field 's'"):
        p.run(until_idle=True)
    assert (p.persist.upper("col.progress") or 0) == 0  # nothing committed


def test_a_columnar_entry_that_does_not_decode_goes_to_the_dead_letter_shard(spark, tmp_path):
    root = str(tmp_path / "store")
    good, tags = _rows(6, 20), _tags(7)
    produce_entries(root, "in", encode_columnar("t", good, T) + [_poison()]
                    + encode_columnar("u", tags, U))
    p = _define(spark, root, str(tmp_path / "ck"), False, on_bad_entry="dead_letter")
    p.run(until_idle=True)
    dead = p.read_shard("col.dead_letter")
    assert dead["index"].to_pylist() == [1] and dead["field"].to_pylist() == ["s"]
    assert "declared string" in dead["reason"][0].as_py()
    assert dead["entry"].to_pylist() == [_poison()]
    assert p.metrics["bad_entries"] == 1
    equal, why = rows_equal(p.read_shard("col.out"), _expected(spark, good, tags))
    assert equal, why


def _grouped(spark, root, ckpt, store=None):
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name="dir", partitions=2, buckets=4, checkpoint_dir=ckpt,
                 batches_per_trigger=1, store=store)
    src = p.read_queue("in", {"t": T, "u": U})
    # no max(v): over a group of 0.0 and -0.0 Spark's batch answer depends on the row order
    p.write_shard(p.aggregate(src["t"], by=["k", "s", "v"], aggs={"n": "count",
                                                                  "t": "sum(k)"}, name="g"),
                  "dir.out")
    return p


def _crash_at_checkpoint(spark, root, ckpt, at: int):
    from headrace.store import FaultyStore, open_store

    class FailAtCheckpoint(FaultyStore):
        def put(self, key, data, *args, **kw):
            if key.startswith("dir.state/") and p.time >= at:
                raise OSError("injected: the driver died at the state checkpoint")
            return super().put(key, data, *args, **kw)

    p = _grouped(spark, root, ckpt, store=FailAtCheckpoint(open_store(root)))
    with pytest.raises(Exception, match="injected"):
        p.run(until_idle=True)
    assert p.time == at


def test_an_interrupted_columnar_batch_runs_as_the_direct_job_and_json_falls_back(spark,
                                                                                   tmp_path):
    """A restart runs the interrupted batch of a one-operator pipeline as the direct job
    (driver/direct_job.py: each task reads the range, buckets rows by our xxhash64) when the range is
    columnar only: its keys (long, string, double with -0.0/NaN, NULLs) meet the state the
    static plan bucketed with Spark's xxhash64, so the shard equals Spark batch SQL. A range
    with a JSON entry (and another table's rows) runs on the static plan instead."""
    from pyspark.sql import functions as F

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    a, b, c = _rows(11, 80), _rows(12, 80), _rows(13, 40)
    produce_entries(root, "in", encode_columnar("t", a, T, entry_bytes=700))
    produce_entries(root, "in", encode_columnar("t", b, T, entry_bytes=900)
                    + encode_columnar("t", a[:9], T, weight=-1))
    _crash_at_checkpoint(spark, root, ckpt, 1)
    # the restart's direct batch itself dies at its checkpoint: its tasks' uploads are garbage
    # and the next restart runs the batch directly again
    _crash_at_checkpoint(spark, root, ckpt, 1)
    p = _grouped(spark, root, ckpt)
    p.run(until_idle=True)
    assert (p.time, p.metrics["direct_batches"]) == (2, 1)

    produce_entries(root, "in", encode_columnar("t", c, T) + encode_entries("t", b[:3])
                    + encode_columnar("u", _tags(14), U))
    _crash_at_checkpoint(spark, root, ckpt, 2)
    p = _grouped(spark, root, ckpt)
    p.run(until_idle=True)
    assert (p.time, p.metrics["direct_batches"], p.metrics["static_batches"]) == (3, 0, 1)
    expected = batch_result(spark, {"t": T}, {"t": a[9:] + b + b[:3] + c},
                            lambda s: s["t"].groupBy("k", "s", "v").agg(
                                F.count("*").alias("n"), F.sum("k").alias("t")))
    equal, why = rows_equal(p.read_shard("dir.out"), expected)
    assert equal, why
