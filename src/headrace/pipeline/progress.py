"""The progress shard: the pipeline's commit point (the remap of seed 004).

At time t it holds, as rows (source, address): the last queue sequence consumed for each queue,
the state version the batch produced (``STATE_KEY``) and a marker for the operator graph that
wrote it (``GRAPH_KEY:fingerprint``), and per ``with_watermark`` the largest event time seen
(``WM_KEY:node``, µs), from which the next batch's watermark follows. Appending time t is the one atomic step that commits a
micro-batch; everything before it is invisible, everything after it is idempotent.
"""

from __future__ import annotations

import pyarrow as pa

STATE_KEY = "__state_version"
GRAPH_KEY = "__graph"
WM_KEY = "__event_time"


def progress_at(persist, shard: str, t: int) -> dict[str, int]:
    """The bindings committed at time ``t`` ({} before the first batch)."""
    if t < 0:
        return {}
    snap = persist.read_only(shard).snapshot(t)
    return {r["source"]: r["address"] for r in snap.select(["source", "address"]).to_pylist()}


def commit_progress(persist, shard: str, t: int, old: dict[str, int],
                    new: dict[str, int]) -> None:
    """Replace the bindings of t-1 by ``new`` at time t (one part + one CAS)."""
    rows = [(k, v, -1) for k, v in old.items()] + [(k, v, 1) for k, v in new.items()]
    upd = pa.table({"source": pa.array([r[0] for r in rows], pa.string()),
                    "address": pa.array([r[1] for r in rows], pa.int64()),
                    "time": pa.array([t] * len(rows), pa.uint64()),
                    "diff": pa.array([r[2] for r in rows], pa.int64())})
    persist.open_writer(shard).compare_and_append(upd, t, t + 1)
