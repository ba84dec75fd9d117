"""Rescaling: a restart with another ``buckets`` re-buckets the stored state once, then runs on.

State lives per (operator, side, bucket), the bucket being ``pmod(xxhash64(key columns),
buckets)`` (driver/job.bucket_expr). A pipeline restarted with ``buckets=N`` whose state has M buckets
(the progress shard's layout digest, plan/evolve.py) runs, after ``recover`` has replayed any
interrupted batch with the old layout, one Spark job:

1. per old (operator, side, bucket) a task scans the bucket's LSM at the committed state version
   and decodes each state key's bucket columns (``bucket_values``: where they sit in the key is
   per operator kind) to typed columns;
2. Spark computes each row's new bucket with the batch path's own expression — and its old one,
   which must be the bucket the row was read from (a check of the key decoding on every row);
3. rows are shuffled by (operator, side, new bucket) and sorted by it within each task (Spark's
   sort spills, so a task holds one bucket's rows at a time); per new bucket a task writes the
   rows as a fresh LSM (one run of normal pages) and returns its page run as a control row.

No state row reaches the driver. The driver then deletes every page of the stateful operators
from the state (the old layout's ids collide with the new one's), absorbs the runs, checkpoints
(one state PUT) and commits the progress at time t with the new layout digest: an *empty batch*
(no queue entry consumed, the ``RESCALE_KEY`` binding marks it) whose outputs are empty links.
A SIGKILL before the progress commit leaves the old layout committed (the restart redoes the
rescale); after it, the new one. A marker object written before the checkpoint lets a restart
that no longer asks for the rescale tell a landed but uncommitted rescale checkpoint apart from
a batch's, and rewrite the state with the committed layout first. See docs/pipeline.md.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import time
import uuid
from collections.abc import Callable
from functools import reduce

import numpy as np
import pyarrow as pa

from headrace.errors import NotFound
from headrace.pipeline.driver.batch import BatchDriver
from headrace.pipeline.driver.history import HISTORY_KEY, HISTORY_SINK_KEY, history_sinks
from headrace.pipeline.driver.job import bucket_expr
from headrace.pipeline.encoding.ipc import schema_to_bytes
from headrace.pipeline.encoding.types import spark_ddl
from headrace.pipeline.errors import GraphChanged, RescaleError
from headrace.pipeline.exec.control import CONTROL_SCHEMA
from headrace.pipeline.exec.rescale_tasks import (
    KEY,
    NB,
    OB,
    OP,
    SIDE,
    SRC,
    VAL,
    W,
    key_layout,
    scan_task,
    write_task,
)
from headrace.pipeline.exec.tasks import StageSpec
from headrace.pipeline.names import KIND, PAYLOAD
from headrace.pipeline.plan.evolve import reconcile
from headrace.pipeline.plan.nodes import Operator, layout_digest
from headrace.pipeline.plan.progress import (
    GRAPH_KEY,
    LAYOUT_KEY,
    OP_KEY,
    RETIRED_KEY,
    SINK_KEY,
    STATE_KEY,
    commit_progress,
    progress_at,
)

log = logging.getLogger("headrace.pipeline")
RESCALE_KEY = "__rescaled_from"  # binding of a rescale's empty batch: the old bucket count
KILL_ENV = "HEADRACE_TEST_RESCALE_KILL"  # tests: SIGKILL the driver at this point


def recover_rescaled(d: BatchDriver, recover: Callable[[], int]) -> int:
    """``recover`` (restart.recover_outputs), with the state re-bucketed first when the pipeline's
    ``buckets`` differ from the stored layout's: the interrupted batch replays with the old
    layout, then the rescale commits as an empty batch. Returns the time to continue at."""
    upper = d.persist.upper(d.progress_shard) or 0
    if not upper:
        return recover()
    stored = progress_at(d.persist, d.progress_shard, upper - 1)
    if RESCALE_KEY in stored:  # a rescale's empty batch: its outputs are empty links
        for shard, schema in d.outputs():
            if (d.persist.upper(shard) or 0) == upper - 1:
                d.persist.open_writer(shard).link_parts([], upper - 1, upper, schema)
    try:
        evo = reconcile(stored, d.nodes, d.sinks, buckets=d.buckets, backend=d.state_backend,
                        legacy_fingerprint=d.fingerprint, pipeline=d.name)
    except GraphChanged:
        return recover()  # which refuses it, as before
    old = evo.rescale_from
    history = [s.shard for s in history_sinks(d.sinks, evo.new_sinks)]
    if old is not None and history:
        raise RescaleError(f"pipeline {d.name!r}: new sink(s) {history} start from the "
                           f"queue's history and the state is re-bucketed from {old} to "
                           f"{d.buckets} buckets in the same restart: restart once with "
                           f"buckets={old} first (nothing was changed)")
    if old is None and not _uncommitted_rescale(d, stored):
        return recover()
    target = d.buckets
    if old is not None:
        d.buckets = old  # replay what was interrupted with the layout it ran with
    try:
        recover()
    finally:
        d.buckets = target
    rescale(d, d.buckets if old is None else old)
    return d.time


def _marker_key(d: BatchDriver) -> str:
    return f"{d.name}.rescale.json"


def _uncommitted_rescale(d: BatchDriver, stored: dict[str, int]) -> bool:
    """Whether a rescale's checkpoint landed without its progress commit: the state's newest
    checkpoint then has the new layout, which the committed (old) one's batches would write
    over (a restart that asks for the rescale again redoes it anyway)."""
    if d.state_backend != "reservoir" or STATE_KEY not in stored:
        return False
    try:
        marker = json.loads(d.store.get(_marker_key(d)).data)
    except NotFound:
        return False
    except ValueError as e:
        raise RescaleError(f"rescale marker {_marker_key(d)!r} is not valid JSON: {e}") from e
    if marker.get("state_version") != stored[STATE_KEY]:
        return False  # written by a rescale that committed (or by an older one)
    if d.storage().version <= stored[STATE_KEY]:
        return False  # it stopped before its checkpoint
    log.warning("pipeline %r: a rescale to %s buckets stopped after its state checkpoint and "
                "before its commit; rewriting the state with %d buckets", d.name,
                marker.get("to"), d.buckets)
    return True


def rescale(d: BatchDriver, old: int) -> None:
    """Re-bucket the committed state from ``old`` to ``d.buckets`` buckets and commit it as an
    empty batch at ``d.time`` (after ``recover``)."""
    t0 = time.perf_counter()
    before = d.store.counts()
    new, t = d.buckets, d.time
    version = d.bindings.get(STATE_KEY)
    ops = [n for n in d.nodes if isinstance(n, Operator) and n.state_sides]
    rows = moved = 0
    task_requests: dict[str, int] = {}
    if version is not None and ops:
        storage = d.storage()
        try:
            control = _run_job(d, ops, version, old, new, t)
        except Exception as e:  # a Spark error wraps the task's several times
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip().startswith(
                "headrace.")] or [str(e).strip().splitlines()[0] if str(e).strip() else repr(e)]
            raise RescaleError(f"pipeline {d.name!r}: re-bucketing the state from {old} to "
                               f"{new} buckets failed (nothing was committed): "
                               f"{lines[-1][:500]}") from e
        runs = [pickle.loads(v) for k, v in zip(control[KIND].to_pylist(),
                                                 control[PAYLOAD].to_pylist(), strict=True)
                if k == "run"]
        for k, v in zip(control[KIND].to_pylist(), control[PAYLOAD].to_pylist(), strict=True):
            if k == "rows":
                rows += int(v)
            elif k == "moved":
                moved += int(v)
            elif k == "metrics":
                for name, n in json.loads(v).items():
                    task_requests[name] = task_requests.get(name, 0) + n
        d.store.put(_marker_key(d), json.dumps({"from": old, "to": new,
                                                "state_version": version}).encode())
        _kill_point("before_checkpoint")
        ids = storage.state().ids
        ordinals = np.array([n.op for n in ops], np.int64)
        session = storage.session()  # the old layout's pages: the new one reuses their ids
        for pid in ids[np.isin(ids >> 54, ordinals)].tolist():
            session.delete(pid)
        session.commit()
        storage.absorb(runs)
        # a restart may redo (or undo) the rescale from the old version: keep it readable
        version = storage.checkpoint(keep_from=version)
        _kill_point("after_checkpoint")
    d.graph_bindings()  # the graph rows (set by recover), now with the new layout
    d.graph.layout = layout_digest(new, d.state_backend)
    graph_keys = (OP_KEY, SINK_KEY, RETIRED_KEY, LAYOUT_KEY, GRAPH_KEY, RESCALE_KEY,
                  HISTORY_KEY, HISTORY_SINK_KEY)  # and a history batch's markers
    bindings = {k: v for k, v in d.bindings.items() if k.split(":", 1)[0] not in graph_keys}
    if version is not None:
        bindings[STATE_KEY] = int(version)
    bindings.update(d.graph_bindings())
    bindings[RESCALE_KEY] = old
    commit_progress(d.persist, d.progress_shard, t, d.bindings, bindings)
    for shard, schema in d.outputs():
        d.persist.open_writer(shard).link_parts([], t, t + 1, schema)
    d.time, d.bindings = t + 1, bindings
    seconds = time.perf_counter() - t0
    counts = d.store.counts()
    requests = {k: counts.get(k, 0) - before.get(k, 0) + task_requests.get(k, 0)
                for k in sorted(set(counts) | set(task_requests))}
    d.metrics["rescales"] += 1
    d.metrics["rescale_rows"] += rows
    d.metrics["rescale_rows_moved"] += moved
    d.metrics["rescale_seconds"] += seconds
    d.last_rescale = {"time": t, "from": old, "to": new, "rows": rows, "moved": moved,
                      "seconds": round(seconds, 3), "requests": requests}
    log.info("pipeline %r: state re-bucketed %d -> %d buckets at t=%d: %d rows, %d moved, "
             "%.3f s", d.name, old, new, t, rows, moved, seconds)


def _run_job(d: BatchDriver, ops: list[Operator], version: int, old: int, new: int,
             t: int) -> pa.Table:
    """The one Spark job: scan old buckets, bucket anew, write new buckets; control rows."""
    from pyspark.sql import functions as F

    frames = []
    for node in ops:
        spec = StageSpec(op=node.op, kind=node.kind,
                         inputs=[schema_to_bytes(s.schema) for s in node.sources],
                         output=schema_to_bytes(node.schema), params=node.params)
        kernel = node.kernel()
        for side in range(node.state_sides):
            codec, _ = key_layout(kernel, side)
            cols = [] if codec is None else list(codec.columns)
            if cols != list(node.bucket_columns[side]):
                raise RescaleError(f"operator {node.name!r} side {side}: its state keys hold "
                                   f"{cols}, its rows are bucketed by "
                                   f"{node.bucket_columns[side]}; cannot re-bucket")
            names = [f"__hr_c{i}" for i in range(len(cols))]
            fields = [pa.field(n, f.type) for n, f in zip(names, codec.schema, strict=True)] \
                if codec is not None else []
            ddl = spark_ddl(pa.schema([pa.field(SRC, pa.int32()), pa.field(KEY, pa.binary()),
                                       pa.field(VAL, pa.binary()), pa.field(W, pa.int64()),
                                       *fields]))
            scanned = d.spark.range(0, old, 1, max(1, min(old, d.partitions))).mapInArrow(
                scan_task(d.root, d.stream, version, d.cache_dir, spec, side, names), ddl)
            frames.append(scanned.select(
                F.lit(node.op).alias(OP), F.lit(side).alias(SIDE), SRC, KEY, VAL, W,
                bucket_expr(names, new).alias(NB), bucket_expr(names, old).alias(OB)))
    rows = reduce(lambda a, b: a.unionByName(b), frames).repartition(
        d.partitions, OP, SIDE, NB).sortWithinPartitions(OP, SIDE, NB)
    return rows.mapInArrow(write_task(d.root, d.stream, f"rescale{t}-{uuid.uuid4().hex[:8]}",
                                       old), spark_ddl(CONTROL_SCHEMA)).toArrow()


def _kill_point(name: str) -> None:
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
