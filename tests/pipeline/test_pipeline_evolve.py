"""Evolving a pipeline that has run: per-part digests, what is kept, new, removed or refused
(no Spark), and one Spark run that adds a sink and operators to a running pipeline."""

from __future__ import annotations

import pytest

from headrace.errors import InvalidInput
from headrace.pipeline.api.builder import PipelineBuilder
from headrace.pipeline.errors import GraphChanged
from headrace.pipeline.plan.evolve import reconcile
from headrace.pipeline.plan.nodes import Map, node_digests
from headrace.pipeline.plan.progress import GRAPH_KEY, STATE_KEY, WM_KEY, stored_graph

BID = "auction long, price long"


class Plan(PipelineBuilder):
    """The plan half of a Pipeline, without Spark (no stateless steps but hand-made Maps)."""

    def __init__(self, buckets: int = 4, backend: str = "reservoir"):
        self.spark, self.name, self.buckets, self.state_backend = None, "p", buckets, backend
        self.nodes, self.sinks, self.queues, self.streams = [], [], [], []

    def evolve(self, stored: dict[str, int]):
        return reconcile(stored, self.nodes, self.sinks, buckets=self.buckets,
                         backend=self.state_backend, legacy_fingerprint=self.fingerprint,
                         pipeline=self.name)

    def committed(self, **queues: int) -> dict[str, int]:
        """The bindings a batch of this graph commits (queue positions, state, graph)."""
        return {**queues, STATE_KEY: 3, **self.evolve({}).graph.bindings()}


def base(p: Plan | None = None, *, agg: str = "count", schema: str = BID) -> Plan:
    """bids -> per-auction aggregate -> shard 'totals'; bids -> shard 'raw'."""
    p = p or Plan()
    bids = next((n for n in p.nodes if n.name == "in.bid"), None) or \
        p.read_queue("in", {"bid": schema})["bid"]
    p.write_shard(p.aggregate(bids, ["auction"], {"n": agg}, "totals_op"), "totals")
    p.write_shard(bids, "raw")
    return p


def test_digests_stay_when_parts_are_added_after_and_change_with_definition_or_upstream():
    first = base()
    ops, sinks = node_digests(first.nodes, first.sinks)
    grown = base()
    bids = grown.nodes[0]
    grown.write_shard(grown.distinct(grown.aggregate(bids, ["price"], {"m": "max(auction)"},
                                                     "by_price"), "d"), "prices")
    ops2, sinks2 = node_digests(grown.nodes, grown.sinks)
    assert {op: ops2[op] for op in ops} == ops  # the old parts' digests are unchanged
    assert {s: sinks2[s] for s in sinks} == sinks
    assert len(ops2) == len(ops) + 2 and "prices" in sinks2

    summed = base(agg="sum(price)")
    changed, _ = node_digests(summed.nodes, summed.sinks)
    assert changed[0] != ops[0]  # its own definition
    p = base(schema=BID + ", bidder long")
    upstream, up_sinks = node_digests(p.nodes, p.sinks)
    assert upstream[0] != ops[0] and up_sinks["raw"] != sinks["raw"]  # what it reads

    before = Plan()  # a new operator defined before the old ones shifts their ordinals
    bids = before.read_queue("in", {"bid": BID})["bid"]
    before.distinct(bids, "early")
    base(before)
    with pytest.raises(GraphChanged, match="operator 'totals_op' was operator #0 and is now "
                                           "#1: a part was inserted.*add new parts after"):
        before.evolve(base().committed(**{"in": 9}))


