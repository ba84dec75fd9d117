"""Control rows: the only rows of a micro-batch that reach the driver (driver/absorb.py folds
them).

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

import pyarrow as pa

from headrace.pipeline.names import KIND, PAYLOAD, W

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
