"""Retractions of rows that were never inserted: refused where a kernel sees them, traced to the
queue entries that carry them, and handled as bad entries (the rule: docs/guarantees.md).

Spark SQL has no negative multiplicities, so a retraction of a row that was never inserted has
no answer to match: it is a bad entry. The hot path pays only where a multiplicity is kept:
each kernel checks the ones it reads and raises ``NegativeMultiplicity`` before writing state
(operators/*); the task leaves that apply's state unwritten and reports (operator, keys) as a
control row (exec/tasks.py). No row carries its entry's position through the operators.

What follows runs on the driver, and only for a batch some task reported:

1. trace: the batch's entries are decoded again, with their positions; their rows of negative
   weight go through the stateless steps up to each reporting operator with the weight
   replaced by an id of their entry (every step passes the weight through unchanged), and those
   whose bucket key the operator reported are the candidates. A key with no candidate came
   through a stateful operator (an outer join passes a NULL-key row on, unstored): the batch
   fails naming the operator and key.
2. blame: a key with one candidate blames it. With several, dry runs of the batch (no state, no
   output written) keep a prefix of them in queue order, bisecting for the first whose keeping
   makes the key refused again.
3. ``on_bad_entry="fail"``: ImpossibleRetraction names the first blamed entry; nothing is
   committed. ``"dead_letter"``: the batch runs again without the blamed entries — that run is
   what commits — and they go to the dead-letter shard; again while a run still reports (each
   round refuses at least one more entry).

An attempt that is not committed leaves nothing visible: its tasks' state runs and output parts
are never absorbed nor linked (each attempt has its own run prefix), and a local+backup bucket
restores its committed snapshot when it is opened next.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.pipeline.driver.absorb import BatchControl
from headrace.pipeline.driver.job import range_batches
from headrace.pipeline.encoding import rowkeys
from headrace.pipeline.encoding.ipc import table_to_ipc
from headrace.pipeline.errors import ImpossibleRetraction, PipelineError
from headrace.pipeline.exec.decode import DEAD_LETTER_SCHEMA, Decoder
from headrace.pipeline.exec.queue_source import read_batches
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.plan.nodes import Map, Node, Operator, Union

REASON = "retracts a row that was never inserted"
MAX_ROUNDS = 32  # dead_letter: runs of a batch that still reports before giving up
_PID = f"{PREFIX}entry_id"


class Driver(Protocol):
    """What settling a batch needs of the driver (driver/batch.py's BatchDriver, which calls
    ``settle``; this module does not import it)."""

    spark: Any
    name: str
    root: str
    store: Any
    nodes: list[Node]
    on_bad_entry: str
    dead_letter_shard: str | None
    metrics: dict[str, float]

    def decoder(self) -> Decoder: ...

    def run_stages(self, entries_df, state_version: int | None, *, t: int, write_state: bool,
                   shards: set[str], watermark: int | None = None,
                   nodes: list[Node] | None = None, settle: bool = True) -> BatchControl: ...

    def dry_stages(self, entries_df, state_version: int | None, *, t: int,
                   watermark: int | None, nodes: list[Node]) -> BatchControl: ...


@dataclass(frozen=True)
class Blamed:
    """An entry that carries a refused retraction, and where it was refused."""

    queue: str
    sequence: int
    index: int
    table: str | None = field(compare=False)
    entry: bytes | None = field(compare=False)  # NULL: a columnar entry (read from the queue)
    operator: str = field(compare=False)
    key: object = field(compare=False)  # the bucket key's values
    what: str | None = field(compare=False)

    @property
    def position(self) -> tuple[str, int, int]:
        return self.queue, self.sequence, self.index

    def order(self) -> tuple:
        return self.sequence, self.index, self.queue

    def where(self) -> str:
        return (f"queue {self.queue!r} sequence {self.sequence} entry {self.index}"
                + (f", table {self.table!r}" if self.table is not None else ""))

    def reason(self) -> str:
        return (f"{REASON} (operator {self.operator!r}, key {self.key}"
                + (f": {self.what})" if self.what else ")"))


def settle(d: Driver, entries, result: BatchControl, *, state_version: int | None, t: int,
           write_state: bool, shards: set[str], watermark: int | None,
           nodes: list[Node] | None) -> BatchControl:
    """``result`` (a batch's absorbed control rows) has refusals: raise ImpossibleRetraction
    (fail), or return the result of the batch run without the entries that carry them, those
    entries added to the dead-letter shard's output (dead_letter)."""
    batch = _Batch(d, entries, d.nodes if nodes is None else nodes, state_version, t,
                   watermark)
    refused: dict[tuple, Blamed] = {}
    entries_seen = result.input_rows  # the first run's count: every entry of the batch
    for _ in range(MAX_ROUNDS):
        blamed = batch.blame(result.negative, refused)
        if d.on_bad_entry == "fail":
            first = min(blamed.values(), key=Blamed.order)
            raise ImpossibleRetraction(
                f"{first.where()}: {first.reason()} ({len(blamed)} such entries in this "
                "batch; nothing was committed; Pipeline(on_bad_entry='dead_letter') keeps them "
                "in a dead-letter shard instead)", queue=first.queue, sequence=first.sequence,
                index=first.index, operator=first.operator, key=first.key)
        refused.update(blamed)
        d.metrics["late_rows"] -= result.late  # the next run counts them again
        result = d.run_stages(batch.without(refused), state_version, t=t,
                              write_state=write_state, shards=shards, watermark=watermark,
                              nodes=nodes, settle=False)
        if not result.negative:
            result.input_rows = entries_seen
            return _dead_letter(d, result, list(refused.values()), shards, t)
    raise PipelineError(f"pipeline {d.name!r}: batch t={t} still refuses retractions after "
                        f"{MAX_ROUNDS} runs without {len(refused)} entries; nothing was "
                        "committed")


@dataclass
class _Batch:
    """One batch's entries and how it runs: what tracing, dry runs and re-runs share."""

    d: Driver
    entries: Any  # DataFrame of the batch's entries
    nodes: list
    state_version: int | None
    t: int
    watermark: int | None

    def without(self, positions) -> object:
        """The entries but those at ``positions`` ((queue, sequence, index))."""
        from pyspark.sql import functions as F

        if not positions:
            return self.entries
        drop = self.d.spark.createDataFrame(sorted(positions),
                                            "queue string, sequence long, index int")
        return self.entries.join(F.broadcast(drop), ["queue", "sequence", "index"],
                                 "left_anti").select(*self.entries.columns)

    def blame(self, negative: list[dict], refused: dict) -> dict[tuple, Blamed]:
        """The entries that carry the refusals ``negative`` (not one of ``refused``)."""
        flagged: dict[int, dict[bytes, str | None]] = defaultdict(dict)
        for r in negative:  # a report's words describe its first key
            for k in r["keys"]:
                flagged[r["op"]].setdefault(k, r["what"] if k == r["keys"][0] else None)
        kept = self.without(refused)
        cands = self.trace(kept, flagged)
        for op, ks in flagged.items():
            for k, what in ks.items():
                if not cands.get((op, k)):
                    node = self._op(op)
                    raise PipelineError(
                        f"operator {node.name!r}, key {_key(node, k)}: "
                        f"{what or 'a multiplicity below zero'}; no entry of batch t={self.t} "
                        "carries it through stateless steps: it came through a stateful "
                        "operator (an outer join passes a retracted NULL-key row on, never "
                        "stored). Nothing was committed")
        blamed: dict[tuple, Blamed] = {}
        search: dict[tuple, tuple[int, int]] = {}  # keeping [:lo] passes, [:hi] is refused
        for g, c in cands.items():
            if len(c) == 1:
                blamed[c[0].position] = c[0]
            else:
                search[g] = (0, len(c))
        while any(hi - lo > 1 for lo, hi in search.values()):
            mids = {g: (lo + hi) // 2 for g, (lo, hi) in search.items() if hi - lo > 1}
            drop = {*refused, *blamed, *(e.position for g, m in mids.items()
                                         for e in cands[g][m:])}
            again = self.dry(self.without(drop))
            for g, m in mids.items():
                lo, hi = search[g]
                search[g] = (lo, m) if g in again else (m, hi)
        for g, (_, hi) in search.items():
            blamed[cands[g][hi - 1].position] = cands[g][hi - 1]
        return blamed

    def _op(self, op: int) -> Operator:
        return next(n for n in self.nodes if isinstance(n, Operator) and n.op == op)

    def dry(self, entries) -> set[tuple[int, bytes]]:
        """(operator, key) refused by a run over ``entries`` that writes nothing."""
        c = self.d.dry_stages(entries, self.state_version, t=self.t, watermark=self.watermark,
                              nodes=self.nodes)
        return {(r["op"], k) for r in c.negative for k in r["keys"]}

    def trace(self, entries, flagged: dict[int, dict[bytes, str | None]]) -> dict:
        """{(operator, key): the entries (queue order) whose rows of negative weight reach the
        operator through stateless steps with that bucket key}."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        decoder = self.d.decoder()
        parsed = decoder.parse(entries).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            located = decoder.located(parsed)
            pid = F.xxhash64("queue", "sequence", "index")  # the entry's id, in place of W
            frames, positions = {}, []
            for node in decoder.sources:
                neg = located[node.name].filter(F.col(W) < 0)
                frames[node.name] = neg.select(*[F.col(f"`{c}`") for c in node.schema.names],
                                               pid.alias(W))
                positions.append(neg.select(F.lit(node.table).alias("table"), "queue",
                                            "sequence", "index", "entry", pid.alias(_PID)))
            for node in self.nodes:
                if isinstance(node, Map) and node.source.name in frames:
                    frames[node.name] = node.apply(frames[node.source.name])
                elif isinstance(node, Union):
                    cols = [F.col(f"`{c}`") for c in node.schema.names] + [F.col(W)]
                    got = [frames[s.name].select(*cols) for s in node.sources
                           if s.name in frames]
                    if got:
                        frames[node.name] = reduce(lambda a, b: a.unionByName(b), got)
            matches = []
            for node in self.nodes:
                if not isinstance(node, Operator) or node.op not in flagged:
                    continue
                for i, src in enumerate(node.sources):
                    if src.name in frames:
                        frame = _not_late(node, i, frames[src.name], self.watermark)
                        matches.append(frame.mapInArrow(
                            _match(node.op, src.schema, node.bucket_columns[i],
                                   list(flagged[node.op])), "op int, key binary, pid long"))
            found = (reduce(lambda a, b: a.union(b), matches).distinct().collect()
                     if matches else [])
            pids = sorted({r["pid"] for r in found})
            where = (reduce(lambda a, b: a.union(b), positions)
                     .filter(F.col(_PID).isin(pids)).distinct().collect() if pids else [])
        finally:
            parsed.unpersist()
        of_pid = defaultdict(list)
        for r in where:
            of_pid[r[_PID]].append(r)
        cands: dict[tuple, dict] = defaultdict(dict)
        for r in found:
            node = self._op(r["op"])
            for e in of_pid[r["pid"]]:
                b = Blamed(e["queue"], e["sequence"], e["index"], e["table"],
                           None if e["entry"] is None else bytes(e["entry"]), node.name,
                           _key(node, r["key"]), flagged[r["op"]].get(bytes(r["key"])))
                cands[(r["op"], bytes(r["key"]))][b.position] = b
        return {g: sorted(c.values(), key=Blamed.order) for g, c in cands.items()}


def _key(node: Operator, key: bytes):
    """An operator's bucket key, decoded: {column: value}, or "(global)" without one."""
    columns = node.bucket_columns[0]
    if not columns:
        return "(global)"
    codec = rowkeys.RowCodec(node.sources[0].schema, columns, normalize=True)
    return codec.decode(pa.array([key], pa.binary())).to_pylist()[0]


def _not_late(node: Operator, side: int, frame, watermark: int | None):
    """``frame`` without the rows the operator drops as late (eventtime.prepare)."""
    from pyspark.sql import functions as F

    if node.expiry is None or watermark is None:
        return frame
    column = node.expiry["columns"][side]
    offset = node.expiry["offsets_us"][side]
    late = F.coalesce(F.unix_micros(F.col(f"`{column}`")) <= F.lit(watermark - offset),
                      F.lit(False))
    return frame.filter(~late)


def _match(op: int, schema: pa.Schema, columns: list[str], wanted: list[bytes]):
    """mapInArrow: rows (the input's columns, W = entry id) in; (op, key, entry id) out for
    those whose bucket key is one of ``wanted``."""

    def fn(batches):
        codec = rowkeys.RowCodec(schema, columns, normalize=True)
        want = pa.array(wanted, pa.binary())
        for b in batches:
            if not b.num_rows:
                continue
            rows = pa.table({c: pc.cast(b.column(c), schema.field(c).type) for c in columns})
            enc = codec.encode(rows) if columns else pa.array([b""] * b.num_rows, pa.binary())
            hit = pc.is_in(enc, value_set=want)
            if not pc.any(hit).as_py():
                continue
            key = enc.filter(hit)
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.full(len(key), op, np.int32)), key,
                 pc.cast(b.column(W).filter(hit), pa.int64())], names=["op", "key", "pid"])

    return fn