def test_new_removed_and_changed_parts():
    stored = base().committed(**{"in": 9})
    same = base().evolve(stored)
    assert (same.new_ops, same.new_sinks, same.removed) == ([], [], [])
    assert same.graph.bindings() == {k: v for k, v in stored.items()
                                     if k not in ("in", STATE_KEY)}

    grown = base()
    bids = grown.nodes[0]
    grown.write_shard(grown.aggregate(bids, ["price"], {"n": "count"}, "by_price"), "prices")
    evo = grown.evolve(stored)
    assert (evo.new_ops, evo.new_sinks, evo.removed) == (["by_price"], ["prices"], [])

    # a new sink behind an operator with state from before: only with start="now"
    behind = base()
    with_old = behind.nodes[1]
    behind.write_shard(with_old, "totals_again")
    with pytest.raises(GraphChanged, match="new sink 'totals_again' reads 'totals_op'.*"
                                           "start='now'"):
        behind.evolve(stored)
    behind.sinks[-1].start = "now"
    assert behind.evolve(stored).new_sinks == ["totals_again"]
    # ... and a new stateful operator behind it is refused outright
    deeper = base()
    deeper.write_shard(deeper.distinct(deeper.nodes[1], "dd"), "dd_out", start="now")
    with pytest.raises(GraphChanged, match="new operator 'dd' reads 'totals_op'"):
        deeper.evolve(stored)

    # removing the last parts is allowed; their ordinal and shard are never reused
    fewer = Plan()
    bids = fewer.read_queue("in", {"bid": BID})["bid"]
    fewer.write_shard(bids, "raw")
    with pytest.raises(GraphChanged, match="the sink of shard 'raw' changed"):
        fewer.evolve(stored)  # not at the end: the pass-through stage of 'raw' moved
    fewer = Plan()
    bids = fewer.read_queue("in", {"bid": BID})["bid"]
    fewer.write_shard(fewer.aggregate(bids, ["auction"], {"n": "count"}, "totals_op"), "totals")
    fewer.write_shard(fewer.aggregate(bids, ["price"], {"n": "count"}, "by_price"), "prices")
    stored = fewer.committed(**{"in": 9})
    gone = base().evolve(stored)
    assert gone.removed == ["operator 'by_price'", "sink 'prices'"]
    assert gone.new_sinks == ["raw"]  # new, over a source: no state from before behind it
    later = stored_graph({**gone.graph.bindings(), "in": 12})
    assert later.retired_ops == {1: ("by_price", stored_graph(stored).ops[1][1])}
    reused = Plan()
    bids = reused.read_queue("in", {"bid": BID})["bid"]
    reused.write_shard(reused.aggregate(bids, ["auction"], {"n": "count"}, "totals_op"),
                       "totals")
    reused.write_shard(reused.distinct(bids, "other"), "more")
    with pytest.raises(GraphChanged, match="'other' \\(operator #1\\) would take the state "
                                           "of operator 'by_price', removed earlier"):
        reused.evolve({**gone.graph.bindings(), "in": 12})
    stored = base().committed(**{"in": 9})

    with pytest.raises(GraphChanged, match="'totals_op' \\(operator #0\\) does not match"):
        base(agg="sum(price)").evolve(stored)
    assert base(Plan(buckets=8)).evolve(stored).rescale_from == 4  # re-bucketed (rescale.py)
    assert base().evolve(stored).rescale_from is None
    with pytest.raises(GraphChanged, match="its state_backend is not 'local\\+backup'"):
        base(Plan(backend="local+backup")).evolve(stored)
    other_queue = base()
    other_queue.write_shard(other_queue.read_queue("more", {"x": "k long"})["x"], "xs")
    with pytest.raises(GraphChanged, match=r"new parts read queue\(s\) \['more'\]"):
        other_queue.evolve(stored)


def test_watermarks_of_existing_parts_stay_put():
    """A with_watermark is recorded by its node name: a new one, or one whose name moved
    because a step was added before it, would change the existing parts' watermark."""
    def plan(extra_map_first: bool, extra_watermark: bool) -> Plan:
        p = Plan()
        bids = p.read_queue("in", {"bid": BID})["bid"].node
        if extra_map_first:
            p.nodes.append(Map(name="map1", schema=bids.schema, source=bids, text="filter x"))
        wm = Map(name=f"map{len(p.nodes)}", schema=bids.schema, source=bids, text="wm price",
                 event_time="price", delay_us=5, declares_watermark=True)
        p.nodes.append(wm)
        p.write_shard(p.aggregate(wm, ["auction"], {"n": "count"}, "agg"), "out")
        if extra_watermark:
            wm2 = Map(name=f"map{len(p.nodes)}", schema=bids.schema, source=bids,
                      text="wm auction", event_time="auction", delay_us=5,
                      declares_watermark=True)
            p.nodes.append(wm2)
            p.write_shard(p.aggregate(wm2, ["price"], {"n": "count"}, "agg2"), "out2")
        return p

    stored = {**plan(False, False).committed(**{"in": 4}), f"{WM_KEY}:map1": 77}
    assert plan(False, False).evolve(stored).new_ops == []
    with pytest.raises(GraphChanged, match=r"with_watermark step\(s\) \['map1'\] are no "
                                           "longer where they were"):
        plan(True, False).evolve(stored)
    with pytest.raises(GraphChanged, match=r"new with_watermark step\(s\) \['map3'\]"):
        plan(False, True).evolve(stored)


