"""Control rows: the only rows of a micro-batch that reach the driver, and their folding.

Every stage of a micro-batch yields rows of its stage schema — ``KIND``, ``PAYLOAD``, then the
operator's output columns and ``W``. A row with ``KIND`` null is a *data* row (the output delta,
kept on the executors for the next operator); every other row is a small *control* row, the only
thing the driver collects (docs/pipeline.md, "Where data flows"):

- ``"run"``: the pickled :class:`PageRun` of a task's state changes (full reservoir files
  already uploaded by the task, small leftovers inline for the driver to bundle);
- ``"part"``: (shard, PartMeta) — an output part a task uploaded for a sink;
- ``"out"``: (shard, Arrow IPC) — an output too small to be worth a PUT (≤ ``inline_max``
  bytes), which the driver packs with the other tasks' into one part; the driver so holds at
  most tasks × inline_max bytes of rows, whatever the batch size;
- ``"indexes"``: (local+backup backend) JSON {bucket key: new backup snapshot index id};
- ``"bad"``: a pickled summary of bad entries; ``"rows"``: the input count;
- ``"wm"`` / ``"late"``: event-time maxima and late-row counts (plan/eventtime.py);
- ``"batch"``: the run prefix a static-plan task ran with; ``"metrics"``: JSON object-store
  request counts of a task;
- ``"negative"``: pickled {"op", "keys", "what"} — the kernel refused the batch's rows of these
  keys (``NegativeMultiplicity``: a retraction of a row never inserted); their state is left
  unwritten and their output out, and the driver does not commit the batch as it is
  (driver/negative.py).
"""

from __future__ import annotations

import json
import pickle
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.pipeline.exec.outputs import OutputCollector
from headrace.pipeline.names import KIND, PAYLOAD, W
from headrace.pipeline.plan.eventtime import parse_control

CONTROL_SCHEMA = pa.schema([pa.field(KIND, pa.string()), pa.field(PAYLOAD, pa.binary())])


def stage_schema(output: pa.Schema) -> pa.Schema:
    """Control columns first, then the operator's output columns and the weight."""
    return pa.schema([*CONTROL_SCHEMA, *output, pa.field(W, pa.int64())])


def control_rows(control: list[tuple[str, bytes]], full: pa.Schema) -> pa.RecordBatch:
    """(KIND, PAYLOAD) rows in a batch of ``full`` (the stage schema; other columns null)."""
    n = len(control)
    arrays = [pa.array([k for k, _ in control], pa.string()),
              pa.array([p for _, p in control], pa.binary())]
    arrays += [pa.nulls(n, f.type) for f in list(full)[2:]]
    return pa.RecordBatch.from_arrays(arrays, schema=full)


@dataclass
class BatchControl:
    runs: list = field(default_factory=list)  # reservoir PageRuns to absorb
    indexes: dict = field(default_factory=dict)  # local+backup: bucket -> snapshot index id
    outputs: OutputCollector = field(default_factory=OutputCollector)
    bad: int = 0
    bad_examples: list = field(default_factory=list)
    wm: dict = field(default_factory=dict)  # with_watermark node -> largest event time (µs)
    late: int = 0
    task_requests: dict = field(default_factory=lambda: defaultdict(int))
    input_rows: int = 0
    negative: list = field(default_factory=list)  # {"op", "keys", "what"} per refusal

    def first_bad(self) -> str:
        """Where and why the first bad entry (by queue position) was refused."""
        e = min(self.bad_examples, key=lambda x: (x["sequence"], x["index"]))
        where = f"queue {e['queue']!r} sequence {e['sequence']} entry {e['index']}"
        if e["table"] is not None:
            where += f", table {e['table']!r}"
        if e["field"] is not None:
            where += f", field {e['field']!r}"
        return f"{where}: {e['reason']}"


def absorb(rows: pa.Table | None) -> BatchControl:
    """Fold a batch's control rows (None: the job returned none)."""
    c = BatchControl()
    if rows is None:
        return c
    for kind, payload in zip(rows[KIND].to_pylist(), rows[PAYLOAD].to_pylist(), strict=True):
        if kind == "run":
            c.runs.append(pickle.loads(payload))
        elif kind == "indexes":
            c.indexes.update(json.loads(payload))
        elif kind in ("part", "out"):
            c.outputs.add(kind, payload)
        elif kind == "bad":
            summary = pickle.loads(payload)
            c.bad += summary["count"]
            c.bad_examples += summary["examples"]
        elif kind == "rows":
            c.input_rows += int(payload)
        elif kind in ("wm", "late"):
            got = parse_control(payload)
            if got is not None and kind == "wm":
                c.wm[got[0]] = max(got[1], c.wm.get(got[0], got[1]))
            elif got is not None:
                c.late += got[1]
        elif kind == "negative":
            c.negative.append(pickle.loads(payload))
        elif kind == "metrics":
            for k, v in json.loads(payload).items():
                c.task_requests[k] += v
    return c
