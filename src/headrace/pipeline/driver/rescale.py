"""Rescaling: a restart with another ``buckets`` re-buckets the stored state once, then runs on.

State lives per (operator, side, bucket), the bucket being ``pmod(xxhash64(key columns),
buckets)`` (job.bucket_expr). A pipeline restarted with ``buckets=N`` whose state has M buckets
(the progress shard's layout digest, evolve.py) runs, after ``recover`` has replayed any
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

import numpy as np
import pyarrow as pa

from headrace.errors import FormatError, HeadraceError, NotFound
from headrace.pipeline import keys as rowkeys
from headrace.pipeline.evolve import GraphChanged, reconcile
from headrace.pipeline.history import HISTORY_KEY, HISTORY_SINK_KEY, history_sinks
from headrace.pipeline.job import bucket_expr
from headrace.pipeline.plan import Operator, layout_digest, spark_ddl
from headrace.pipeline.progress import (
    GRAPH_KEY,
    LAYOUT_KEY,
    OP_KEY,
    RETIRED_KEY,
    SINK_KEY,
    STATE_KEY,
    commit_progress,
    progress_at,
)
from headrace.pipeline.tasks import (
    CONTROL_SCHEMA,
    KIND,
    PAYLOAD,
    STATE_FILE_BYTES,
    StageSpec,
    control_rows,
    schema_to_bytes,
)

log = logging.getLogger("headrace.pipeline")
RESCALE_KEY = "__rescaled_from"  # binding of a rescale's empty batch: the old bucket count
KILL_ENV = "HEADRACE_TEST_RESCALE_KILL"  # tests: SIGKILL the driver at this point
_OP, _SIDE, _SRC, _NB, _OB = "__hr_op", "__hr_side", "__hr_src", "__hr_nb", "__hr_ob"
_KEY, _VAL, _W = "__hr_key", "__hr_val", "__hr_w"


class RescaleError(HeadraceError):
    """The stored state cannot be re-bucketed (an unknown state layout, a key in the wrong
    bucket)."""


# ---- where an operator's state keys hold its bucket columns ----------------------------------
def bucket_codec(kernel, side: int):
    """(RowCodec of the bucket columns, or None for one global bucket; the byte offset of
    their encoding in each state key: a number, or a function of the keys' bytes). Per kernel
    kind, as its ``route_keys``/``apply`` build the keys."""
    from headrace.pipeline.operators.aggregate import AggregateKernel
    from headrace.pipeline.operators.distinct import DistinctKernel
    from headrace.pipeline.operators.interval import IntervalJoinKernel
    from headrace.pipeline.operators.join import JoinKernel
    from headrace.pipeline.operators.over import OverKernel
    from headrace.pipeline.operators.session import RoutedSessionKernel, SessionKernel

    if isinstance(kernel, AggregateKernel):  # ACC g | MULTISET j j g | DISTINCT j j g v
        return kernel.group_codec, _tagged({0: 1, 1: 3, 2: 3}, "aggregate")
    if isinstance(kernel, RoutedSessionKernel):  # ROWS g
        return kernel.group_codec, _tagged({0: 1}, "session")
    if isinstance(kernel, SessionKernel):  # ROWS|ENDS|NEGATIVE time g
        n = 1 + kernel._time_bytes
        return kernel.group_codec, _tagged({0: n, 1: n, 2: n}, "session")
    if isinstance(kernel, IntervalJoinKernel):  # slot (8 bytes) key
        return (kernel.lkey if side == 0 else kernel.rkey), 8
    if isinstance(kernel, JoinKernel):
        return (kernel.lkey if side == 0 else kernel.rkey), 0
    if isinstance(kernel, DistinctKernel):
        return kernel.codec, 0
    if isinstance(kernel, OverKernel):
        return kernel.part_codec, 0
    raise RescaleError(f"the state of a {type(kernel).__name__} has no known key layout: "
                       "its buckets cannot change; restart with the old buckets")


def _tagged(offsets: dict[int, int], what: str):
    """Offset by the key's first byte (its section tag)."""
    table = np.full(256, -1, np.int64)
    for tag, off in offsets.items():
        table[tag] = off

    def at(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        if np.any(ends <= starts):
            raise FormatError(None, None, f"{what} state: an empty state key")
        off = table[data[starts]]
        if np.any(off < 0):
            i = int(np.argmax(off < 0))
            raise FormatError(None, 0, f"{what} state key {i}: unknown section tag "
                                       f"{int(data[starts[i]])}")
        return off

    return at


def bucket_values(codec, offset, keys: pa.Array) -> pa.Table:
    """The bucket columns encoded inside each state key (``bucket_codec``), decoded."""
    starts, ends, data = rowkeys._binary_parts(keys)
    off = offset(data, starts, ends) if callable(offset) else offset
    lo = starts + (off if isinstance(off, np.ndarray) else np.int64(off))
    cur = lo.copy()
    for f in codec.schema:  # the encoding's end: flag byte, then fixed or 4-byte length + data
        w = rowkeys._fixed_width(f.type)
        _check_inside(cur + 1 + (4 if w is None else w), ends, starts, f.name)
        if w is None:
            lb = data[(cur + 1)[:, None] + np.arange(4)]
            cur = cur + 5 + np.ascontiguousarray(lb).view(">u4").reshape(len(cur)).astype(
                np.int64)
            _check_inside(cur, ends, starts, f.name)
        else:
            cur = cur + 1 + w
    lengths = cur - lo
    offsets = np.zeros(len(lo) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    sliced = rowkeys._make_binary(offsets, data[rowkeys._gather_ranges(lo, lengths)])
    return codec.decode(sliced)


def _check_inside(end: np.ndarray, ends: np.ndarray, starts: np.ndarray, name: str) -> None:
    short = end > ends
    if np.any(short):
        i = int(np.argmax(short))
        raise FormatError(None, int(ends[i] - starts[i]), f"state key {i} ends inside bucket "
                                                          f"column {name!r}")


# ---- the tasks -------------------------------------------------------------------------------
def _scan_task(url: str, stream: str, version: int, cache_dir, spec: StageSpec, side: int,
               names: list[str]):
    """Old buckets (the input's ids) -> their state rows with the decoded bucket columns."""

    def fn(batches):
        from headrace.pipeline.state import BucketLSM
        from headrace.pipeline.workers import open_reader

        codec, offset = bucket_codec(spec.kernel(), side)
        reader = open_reader(url, stream, version, cache_dir)
        for b in batches:
            for bucket in b.column(0).to_pylist():
                for t in BucketLSM(reader, spec.op, side, int(bucket)).scan():
                    n = t.num_rows
                    cols = [pa.array(np.full(n, bucket, np.int32)), t["key"], t["val"], t["w"]]
                    if codec is not None:
                        vals = bucket_values(codec, offset, t["key"].combine_chunks())
                        cols += [vals.column(i) for i in range(vals.num_columns)]
                    yield pa.RecordBatch.from_arrays(
                        [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                         for c in cols], names=[_SRC, _KEY, _VAL, _W, *names])

    return fn


def _write_task(url: str, stream: str, run_prefix: str, old: int):
    """Rows of some new buckets, sorted by (operator, side, new bucket) -> each bucket's state
    as a fresh LSM; control rows only. Streams: one bucket's rows are held at a time (Spark's
    sort spills the rest), so a task's memory is bounded by its largest bucket."""

    def fn(batches):
        from pyspark import TaskContext

        from headrace.pipeline.state import BucketLSM
        from headrace.pipeline.state.zset import consolidate, empty_zset
        from headrace.pipeline.workers import task_store
        from headrace.reservoir import PageRunWriter, ReservoirOptions

        tc = TaskContext.get()
        store = task_store(url)
        before = store.counts()
        writer = PageRunWriter(store, stream=stream, run_id=f"{run_prefix}-p{tc.partitionId()}"
                               f"-a{tc.attemptNumber()}",
                               options=ReservoirOptions(max_file_size=STATE_FILE_BYTES))
        totals = {"rows": 0, "moved": 0}
        held: list[pa.RecordBatch] = []  # the rows of the bucket being gathered
        held_group, written = None, set()

        def write(group, pieces) -> None:
            t = pa.Table.from_batches(pieces)
            z = consolidate(pa.table({"key": t[_KEY], "val": t[_VAL], "w": t[_W]}))
            BucketLSM(None, *group).write_delta(writer, empty_zset(), z)

        for b in batches:
            if not b.num_rows:
                continue
            src, ob = b.column(_SRC).to_numpy(), b.column(_OB).to_numpy()
            if old > 1 and np.any(src != ob):
                i = int(np.argmax(src != ob))
                raise RescaleError(
                    f"state key {b.column(_KEY)[i].as_py()!r} of operator "
                    f"{b.column(_OP)[i].as_py()} side {b.column(_SIDE)[i].as_py()} was stored "
                    f"in bucket {src[i]}, but its decoded bucket columns hash to bucket {ob[i]} "
                    f"of {old}: the key layout is misread; nothing was changed")
            group = np.stack([b.column(_OP).to_numpy(), b.column(_SIDE).to_numpy(),
                              b.column(_NB).to_numpy()], axis=1)
            totals["rows"] += b.num_rows
            totals["moved"] += int(np.count_nonzero(src != group[:, 2]))
            starts = np.flatnonzero(np.r_[True, np.any(group[1:] != group[:-1], axis=1)])
            ends = np.r_[starts[1:], len(group)]
            for a, e in zip(starts.tolist(), ends.tolist(), strict=True):
                g = tuple(int(x) for x in group[a])
                if g != held_group:
                    if held:
                        write(held_group, held)
                    if g in written:
                        raise RescaleError(f"rescale: the rows of (operator, side, bucket) {g} "
                                           "reached the writer out of order")
                    written.add(g)
                    held, held_group = [], g
                held.append(b.slice(a, e - a))
        if held:
            write(held_group, held)
        if not totals["rows"]:
            return
        after = store.counts()
        control = [("run", pickle.dumps(writer.finish(), protocol=pickle.HIGHEST_PROTOCOL)),
                   ("rows", str(totals["rows"]).encode()),
                   ("moved", str(totals["moved"]).encode()),
                   ("metrics", json.dumps({k: after[k] - before[k] for k in after}).encode())]
        yield control_rows(control, CONTROL_SCHEMA)

    return fn


# ---- the driver ------------------------------------------------------------------------------
def recover_rescaled(p, recover) -> int:
    """``recover`` (the runner's), with the state re-bucketed first when the pipeline's
    ``buckets`` differ from the stored layout's: the interrupted batch replays with the old
    layout, then the rescale commits as an empty batch. Returns the time to continue at."""
    upper = p.persist.upper(p.progress_shard) or 0
    if not upper:
        return recover()
    stored = progress_at(p.persist, p.progress_shard, upper - 1)
    if RESCALE_KEY in stored:  # a rescale's empty batch: its outputs are empty links
        for shard, schema in p._outputs():
            if (p.persist.upper(shard) or 0) == upper - 1:
                p.persist.open_writer(shard).link_parts([], upper - 1, upper, schema)
    try:
        evo = reconcile(stored, p.nodes, p.sinks, buckets=p.buckets, backend=p.state_backend,
                        legacy_fingerprint=p.fingerprint, pipeline=p.name)
    except GraphChanged:
        return recover()  # which refuses it, as before
    old = evo.rescale_from
    history = [s.shard for s in history_sinks(p.sinks, evo.new_sinks)]
    if old is not None and history:
        raise RescaleError(f"pipeline {p.name!r}: new sink(s) {history} start from the "
                           f"queue's history and the state is re-bucketed from {old} to "
                           f"{p.buckets} buckets in the same restart: restart once with "
                           f"buckets={old} first (nothing was changed)")
    if old is None and not _uncommitted_rescale(p, stored):
        return recover()
    target = p.buckets
    if old is not None:
        p.buckets = old  # replay what was interrupted with the layout it ran with
    try:
        recover()
    finally:
        p.buckets = target
    rescale(p, p.buckets if old is None else old)
    return p.time


def _marker_key(p) -> str:
    return f"{p.name}.rescale.json"


def _uncommitted_rescale(p, stored: dict[str, int]) -> bool:
    """Whether a rescale's checkpoint landed without its progress commit: the state's newest
    checkpoint then has the new layout, which the committed (old) one's batches would write
    over (a restart that asks for the rescale again redoes it anyway)."""
    if p.state_backend != "reservoir" or STATE_KEY not in stored:
        return False
    try:
        marker = json.loads(p.store.get(_marker_key(p)).data)
    except NotFound:
        return False
    except ValueError as e:
        raise RescaleError(f"rescale marker {_marker_key(p)!r} is not valid JSON: {e}") from e
    if marker.get("state_version") != stored[STATE_KEY]:
        return False  # written by a rescale that committed (or by an older one)
    if p.storage().version <= stored[STATE_KEY]:
        return False  # it stopped before its checkpoint
    log.warning("pipeline %r: a rescale to %s buckets stopped after its state checkpoint and "
                "before its commit; rewriting the state with %d buckets", p.name,
                marker.get("to"), p.buckets)
    return True


def rescale(p, old: int) -> None:
    """Re-bucket the committed state from ``old`` to ``p.buckets`` buckets and commit it as an
    empty batch at ``p.time`` (after ``recover``)."""
    t0 = time.perf_counter()
    before = p.store.counts()
    new, t = p.buckets, p.time
    version = p.bindings.get(STATE_KEY)
    ops = [n for n in p.nodes if isinstance(n, Operator) and n.state_sides]
    rows = moved = 0
    task_requests: dict[str, int] = {}
    if version is not None and ops:
        storage = p.storage()
        try:
            control = _run_job(p, ops, version, old, new, t)
        except Exception as e:  # a Spark error wraps the task's several times
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip().startswith(
                "headrace.")] or [str(e).strip().splitlines()[0] if str(e).strip() else repr(e)]
            raise RescaleError(f"pipeline {p.name!r}: re-bucketing the state from {old} to "
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
        p.store.put(_marker_key(p), json.dumps({"from": old, "to": new,
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
    p._graph_bindings()  # the graph rows (set by recover), now with the new layout
    p._graph.layout = layout_digest(new, p.state_backend)
    graph_keys = (OP_KEY, SINK_KEY, RETIRED_KEY, LAYOUT_KEY, GRAPH_KEY, RESCALE_KEY,
                  HISTORY_KEY, HISTORY_SINK_KEY)  # and a history batch's markers
    bindings = {k: v for k, v in p.bindings.items() if k.split(":", 1)[0] not in graph_keys}
    if version is not None:
        bindings[STATE_KEY] = int(version)
    bindings.update(p._graph_bindings())
    bindings[RESCALE_KEY] = old
    commit_progress(p.persist, p.progress_shard, t, p.bindings, bindings)
    for shard, schema in p._outputs():
        p.persist.open_writer(shard).link_parts([], t, t + 1, schema)
    p.time, p.bindings = t + 1, bindings
    seconds = time.perf_counter() - t0
    counts = p.store.counts()
    requests = {k: counts.get(k, 0) - before.get(k, 0) + task_requests.get(k, 0)
                for k in sorted(set(counts) | set(task_requests))}
    p.metrics["rescales"] += 1
    p.metrics["rescale_rows"] += rows
    p.metrics["rescale_rows_moved"] += moved
    p.metrics["rescale_seconds"] += seconds
    p.last_rescale = {"time": t, "from": old, "to": new, "rows": rows, "moved": moved,
                      "seconds": round(seconds, 3), "requests": requests}
    log.info("pipeline %r: state re-bucketed %d -> %d buckets at t=%d: %d rows, %d moved, "
             "%.3f s", p.name, old, new, t, rows, moved, seconds)


def _run_job(p, ops: list[Operator], version: int, old: int, new: int, t: int) -> pa.Table:
    """The one Spark job: scan old buckets, bucket anew, write new buckets; control rows."""
    from functools import reduce

    from pyspark.sql import functions as F

    frames = []
    for node in ops:
        spec = StageSpec(op=node.op, kind=node.kind,
                         inputs=[schema_to_bytes(s.schema) for s in node.sources],
                         output=schema_to_bytes(node.schema), params=node.params)
        kernel = node.kernel()
        for side in range(node.state_sides):
            codec, _ = bucket_codec(kernel, side)
            cols = [] if codec is None else list(codec.columns)
            if cols != list(node.bucket_columns[side]):
                raise RescaleError(f"operator {node.name!r} side {side}: its state keys hold "
                                   f"{cols}, its rows are bucketed by "
                                   f"{node.bucket_columns[side]}; cannot re-bucket")
            names = [f"__hr_c{i}" for i in range(len(cols))]
            fields = [pa.field(n, f.type) for n, f in zip(names, codec.schema, strict=True)] \
                if codec is not None else []
            ddl = spark_ddl(pa.schema([pa.field(_SRC, pa.int32()), pa.field(_KEY, pa.binary()),
                                       pa.field(_VAL, pa.binary()), pa.field(_W, pa.int64()),
                                       *fields]))
            scanned = p.spark.range(0, old, 1, max(1, min(old, p.partitions))).mapInArrow(
                _scan_task(p.root, p.stream, version, p.cache_dir, spec, side, names), ddl)
            frames.append(scanned.select(
                F.lit(node.op).alias(_OP), F.lit(side).alias(_SIDE), _SRC, _KEY, _VAL, _W,
                bucket_expr(names, new).alias(_NB), bucket_expr(names, old).alias(_OB)))
    rows = reduce(lambda a, b: a.unionByName(b), frames).repartition(
        p.partitions, _OP, _SIDE, _NB).sortWithinPartitions(_OP, _SIDE, _NB)
    return rows.mapInArrow(_write_task(p.root, p.stream, f"rescale{t}-{uuid.uuid4().hex[:8]}",
                                       old), spark_ddl(CONTROL_SCHEMA)).toArrow()


def _kill_point(name: str) -> None:
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
