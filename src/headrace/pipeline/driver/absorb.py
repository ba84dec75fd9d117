"""A micro-batch's control rows (exec/control.py lists the kinds), folded into what the driver
commits: state page runs, snapshot ids, output parts, bad entries, counts, event time, request
metrics and a kernel's refusals."""

from __future__ import annotations

import json
import pickle
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.pipeline.exec.outputs import OutputCollector
from headrace.pipeline.names import KIND, PAYLOAD
from headrace.pipeline.plan.eventtime import parse_control


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