def test_old_single_fingerprint_progress():
    """Progress written before per-part digests: the same graph continues (and from then on
    commits per-part digests), any other graph is refused as before."""
    p = base()
    old = {"in": 9, STATE_KEY: 3, f"{GRAPH_KEY}:{p.fingerprint}": 0}
    evo = p.evolve(old)
    assert (evo.new_ops, evo.new_sinks, evo.removed) == ([], [], [])
    assert evo.graph.bindings() == p.evolve({}).graph.bindings()
    grown = base()
    grown.write_shard(grown.distinct(grown.nodes[0], "d"), "ds")
    with pytest.raises(GraphChanged, match="different operator graph; use a new name or root"):
        grown.evolve(old)


def test_sink_start_values():
    p = base()
    p.write_shard(p.nodes[0], "hist", start="history")
    with pytest.raises(InvalidInput, match="start must be 'now', 'history' or None"):
        p.write_shard(p.nodes[0], "later", start="tomorrow")


@pytest.mark.parametrize("kwargs, named", [
    ({"retain_batches": -1}, "retain_batches"), ({"retain_batches": True}, "retain_batches"),
    ({"buckets": 0}, "buckets"), ({"partitions": 0}, "partitions"),
    ({"on_bad_entry": "skip"}, "on_bad_entry"), ({"state_backend": "memory"}, "state_backend")])
def test_pipeline_arguments_are_checked_before_anything_runs(kwargs, named, tmp_path):
    from headrace.pipeline import Pipeline

    with pytest.raises(InvalidInput, match=named):
        Pipeline(None, str(tmp_path), **kwargs)


def test_history_sinks_read_new_parts_only_and_seeded_operators_are_declared():
    """start='history' replays the queue through new parts: a history sink behind an
    operator with state from before is refused (even an operator's own sink), and a new
    from-now sink that reads an operator the history seeds must say start='now'."""
    stored = base().committed(**{"in": 9})
    on_old = base()
    on_old.write_shard(on_old.nodes[1], "totals_hist", start="history")
    with pytest.raises(GraphChanged, match="'totals_hist' \\(start='history'\\) reads "
                                           "'totals_op'.*through new parts only"):
        on_old.evolve(stored)
    fine = base()
    fresh = fine.aggregate(fine.nodes[0], ["price"], {"n": "count"}, "by_price")
    fine.write_shard(fresh, "prices", start="history")
    fine.write_shard(fine.nodes[0], "raw_hist", start="history")  # a source: fine too
    evo = fine.evolve(stored)
    assert (evo.new_ops, sorted(evo.new_sinks)) == (["by_price"], ["prices", "raw_hist"])
    fine.write_shard(fine.distinct(fresh, "later_op"), "later")  # start=None: refused
    with pytest.raises(GraphChanged, match="new sink 'later' reads 'by_price', which starts "
                                           "from the queue's history"):
        fine.evolve(stored)
    fine.sinks[-1].start = "now"
    assert "later" in fine.evolve(stored).new_sinks


# ---- one Spark run: a pipeline gains a sink and operators --------------------------------
def _rows(seed: int, n: int) -> list[dict]:
    import random

    rnd = random.Random(seed)
    return [{"auction": rnd.randint(1, 6), "price": rnd.choice([rnd.randint(1, 900),
                                                                 rnd.randint(1001, 3000)])}
            for _ in range(n)]


