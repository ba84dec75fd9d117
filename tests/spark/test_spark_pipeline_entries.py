"""Queue entries through a running pipeline, against Spark's ``from_json`` over the same
entries: non-numeric numbers in a column another table declares as a long, missing fields read
as NULL (``missing_fields="null"``) or dead-lettered (the default); a semi join of two tables
that declare one name with two types is refused when defined."""

from __future__ import annotations

import pytest

from headrace.testing.queries import produce_entries, rows_equal

pytestmark = pytest.mark.spark


def _from_json(spark, entries: list[bytes], table: str, ddl: str):
    """The rows Spark's from_json reads from ``entries`` for ``table`` (schema ``ddl``), as
    Spark batch SQL: refused entries (corrupt record) and other tables' entries left out."""
    from pyspark.sql import functions as F

    from headrace.pipeline.encoding.types import parse_schema, spark_ddl

    schema = parse_schema(ddl)
    df = spark.createDataFrame([(e.decode(),) for e in entries], "text string")
    parsed = df.select(F.from_json("text", f"{spark_ddl(schema)}, `table` string, `_bad` string",
                                   {"columnNameOfCorruptRecord": "_bad"}).alias("s"))
    return (parsed.filter(F.col("s._bad").isNull() & (F.col("s.table") == table))
            .select(*[F.col("s").getField(n).alias(n) for n in schema.names]))


A, B = "k long, v long", "k long, v double"
ORDERS = "order long, amount double"
GOOD = {
    "a": [b'{"table":"a","k":1,"v":5}', b'{"table":"a","k":2,"v":9223372036854775807}'],
    # b.v is a double where a.v is a long: every non-numeric number Spark's parser reads
    "b": [b'{"table":"b","k":1,"v":NaN}', b'{"table":"b","k":2,"v":Infinity}',
          b'{"table":"b","k":3,"v":-Infinity}', b'{"table":"b","k":4,"v":"NaN"}',
          b'{"table":"b","k":null,"v":NaN}', b'{"table":"b","k":5,"v":-0.0}',
          b'{"table":"b","k":6,"v":null}'],
    "strict": [b'{"table":"strict","order":1,"amount":10.5}',
               b'{"table":"strict","order":2,"amount":null}'],
    # a producer that omits nulls: the table reads a missing field as NULL
    "lenient": [b'{"table":"lenient","order":1,"amount":10.5}',
                b'{"table":"lenient","order":2}', b'{"table":"lenient","amount":NaN}',
                b'{"table":"lenient","order":3,"amount":null,"w":1}'],
}
BAD = [(b'{"table":"b","k":7,"v":"x"}', "b", "v"),           # not a double
       (b'{"table":"a","k":8,"v":NaN}', "a", "v"),           # NaN is no long
       (b'{"table":"strict","order":9}', "strict", "amount"),  # missing field: bad by default
       (b'{"order":10,"amount":1.0}', None, "table")]       # no table: bad in either mode


def test_entries_decode_as_from_json_reads_them(spark, tmp_path):
    """Per-batch job (dead-letter shard): each table's shard equals Spark's from_json over the
    entries; the default dead-letters an entry without ``amount`` naming the field, the
    table declared with ``missing_fields="null"`` reads it as NULL."""
    from headrace.pipeline import Pipeline

    root = str(tmp_path / "store")
    entries = [e for rows in GOOD.values() for e in rows] + [e for e, _, _ in BAD]
    produce_entries(root, "in", entries)
    p = Pipeline(spark, root, name="ent", partitions=2, buckets=4,
                 checkpoint_dir=str(tmp_path / "ck"), on_bad_entry="dead_letter")
    frames = p.read_queue("in", {"a": A, "b": B, "strict": ORDERS})
    frames["lenient"] = p.read_queue("in").table("lenient", ORDERS, missing_fields="null")
    assert [n.missing_fields for n in p.nodes] == ["bad", "bad", "bad", "null"]
    for table, frame in frames.items():
        frame.write_shard(f"ent.{table}")
    p.run(until_idle=True, max_runs=1)

    for table, ddl in (("a", A), ("b", B), ("strict", ORDERS), ("lenient", ORDERS)):
        # from_json reads a missing field as NULL: "strict" refuses that entry instead
        read = [e for e in entries if table != "strict" or e != BAD[2][0]]
        expected = _from_json(spark, read, table, ddl).toArrow()
        assert expected.num_rows == len(GOOD[table])  # the oracle reads every good entry
        equal, why = rows_equal(p.read_shard(f"ent.{table}"), expected)
        assert equal, f"{table}: {why}"
    lenient = p.read_shard("ent.lenient").to_pylist()
    assert (2, None) in [(r["order"], r["amount"]) for r in lenient]  # no amount: NULL
    dead = p.read_shard("ent.dead_letter").sort_by("index")
    assert dead["entry"].to_pylist() == [e for e, _, _ in BAD]
    assert dead["table"].to_pylist() == [t for _, t, _ in BAD]
    assert dead["field"].to_pylist() == [f for _, _, f in BAD]
    assert "missing column 'amount'" in dead["reason"].to_pylist()[2]


