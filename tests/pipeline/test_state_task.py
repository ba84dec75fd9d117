"""A task's kernel run once over all its buckets (TaskState + Router) against the same kernel
run once per bucket: the same outputs and the same state, batch after batch, through the real
task function on a reservoir; plus the router's refusals and the replacing runs' effect on
the bytes an aggregate writes."""

from __future__ import annotations

import pickle
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from headrace.errors import FormatError
from headrace.pipeline import operators
from headrace.pipeline.encoding.ipc import schema_to_bytes
from headrace.pipeline.exec import tasks
from headrace.pipeline.exec.tasks import StageSpec, TaskContextSpec, run_stage_partition
from headrace.pipeline.names import BUCKET, KIND, PAYLOAD, SIDE, W
from headrace.pipeline.state import BucketLSM
from headrace.pipeline.state.task import Router
from headrace.reservoir import ReservoirReader, ReservoirStorage
from headrace.store import open_store

BUCKETS = 8

AGG_IN = pa.schema([("g", pa.int64()), ("x", pa.int64()), ("y", pa.string())])
AGG = {"by": ["g"], "aggs": {"n": "count", "s": "sum(x)", "lo": "min(x)", "hi": "max(x)",
                             "d": "count_distinct(y)"}}
LEFT = pa.schema([("k", pa.int64()), ("a", pa.int64())])
RIGHT = pa.schema([("k", pa.int64()), ("b", pa.string())])
JOIN = {"how": "left", "on": ["k"]}


class Stage:
    """One operator's state in a reservoir, driven like the runner does: every batch, each of
    ``parts`` tasks gets its buckets' rows, the driver absorbs the runs and checkpoints."""

    def __init__(self, kind: str, schemas: list[pa.Schema], params: dict, parts: int):
        self.dir = tempfile.mkdtemp(prefix="hr-task-state-")
        self.url = self.dir + "/store"
        self.storage = ReservoirStorage.open(open_store(self.url), stream="s.state")
        kernel = operators.build(kind, schemas, params)
        self.spec = StageSpec(op=0, kind=kind, inputs=[schema_to_bytes(s) for s in schemas],
                              output=schema_to_bytes(kernel.output_schema), params=params,
                              emit_rows=True)
        self.parts, self.version, self.t = parts, None, 0
        self.state_bytes: list[int] = []

    def batch(self, table: pa.Table) -> pa.Table:
        """Run one micro-batch; return the output delta, consolidated."""
        ctx = TaskContextSpec(url=self.url, stream="s.state", state_version=self.version,
                              run_prefix=f"t{self.t}", cache_dir=self.dir + "/cache")
        outs, runs = [], []
        part = pc.bit_wise_and(table[BUCKET], self.parts - 1)
        for p in range(self.parts):
            rows = table.filter(pc.equal(part, p))
            for rb in run_stage_partition(iter(rows.to_batches()), self.spec, ctx, p, 0):
                t = pa.Table.from_batches([rb])
                outs.append(t.filter(pc.is_null(t[KIND])).drop_columns([KIND, PAYLOAD]))
                for kind, payload in zip(t[KIND].to_pylist(), t[PAYLOAD].to_pylist(),
                                         strict=True):
                    if kind == "run":
                        runs.append(pickle.loads(payload))
        self.state_bytes.append(sum(len(r.leftover_data) for r in runs))
        self.storage.absorb(runs)
        self.version = self.storage.checkpoint()
        self.t += 1
        out = pa.concat_tables(outs)
        cols = [c for c in out.column_names if c != W]
        g = out.group_by(cols, use_threads=False).aggregate([(W, "sum")])
        return g.filter(pc.not_equal(g[f"{W}_sum"], 0))

    def state(self, sides: int) -> dict:
        """Every bucket's rows: {(side, bucket, key, val): w}."""
        reader = ReservoirReader.open(open_store(self.url), stream="s.state",
                                      version=self.version)
        rows = {}
        for side in range(sides):
            for b in range(BUCKETS):
                for t in BucketLSM(reader, 0, side, b).scan():
                    for k, v, w in zip(*(t[c].to_pylist() for c in ("key", "val", "w")),
                                       strict=True):
                        rows[(side, b, k, v)] = w
        return rows

    def close(self):
        self.storage.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _rows(t: pa.Table) -> list:
    return sorted(map(repr, t.to_pylist()))


def _agg_batch(rng, n: int, keys: int) -> pa.Table:
    g = rng.integers(0, keys, n)
    return pa.table({"g": g, "x": rng.integers(-50, 50, n),
                     "y": pa.array([f"v{v}" for v in rng.integers(0, 4, n)]),
                     W: np.ones(n, np.int64), BUCKET: (g * 7919 % BUCKETS).astype(np.int32)})