def _define(spark, root: str, ckpt: str, *, grown: bool, top: str = "sum"):
    """totals = count and sum per auction; grown: + a new filter and aggregate with its own
    sink, and a second sink on the old aggregate from now."""
    from pyspark.sql import functions as F

    from headrace.pipeline import Pipeline

    p = Pipeline(spark, root, name="ev", partitions=2, buckets=4, checkpoint_dir=ckpt,
                 batches_per_trigger=1)
    bids = p.read_queue("in", {"bid": BID})["bid"]
    totals = bids.group_by("auction").agg(F.count("*").alias("n"),
                                          getattr(F, top)("price").alias("s"))
    totals.write_shard("ev.totals")
    if grown:
        big = bids.filter(F.col("price") > 1000).group_by("auction").agg(
            F.count("*").alias("n"), F.max("price").alias("top"))
        big.write_shard("ev.big")
        totals.write_shard("ev.totals_now", start="now")
    return p


def _zset(table) -> dict[tuple, int]:
    """Consolidated rows -> weights (a shard's diff, else 1 per row), zeros dropped."""
    from collections import Counter

    cols = [c for c in table.column_names if c not in ("time", "diff")]
    diffs = table["diff"].to_pylist() if "diff" in table.column_names else [1] * len(table)
    out = Counter()
    for row, d in zip(table.select(cols).to_pylist(), diffs, strict=True):
        out[tuple(row[c] for c in cols)] += d
    return {k: v for k, v in out.items() if v}


@pytest.mark.spark
def test_a_running_pipeline_gains_a_sink_and_operators(spark, tmp_path):
    """Run (aggregate + sink), stop; add a filter + aggregate with a new sink and a second sink
    on the old aggregate (start='now'); a crash after the commit point before the new shard's
    first link, then a restart. The old sink equals batch SQL over all input (its operator
    kept its state), the new one batch SQL over the input since it was added, the from-now
    sink the difference; an old operator's changed definition is refused."""
    from pyspark.sql import functions as F

    from headrace.pipeline.errors import PipelineError
    from headrace.testing.queries import (
        batch_result,
        encode_entries,
        produce_entries,
        rows_equal,
    )

    root, ckpt = str(tmp_path / "store"), str(tmp_path / "ck")
    first, later = _rows(1, 80), _rows(2, 80)
    produce_entries(root, "in", encode_entries("bid", first)
                    + encode_entries("bid", first[:10], weight=-1))
    _define(spark, root, ckpt, grown=False).run(until_idle=True, max_runs=1)

    produce_entries(root, "in", encode_entries("bid", later[:40]))
    produce_entries(root, "in", encode_entries("bid", later[40:]))
    crashing = _define(spark, root, ckpt, grown=True)
    link = crashing.driver.link_outputs

    def crash_before_the_new_link(outputs, t, shards):  # the commit point has passed
        link(outputs, t, [s for s in shards if s[0] != "ev.big"])
        raise RuntimeError("crash before linking ev.big")

    crashing.driver.link_outputs = crash_before_the_new_link
    with pytest.raises(PipelineError, match="crash before linking ev.big"):
        crashing.run(until_idle=True)
    assert crashing.persist.upper("ev.progress") == crashing.persist.upper("ev.big") + 1
    p = _define(spark, root, ckpt, grown=True)
    p.run(until_idle=True, max_runs=1)
    assert p.metrics["replayed_batches"] == 1

    def per_auction(s):
        return s["bid"].groupBy("auction").agg(F.count("*").alias("n"),
                                               F.sum("price").alias("s"))

    def big(s):
        return s["bid"].filter(F.col("price") > 1000).groupBy("auction").agg(
            F.count("*").alias("n"), F.max("price").alias("top"))

    net = first[10:] + later
    for shard, rows, query in (("ev.totals", net, per_auction), ("ev.big", later, big)):
        equal, why = rows_equal(p.read_shard(shard), batch_result(spark, {"bid": BID},
                                                                  {"bid": rows}, query))
        assert equal, f"{shard}: {why}"
    changes = dict(_zset(batch_result(spark, {"bid": BID}, {"bid": net}, per_auction)))
    for row, w in _zset(batch_result(spark, {"bid": BID}, {"bid": first[10:]},
                                     per_auction)).items():
        changes[row] = changes.get(row, 0) - w
    assert _zset(p.read_shard("ev.totals_now")) == {k: v for k, v in changes.items() if v}

    with pytest.raises(PipelineError, match="operator 'aggregate\\d+' \\(operator #0\\) does "
                                            "not match the stored operator"):
        _define(spark, root, ckpt, grown=True, top="max").recover()