def test_static_plan_reads_missing_fields_as_the_pipeline_says(spark, tmp_path):
    """``Pipeline(missing_fields="null")`` on the static plan: a group-by over entries that
    omit ``amount`` or ``order`` (or carry NaN) equals Spark batch SQL over from_json; the
    default fails the batch naming the entry and the missing field."""
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline, PipelineError

    entries = [b'{"table":"o","order":1,"amount":10.5}', b'{"table":"o","order":1}',
               b'{"table":"o","order":2,"amount":NaN}', b'{"table":"o","amount":4.0}',
               b'{"table":"o","order":2,"amount":1.5,"w":-1}',
               b'{"table":"o","order":2,"amount":1.5}']

    def define(root, ckpt, **kw):
        p = Pipeline(spark, root, name="mf", partitions=2, buckets=4, checkpoint_dir=ckpt,
                     **kw)
        o = p.read_queue("in", {"o": ORDERS})["o"]
        (o.group_by("order").agg(F.count("*").alias("n"), F.sum("amount").alias("s"),
                                 F.count("amount").alias("c")).write_shard("mf.out"))
        return p

    root = str(tmp_path / "store")
    produce_entries(root, "in", entries)
    p = define(root, str(tmp_path / "ck"), missing_fields="null")
    p.run(until_idle=True, max_runs=1)
    assert p.metrics["static_batches"] == p.metrics["batches"] == 1
    # the net input: the retraction (w -1) cancels the last entry
    rows = _from_json(spark, entries[:4], "o", ORDERS)
    expected = rows.groupBy("order").agg(F.count("*").alias("n"), F.sum("amount").alias("s"),
                                         F.count("amount").alias("c")).toArrow()
    equal, why = rows_equal(p.read_shard("mf.out"), expected)
    assert equal, why

    strict_root = str(tmp_path / "strict")
    produce_entries(strict_root, "in", entries)
    q = define(strict_root, str(tmp_path / "ck2"))
    with pytest.raises(PipelineError, match=r"sequence 0 entry 1, table 'o', field 'amount'"):
        q.run(until_idle=True, max_runs=1)
    assert q.time == 0  # nothing committed


def test_a_semi_join_of_inputs_typing_a_name_two_ways_is_refused(spark, tmp_path):
    """a(k, v long) semi-joined with b(k, v double) would carry ``v`` in one Spark column (a's
    longs through a double: 2^53 + 1 read back as 2^53); refused when defined, naming it."""
    from headrace.errors import InvalidInput
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, str(tmp_path / "store"), name="clash", partitions=1)
    src = p.read_queue("in", {"a": A, "b": B, "c": "k long, v long"})
    for how in ("left_semi", "left_anti"):
        with pytest.raises(InvalidInput, match="column 'v' is int64 on the left and double"):
            p.join(src["a"], src["b"], on=["k"], how=how)
    p.join(src["a"], src["c"], on=["k"], how="left_semi")  # one type: fine