def _dead_letter(d: Driver, result: BatchControl, refused: list[Blamed], shards: set[str],
                 t: int) -> BatchControl:
    """``result`` with the refused entries counted bad and added to the dead-letter shard's
    output (as the decoder's bad entries are: same columns)."""
    result.bad += len(refused)
    shard = d.dead_letter_shard
    if shard is None or shard not in shards:
        return result
    refused = sorted(refused, key=Blamed.order)
    raw = _raw_entries(d, [b for b in refused if b.entry is None])
    n = len(refused)
    part = pa.table([pa.array([b.queue for b in refused], pa.string()),
                     pa.array([b.sequence for b in refused], pa.int64()),
                     pa.array([b.index for b in refused], pa.int32()),
                     pa.array([b.table for b in refused], pa.string()),
                     pa.array(["w"] * n, pa.string()),
                     pa.array([b.reason() for b in refused], pa.string()),
                     pa.array([b.entry if b.entry is not None else raw.get(b.position)
                               for b in refused], pa.binary()),
                     pa.array(np.full(n, t, np.uint64)), pa.array(np.ones(n, np.int64))],
                    schema=pa.schema([*DEAD_LETTER_SCHEMA, pa.field("time", pa.uint64()),
                                      pa.field("diff", pa.int64())]))
    result.outputs.add("out", pickle.dumps((shard, table_to_ipc(part))))
    return result


def _raw_entries(d: Driver, blamed: list[Blamed]) -> dict[tuple, bytes]:
    """The stored bytes of these (columnar) entries, read from their queue batches: the queue
    source hands their rows on, not their bytes, and the dead-letter shard keeps the entry."""
    out = {}
    for queue, sequence in sorted({(b.queue, b.sequence) for b in blamed}):
        todo = range_batches(d.store, queue, sequence - 1, sequence)
        for rb in read_batches(d.root, f"{queue}/manifest", queue, todo):
            for i, e in zip(rb.column("index").to_pylist(), rb.column("entry").to_pylist(),
                            strict=True):
                out[(queue, sequence, i)] = e
    return out
