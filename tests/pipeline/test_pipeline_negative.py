"""A retraction of a row that was never inserted, through real Spark: with on_bad_entry="fail"
the batch fails naming the entry and commits nothing (the static plan, and the restart's direct
job); with "dead_letter" the entry goes to the dead-letter shard and the state is as if it had
never arrived (the per-batch job). Retractions of inserted rows never trip the check."""

from __future__ import annotations

import pytest

from headrace.testing.queries import (
    batch_result,
    encode_columnar,
    encode_entries,
    produce_entries,
    rows_equal,
)

pytestmark = pytest.mark.spark

ORDERS = "order long, customer string, amount long"


def _define(spark, root, ckpt, **kw):
    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name="neg", partitions=2, buckets=4, checkpoint_dir=ckpt,
                 batches_per_trigger=1, **kw)
    src = p.read_queue("in", {"orders": ORDERS})
    p.write_shard(p.aggregate(src["orders"], by=["customer"],
                              aggs={"n": "count", "total": "sum(amount)"}, name="agg"),
                  "neg.out")
    return p


def _order(order: int, customer: str, amount: int) -> dict:
    return {"order": order, "customer": customer, "amount": amount}


def _expected(spark, rows: list[dict]):
    from pyspark.sql import functions as F

    return batch_result(spark, {"orders": ORDERS}, {"orders": rows},
                        lambda s: s["orders"].groupBy("customer").agg(
                            F.count("*").alias("n"), F.sum("amount").alias("total")))


def test_a_retraction_never_inserted_fails_the_batch_naming_the_entry(spark, tmp_path):
    """Columnar entries: the streaming query's batch (the static plan) fails naming queue,
    sequence and entry, with nothing of it committed; the restart runs that batch first as
    the direct job, which fails the same way, as the typed error. A row inserted and retracted
    in one batch does not trip the check."""
    from headrace.pipeline.driver import direct_job as direct
    from headrace.pipeline.errors import ImpossibleRetraction

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    produce_entries(root, "in", encode_columnar("orders", [_order(1, "c", 10),
                                                           _order(7, "e", 5)], ORDERS)
                    + encode_columnar("orders", [_order(7, "e", 5)], ORDERS, weight=-1))
    produce_entries(root, "in", encode_columnar("orders", [_order(9, "c", 99)], ORDERS,
                                                weight=-1))
    p = _define(spark, root, ckpt)
    with pytest.raises(Exception, match=r"queue 'in' sequence 1 entry 0, table 'orders': "
                                        r"retracts a row that was never inserted \(operator "
                                        r"'agg', key \{'customer': 'c'\}"):
        p.run(until_idle=True)
    assert p.persist.upper("neg.progress") == 1 and p.metrics["static_batches"] == 1
    equal, why = rows_equal(p.read_shard("neg.out"), _expected(spark, [_order(1, "c", 10)]))
    assert equal, why

    again = _define(spark, root, ckpt)
    ran = []
    collect = direct.collect
    direct.collect = lambda *a, **kw: ran.append(1) or collect(*a, **kw)
    try:
        with pytest.raises(ImpossibleRetraction) as info:
            again.run(until_idle=True)
    finally:
        direct.collect = collect
    assert ran == [1]  # the interrupted batch ran as the direct job
    e = info.value
    assert (e.queue, e.sequence, e.index, e.operator, e.key) == ("in", 1, 0, "agg",
                                                                 {"customer": "c"})
    assert "count(*) would be 0, sum(amount) over 0 value(s) summing to -89" in str(e)
    assert again.persist.upper("neg.progress") == 1


def test_a_retraction_never_inserted_goes_to_the_dead_letter_shard(spark, tmp_path):
    """The issue's example on the per-batch job, with legitimate retractions around it: of a
    row inserted a batch before, of one inserted in the same batch, and one in the same group
    and batch as the bad one (two candidates: a dry run tells them apart). Only the bad entry
    goes to the dead-letter shard; the group then reads (2, 40), as Spark SQL over the rest."""
    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    waves = [encode_entries("orders", [_order(1, "c", 10), _order(2, "c", 20),
                                       _order(5, "d", 7)]),
             encode_entries("orders", [_order(2, "c", 20)], weight=-1)
             + encode_entries("orders", [_order(9, "c", 99), _order(5, "d", 7)], weight=-1),
             encode_entries("orders", [_order(3, "c", 30), _order(6, "e", 1)])
             + encode_entries("orders", [_order(6, "e", 1)], weight=-1)]
    for wave in waves:
        produce_entries(root, "in", wave)
    p = _define(spark, root, ckpt, on_bad_entry="dead_letter")
    p.run(until_idle=True)
    assert p.time == 3
    equal, why = rows_equal(p.read_shard("neg.out"),
                            _expected(spark, [_order(1, "c", 10), _order(3, "c", 30)]))
    assert equal, why
    assert p.read_shard("neg.out").select(["customer", "n", "total"]).to_pylist() == [
        {"customer": "c", "n": 2, "total": 40}]
    dead = p.read_shard("neg.dead_letter")
    assert [(r["sequence"], r["index"], r["table"], r["field"]) for r in dead.to_pylist()] == [
        (1, 1, "orders", "w")]
    assert "retracts a row that was never inserted (operator 'agg'" in dead["reason"][0].as_py()
    assert dead["entry"].to_pylist() == [waves[1][1]]
    assert p.metrics["bad_entries"] == 1
