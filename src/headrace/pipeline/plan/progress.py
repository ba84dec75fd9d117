"""The progress shard: the pipeline's commit point (the remap of Materialize's persist).

At time t it holds, as rows (source, address): the last queue sequence consumed for each queue,
the state version the batch produced (``STATE_KEY``), per ``with_watermark`` the largest event
time seen (``WM_KEY:node``, µs), from which the next batch's watermark follows, and the graph
that wrote it: one row per operator (``OP_KEY:<ordinal>:<name>``) and per sink
(``SINK_KEY:<shard>``) whose address is a digest of the part's definition and upstream lineage
(``plan.node_digests``), the state layout (``LAYOUT_KEY``), the parts removed earlier whose state
or shard remains (``RETIRED_KEY:op:...``, ``RETIRED_KEY:sink:...``), and the whole graph's
fingerprint (``GRAPH_KEY:fingerprint``, address 0; the only graph marker before per-part
digests, still read). Appending time t is the one atomic step that commits a micro-batch;
everything before it is invisible, everything after it is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from headrace.errors import FormatError

STATE_KEY = "__state_version"
GRAPH_KEY = "__graph"
WM_KEY = "__event_time"
OP_KEY = "__op"
SINK_KEY = "__sink"
LAYOUT_KEY = "__layout"
RETIRED_KEY = "__retired"


@dataclass
class StoredGraph:
    """The graph rows of the bindings. ``layout`` None: written before per-part digests."""

    ops: dict[int, tuple[str, int]] = field(default_factory=dict)  # op -> (name, digest)
    sinks: dict[str, int] = field(default_factory=dict)  # shard -> digest
    retired_ops: dict[int, tuple[str, int]] = field(default_factory=dict)
    retired_sinks: dict[str, int] = field(default_factory=dict)
    layout: int | None = None

    def bindings(self) -> dict[str, int]:
        out = {f"{OP_KEY}:{op}:{name}": d for op, (name, d) in self.ops.items()}
        out.update({f"{SINK_KEY}:{shard}": d for shard, d in self.sinks.items()})
        out.update({f"{RETIRED_KEY}:op:{op}:{name}": d
                    for op, (name, d) in self.retired_ops.items()})
        out.update({f"{RETIRED_KEY}:sink:{shard}": d for shard, d in self.retired_sinks.items()})
        if self.layout is not None:
            out[LAYOUT_KEY] = self.layout
        return out


def _op_entry(key: str, rest: str) -> tuple[int, str]:
    ordinal, _, name = rest.partition(":")
    if not ordinal.isdigit() or not name:
        raise FormatError(f"progress binding {key!r}: want <prefix>:<ordinal>:<operator name>")
    return int(ordinal), name


def stored_graph(bindings: dict[str, int]) -> StoredGraph:
    """The graph rows of committed bindings (the inverse of ``StoredGraph.bindings``)."""
    g = StoredGraph(layout=bindings.get(LAYOUT_KEY))
    for key, value in bindings.items():
        kind, _, rest = key.partition(":")
        if kind == OP_KEY:
            op, name = _op_entry(key, rest)
            g.ops[op] = (name, value)
        elif kind == SINK_KEY:
            g.sinks[rest] = value
        elif kind == RETIRED_KEY and rest.startswith("op:"):
            op, name = _op_entry(key, rest[3:])
            g.retired_ops[op] = (name, value)
        elif kind == RETIRED_KEY and rest.startswith("sink:"):
            g.retired_sinks[rest[5:]] = value
    return g


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
