"""The rescale job's tasks (driver/rescale.py runs the job): scan the old buckets' state with
the decoded bucket columns of each key, and write the rows of each new bucket as a fresh LSM.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
from pyspark import TaskContext

from headrace.pipeline.encoding import rowkeys
from headrace.pipeline.errors import RescaleError
from headrace.pipeline.exec.control import CONTROL_SCHEMA, control_rows
from headrace.pipeline.exec.tasks import STATE_FILE_BYTES, StageSpec
from headrace.pipeline.exec.workers import open_reader, task_store
from headrace.pipeline.operators.kernel import KeyLayout, Rebucketable
from headrace.pipeline.state import BucketLSM
from headrace.pipeline.state.rows import empty_zset, sorted_zset
from headrace.reservoir import PageRunWriter, ReservoirOptions

# the job's columns: operator, side, old bucket (stored), new bucket, old bucket (hashed again)
OP, SIDE, SRC, NB, OB = "__hr_op", "__hr_side", "__hr_src", "__hr_nb", "__hr_ob"
KEY, VAL, W = "__hr_key", "__hr_val", "__hr_w"


def key_layout(kernel, side: int) -> KeyLayout:
    """Where the state keys of ``kernel``'s side ``side`` hold its bucket columns; a kernel
    that does not say cannot have its state re-bucketed."""
    if not isinstance(kernel, Rebucketable):
        raise RescaleError(f"the state of a {type(kernel).__name__} has no known key layout: "
                           "its buckets cannot change; restart with the old buckets")
    return kernel.key_layout(side)


def scan_task(url: str, stream: str, version: int, cache_dir, spec: StageSpec, side: int,
               names: list[str]):
    """Old buckets (the input's ids) -> their state rows with the decoded bucket columns."""

    def fn(batches):
        codec, offset = key_layout(spec.kernel(), side)
        reader = open_reader(url, stream, version, cache_dir)
        for b in batches:
            for bucket in b.column(0).to_pylist():
                for t in BucketLSM(reader, spec.op, side, int(bucket)).scan():
                    n = t.num_rows
                    cols = [pa.array(np.full(n, bucket, np.int32)), t["key"], t["val"], t["w"]]
                    if codec is not None:
                        vals = rowkeys.decode_columns_at(codec, offset, t["key"].combine_chunks())
                        cols += [vals.column(i) for i in range(vals.num_columns)]
                    yield pa.RecordBatch.from_arrays(
                        [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                         for c in cols], names=[SRC, KEY, VAL, W, *names])

    return fn


def write_task(url: str, stream: str, run_prefix: str, old: int):
    """Rows of some new buckets, sorted by (operator, side, new bucket) -> each bucket's state
    as a fresh LSM; control rows only. Streams: one bucket's rows are held at a time (Spark's
    sort spills the rest), so a task's memory is bounded by its largest bucket."""

    def fn(batches):
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
            z = sorted_zset(pa.table({"key": t[KEY], "val": t[VAL], "w": t[W]}))
            BucketLSM(None, *group).write_delta(writer, empty_zset(), z)

        for b in batches:
            if not b.num_rows:
                continue
            src, ob = b.column(SRC).to_numpy(), b.column(OB).to_numpy()
            if old > 1 and np.any(src != ob):
                i = int(np.argmax(src != ob))
                raise RescaleError(
                    f"state key {b.column(KEY)[i].as_py()!r} of operator "
                    f"{b.column(OP)[i].as_py()} side {b.column(SIDE)[i].as_py()} was stored "
                    f"in bucket {src[i]}, but its decoded bucket columns hash to bucket {ob[i]} "
                    f"of {old}: the key layout is misread; nothing was changed")
            group = np.stack([b.column(OP).to_numpy(), b.column(SIDE).to_numpy(),
                              b.column(NB).to_numpy()], axis=1)
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