def _join_batch(rng, n: int, keys: int) -> pa.Table:
    side = rng.integers(0, 2, n)
    k = rng.integers(0, keys, n).astype(object)
    k[rng.random(n) < 0.05] = None  # NULL keys never match and are never stored
    kk = pa.array(k.tolist(), pa.int64())
    bucket = (pc.fill_null(kk, -1).to_numpy() * 7919 % BUCKETS).astype(np.int32)
    return pa.table({"k": kk, "a": pa.array(np.where(side == 0, rng.integers(0, 9, n), 0)),
                     "b": pa.array([f"r{v}" for v in rng.integers(0, 3, n)]),
                     W: np.ones(n, np.int64), BUCKET: bucket, SIDE: side.astype(np.int32)})


@pytest.mark.parametrize("kind,schemas,params,make,sides", [
    ("aggregate", [AGG_IN], AGG, _agg_batch, 1),
    ("join", [LEFT, RIGHT], JOIN, _join_batch, 2),
])
def test_one_call_per_task_equals_one_call_per_bucket(monkeypatch, kind, schemas, params,
                                                      make, sides):
    rng = np.random.default_rng(11)
    batches = [make(rng, 300 if i == 0 else 60, 120) for i in range(8)]
    # retract some earlier rows: groups lose their min/max, join matches go away
    batches.append(pa.concat_tables([batches[0].slice(0, 40), batches[1].slice(0, 20)])
                   .set_column(3, W, pa.array(np.full(60, -1, np.int64))))
    results = {}
    for mode, per_bucket_limit in (("task", 1 << 20), ("bucket", 0)):
        monkeypatch.setattr(tasks, "TASK_LEVEL_ROWS_PER_BUCKET", per_bucket_limit)
        calls = {"task": 0}
        real = tasks._apply_task

        def counted(*a, real=real, calls=calls):
            calls["task"] += 1
            return real(*a)

        monkeypatch.setattr(tasks, "_apply_task", counted)
        st = Stage(kind, schemas, params, parts=2)
        try:
            outs = [_rows(st.batch(b)) for b in batches]
            results[mode] = (outs, st.state(sides))
        finally:
            st.close()
        assert (calls["task"] > 0) == (mode == "task")
    assert results["task"][0] == results["bucket"][0]
    assert results["task"][1] == results["bucket"][1]
    assert any(results["task"][0])  # the batches did produce output


def test_aggregate_updates_write_one_row_per_changed_group():
    """Updating a group retracts its old accumulator row and inserts the new one; the task
    knows the group's row whole (it looked it up), so its run holds one replacing row per
    group instead of the pair."""
    rng = np.random.default_rng(3)
    st = Stage("aggregate", [AGG_IN], {"by": ["g"], "aggs": {"n": "count", "s": "sum(x)"}},
               parts=1)
    try:
        first = _agg_batch(rng, 4000, 4000)
        first = first.set_column(0, "g", pa.array(rng.permutation(4000)))
        first = first.set_column(3, W, pa.array(np.ones(4000, np.int64)))
        first = first.set_column(4, BUCKET, pa.array(
            (first["g"].to_numpy() * 7919 % BUCKETS).astype(np.int32)))
        st.batch(first)  # every group exists once
        before = st.state(1)
        b = _agg_batch(rng, 400, 4000)
        b = b.set_column(3, W, pa.array(np.ones(400, np.int64)))
        st.batch(b)
        changed = len(set(b["g"].to_pylist()))
        reader = ReservoirReader.open(open_store(st.url), stream="s.state",
                                      version=st.version)
        new_rows = 0
        for bucket in range(BUCKETS):
            lsm = BucketLSM(reader, 0, 0, bucket)
            newest = lsm.root.runs[-1]
            assert newest.kind == 1  # a replacing run
            new_rows += newest.rows
        assert new_rows == changed
        after = st.state(1)
        assert len(after) == len(before)  # one live row per group, old values replaced
    finally:
        st.close()


def test_router_refuses_keys_it_cannot_place():
    keys = pa.array([b"a", b"b", b"a"], pa.binary())
    with pytest.raises(FormatError, match="two buckets"):
        Router([(keys, np.array([1, 2, 3]))])
    r = Router([(keys, np.array([1, 2, 1])), (pa.array([None, b"c"], pa.binary()),
                                              np.array([5, 4]))])
    assert r.route(pa.array([b"c", b"a", b"b"], pa.binary())).tolist() == [4, 1, 2]
    with pytest.raises(FormatError, match="route_keys missed"):
        r.route(pa.array([b"z"], pa.binary()))
