"""Defining a pipeline: sources, operators and sinks added to the plan, each checked at once.

The fluent :class:`~headrace.pipeline.api.frame.Frame` API and the explicit methods below
(``aggregate``, ``join``, ``distinct``) build the same plan; both take Frames or plan nodes.
"""

from __future__ import annotations

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline.api.frame import Frame, duration_us
from headrace.pipeline.api.over_spec import has_window
from headrace.pipeline.driver.streams import StreamIngest, stream_schema
from headrace.pipeline.encoding.types import arrow_schema, parse_schema, weighted_ddl
from headrace.pipeline.names import W
from headrace.pipeline.operators import build
from headrace.pipeline.plan import eventtime
from headrace.pipeline.plan.evolve import SINK_STARTS
from headrace.pipeline.plan.nodes import (
    Map,
    Node,
    Operator,
    Sink,
    SourceTable,
    Union,
    check_missing_fields,
    fingerprint,
    make_operator,
)

ENVELOPE = {"table", "w"}  # the fields of a queue entry that are not the table's columns
SINK_MODES = ("update", "append")


def _node(x) -> Node:
    return x.node if isinstance(x, Frame) else x


def _behind_maps(node: Node) -> Node:
    while isinstance(node, Map):
        node = node.source
    return node


def _insert_only(node: Node) -> bool:
    """Whether ``node`` only ever emits insertions: stateless steps, unions, inner joins,
    distincts and sink stages over insert-only tables (read_stream's). Each of its rows is
    then final when it is emitted, so an append sink may take it as it comes."""
    if isinstance(node, SourceTable):
        return node.insert_only
    if isinstance(node, Operator):
        ok = (node.kind in ("distinct", "identity")
              or (node.kind == "join" and node.params.get("how") == "inner"))
        return ok and all(_insert_only(i) for i in node.inputs)
    return bool(node.inputs) and all(_insert_only(i) for i in node.inputs)  # Map, Union


def _upstream_operators(node: Node) -> list[Operator]:
    """The operators whose output reaches ``node``'s inputs through stateless steps."""
    out, todo = [], list(node.inputs)
    while todo:
        n = todo.pop()
        if isinstance(n, Operator):
            out.append(n)
        else:
            todo += n.inputs
    return out


def _signed_us(text: str, what: str) -> int:
    """'-5 seconds' -> -5_000_000 (an interval join's bounds may be negative)."""
    if isinstance(text, str) and text.strip().startswith("-"):
        return -duration_us(text.strip()[1:], what)
    return duration_us(text.lstrip(" +") if isinstance(text, str) else text, what)


class QueueTables:
    """``p.read_queue("q").table("bid", "auction long, ...")``: one table at a time."""

    def __init__(self, pipeline, queue: str):
        self.pipeline, self.queue = pipeline, queue

    def table(self, name: str, schema: str | pa.Schema, *,
              missing_fields: str | None = None) -> Frame:
        return self.pipeline.read_queue(self.queue, {name: schema},
                                        missing_fields=missing_fields)[name]


class PipelineBuilder:
    """The plan-building half of :class:`~headrace.pipeline.api.pipeline.Pipeline`."""

    spark: object
    nodes: list[Node]
    sinks: list[Sink]
    queues: list[str]
    streams: list  # driver.streams.StreamIngest, one per read_stream
    buckets: int
    state_backend: str
    missing_fields: str = "bad"  # read_queue's default (Pipeline sets it)

    # ---- sources ----------------------------------------------------------------------
    def read_queue(self, queue: str, tables: dict[str, str | pa.Schema] | None = None, *,
                   missing_fields: str | None = None):
        """Entries of ``queue`` are JSON objects ``{"table": T, "w": ±n, <columns>}``.
        Returns {table: Frame}; without ``tables``, an object whose ``.table(name, schema)``
        adds one table at a time. ``missing_fields`` (these tables; default: the pipeline's):
        an entry that omits a column is a bad entry (``"bad"``) or reads it as NULL
        (``"null"``, as Spark's ``from_json`` does); an entry without ``table`` is always bad."""
        if tables is None:
            return QueueTables(self, queue)
        missing = check_missing_fields(
            self.missing_fields if missing_fields is None else missing_fields,
            f"read_queue({queue!r})")
        schemas = {}
        for table, spec in tables.items():  # every check before anything is added
            schema = parse_schema(spec, f"table {table!r}")
            taken = sorted(set(schema.names) & ENVELOPE)
            if taken:
                raise InvalidInput(f"table {table!r}: column(s) {taken} collide with the queue "
                                   f"entry's envelope fields {sorted(ENVELOPE)} (the table name "
                                   "and the weight); rename them")
            if any(n.name == f"{queue}.{table}" for n in self.nodes):
                raise InvalidInput(f"table {table!r} of queue {queue!r} is read already")
            schemas[table] = schema
        if queue not in self.queues:
            self.queues.append(queue)
        out = {}
        for table, schema in schemas.items():
            node = SourceTable(name=f"{queue}.{table}", schema=schema, queue=queue, table=table,
                               missing_fields=missing)
            self.nodes.append(node)
            out[table] = Frame(self, node)
        return out

    def read_stream(self, df, name: str, *, checkpoint: str | None = None) -> Frame:
        """Any Spark streaming DataFrame (files, Kafka, rate) as table ``name``: a side query
        ingests it exactly once into the internal queue ``<pipeline>.stream.<name>``, which
        the pipeline reads like any queue (protocol: :mod:`headrace.pipeline.driver.streams`).
        ``checkpoint``: the side query's Spark checkpoint (default: ``streams/<name>`` under
        the pipeline's); it is the stream's position, so keep it durable."""
        schema = stream_schema(df, name)
        queue = f"{self.name}.stream.{name}"
        if queue in self.queues:
            raise InvalidInput(f"stream {name!r} is read already")
        frame = self.read_queue(queue, {name: schema})[name]
        frame.node.insert_only = True  # the ingest writes every row with weight 1
        self.streams.append(StreamIngest(df, url=self.root, store=self.store, queue=queue,
                                         table=name, schema=schema, checkpoint=checkpoint))
        return frame

    # ---- operators --------------------------------------------------------------------
    def _auto_name(self, kind: str) -> str:
        names = {n.name for n in self.nodes}
        i = len(self.nodes)
        while f"{kind}{i}" in names:
            i += 1
        return f"{kind}{i}"

    def _check_inputs(self, inputs: list[Node]) -> None:
        for i in inputs:
            if not any(i is n for n in self.nodes):
                raise InvalidInput(f"input {i.name!r} does not belong to this pipeline")

    def _add(self, kind: str, name: str, inputs: list, params: dict) -> Node:
        inputs = [_node(i) for i in inputs]
        if any(n.name == name for n in self.nodes):
            raise InvalidInput(f"an operator named {name!r} already exists")
        self._check_inputs(inputs)
        op = sum(1 for n in self.nodes if isinstance(n, Operator))
        node = make_operator(op, kind, name, inputs, params)
        self.nodes.append(node)
        return node

    def _add_map(self, source: Node, fn, text: str, event_time: str | None = None,
                 delay_us: int | None = None, window: tuple[str, int] | None = None) -> Node:
        """A stateless step, analysed by Spark now (unknown columns, bad types fail here)."""
        self._check_inputs([source])
        probe = self.spark.createDataFrame([], weighted_ddl(source.schema))
        try:
            out = fn(probe)
        except Exception as e:  # pyspark's AnalysisException and friends: say which step
            raise InvalidInput(f"{text}: {str(e).splitlines()[0] if str(e) else e!r}") from e
        if W not in out.columns:
            raise InvalidInput(f"{text}: the step dropped the weight column")
        if "over" in text.lower():
            if has_window(out):  # on a delta it would see only the batch's rows: refuse
                raise InvalidInput(f"{text}: a window function (OVER) works only as "
                                   "with_column(name, F.func(...).over(w)), one per step")
        from pyspark.sql.types import StructType

        struct = StructType([f for f in out.schema.fields if f.name != W])
        schema = arrow_schema(struct, text)
        times = eventtime.time_columns(probe, out, getattr(source, "times", {}))
        if event_time is not None:
            times[event_time] = 0
        if window is not None and window[0] in times:  # a window is final when its end is
            times.update(window_start=times[window[0]] + window[1], window_end=times[window[0]])
        declares = event_time is not None
        node = Map(name=self._auto_name("map"), schema=schema, source=source, fn=fn, text=text,
                   event_time=event_time, delay_us=delay_us, declares_watermark=declares,
                   window=window, times=times)
        self.nodes.append(node)
        return node

    def _add_union(self, inputs: list) -> Node:
        inputs = [_node(i) for i in inputs]
        self._check_inputs(inputs)
        first = inputs[0].schema
        for other in inputs[1:]:
            if sorted(zip(other.schema.names, map(str, other.schema.types), strict=True)) != \
                    sorted(zip(first.names, map(str, first.types), strict=True)):
                raise InvalidInput(f"union: {inputs[0].name!r} has columns {first} but "
                                   f"{other.name!r} has {other.schema}; select the same columns")
        shared = set.intersection(*[set(getattr(i, "times", {})) for i in inputs])
        node = Union(name=self._auto_name("union"), schema=first, sources=inputs,
                     times={c: max(i.times[c] for i in inputs) for c in sorted(shared)})
        self.nodes.append(node)
        return node

    def aggregate(self, input, by: list[str], aggs: dict[str, str], name: str) -> Frame:
        """GROUP BY ``by`` with ``aggs`` {output: "count" | "sum(col)" | ...}."""
        return Frame(self, self._add("aggregate", name, [input],
                                     {"by": list(by), "aggs": dict(aggs)}))

    def join(self, left, right, on: list[str] | None = None, name: str = "",
             *, how: str = "inner", left_on: list[str] | None = None,
             right_on: list[str] | None = None, time_columns: tuple[str, str] | None = None,
             within: tuple[str, str] | None = None) -> Frame:
        """Equi-join: inner, left, right, full, left_semi or left_anti (SQL semantics: NULL
        keys never match); ``on`` (same names) or ``left_on``/``right_on``. With
        ``time_columns=(lt, rt)`` and ``within=(lower, upper)``: an interval join (any
        ``how``), a pair matches only when rt is in [lt + lower, lt + upper]. Keys that are
        event time on both sides (or lt and rt) let the join drop late rows and delete state
        (plan/eventtime.py); an interval join of two watermarked columns may feed an append sink."""
        left, right = _node(left), _node(right)
        lk = list(on if on is not None else left_on or [])
        rk = list(on if on is not None else right_on or [])
        lt_, rt_ = getattr(left, "times", {}), getattr(right, "times", {})
        expiry, times, params = None, {}, {"how": how}
        if (time_columns is None) != (within is None):
            raise InvalidInput("an interval join takes both time_columns=(left, right) and "
                               "within=(lower, upper), e.g. within=('-5 seconds', '10 seconds')")
        if within is not None:
            lt, rt = time_columns
            lower, upper = (_signed_us(d, f"join within[{i}]") for i, d in enumerate(within))
            params["interval"] = {"left": lt, "right": rt, "lower_us": lower, "upper_us": upper}
            if lt in lt_ and rt in rt_:
                expiry = {"columns": [lt, rt], "offsets_us": [lt_[lt], rt_[rt]]}
        else:
            pairs = [i for i, (a, b) in enumerate(zip(lk, rk, strict=False))
                     if a in lt_ and b in rt_]
            if pairs:  # the time key first: the keys a watermark closes are a key prefix
                i = pairs[0]
                lk, rk = [lk[i]] + lk[:i] + lk[i + 1:], [rk[i]] + rk[:i] + rk[i + 1:]
                offset = max(lt_[lk[0]], rt_[rk[0]])
                expiry = {"columns": [lk[0], rk[0]], "offsets_us": [offset, offset]}
                times = {lk[0]: offset, rk[0]: offset}
        params.update({"on": lk} if on is not None else {"left_on": lk, "right_on": rk})
        # a semi or anti join keeps a name both inputs have: the two travel in one Spark
        # DataFrame, one column per name, which would coerce one side to the other's type
        for c in [c for c in left.schema.names
                  if c in right.schema.names and not (c in lk and c in rk)]:
            lt, rt = left.schema.field(c).type, right.schema.field(c).type
            if lt != rt:
                raise InvalidInput(f"join: column {c!r} is {lt} on the left and {rt} on the "
                                   "right; rename or cast one side first")
        node = self._add("join", name or self._auto_name("join"), [left, right], params)
        self._set_expiry(node, expiry, times)
        out = Frame(self, node)
        if on is not None and lk != list(on):  # the user's column order (keys come first)
            keys = {**params, "on": list(on)}
            out = out.select(*build("join", [left.schema, right.schema], keys).output_schema.names)
        return out

    def _set_expiry(self, node: Operator, expiry: dict | None, times: dict) -> None:
        """Give an operator event-time state; refused behind an append-mode aggregate, whose
        rows arrive exactly when final — every one of them would be late here."""
        if expiry is not None:
            final = [u for u in _upstream_operators(node) if u.emit_final]
            if final:
                raise InvalidInput(f"operator {node.name!r} keeps event-time state behind "
                                   f"{final[0].name!r}, which feeds an append sink: its rows "
                                   "come out when final, so they would all be late here; "
                                   "write that sink in mode='update'")
        node.expiry, node.times = expiry, dict(times)

    def distinct(self, input, name: str) -> Frame:
        return Frame(self, self._add("distinct", name, [input], {}))

    # ---- sinks ------------------------------------------------------------------------
    def write_shard(self, node, shard: str, mode: str = "update",
                    start: str | None = None) -> None:
        """The node's changes go to persist shard ``shard`` at each batch's time. ``start``
        matters for a sink added to a pipeline that has run (plan/evolve.py): it starts from now;
        behind an operator with state from before, only ``start="now"`` accepts that the shard
        then gets that operator's changes from now, not its current result.
        ``start="history"``: the sink, and the new operators it reads, first replay the
        consumed batches the queues still hold (``Pipeline(retain_batches=N)``; driver/history.py)."""
        node = _node(node)
        self._check_inputs([node])
        if mode not in SINK_MODES:
            raise InvalidInput(f"write_shard mode must be one of {SINK_MODES}, got {mode!r}")
        if start not in SINK_STARTS:
            raise InvalidInput(f"shard {shard!r}: start must be 'now', 'history' or None, "
                               f"got {start!r}")
        final = _behind_maps(node)  # filters and projections of final rows are final rows
        if mode == "append" and _insert_only(node):
            pass  # every row is final when it comes: the changes are the appended rows
        elif mode == "append":
            if not (isinstance(final, Operator) and final.expiry
                    and (final.kind in ("aggregate", "session") or "interval" in final.params)):
                raise InvalidInput(f"shard {shard!r}: mode='append' needs an aggregate grouped "
                                   "by event time (with_watermark, then group_by a window or "
                                   "session window of that column) or an interval join of two "
                                   "watermarked time columns: only their rows become final (an "
                                   "equi-join's rows do not: a later match or padding change "
                                   "may follow), or insert-only rows (stateless steps, inner "
                                   "joins and distincts of tables read with read_stream; a "
                                   "queue's entries may retract); use 'update'")
            later = [n.name for n in self.nodes if isinstance(n, Operator) and n.expiry
                     and final in _upstream_operators(n)]
            if later:
                raise InvalidInput(f"shard {shard!r}: {final.name!r} feeds {later[0]!r}, which "
                                   "keeps event-time state: in append mode its rows would "
                                   "reach it only when final, i.e. late; use 'update'")
            if any(s.mode == "update" and _behind_maps(s.node) is final for s in self.sinks):
                raise InvalidInput(f"shard {shard!r}: {final.name!r} feeds an update sink; an "
                                   "operator emits either changes or final rows")
            final.emit_final = True
        elif isinstance(final, Operator) and final.emit_final:
            raise InvalidInput(f"shard {shard!r}: {final.name!r} feeds an append sink; an "
                               "operator emits either changes or final rows")
        taken = sorted(set(node.schema.names) & {"time", "diff"})
        if taken:
            raise InvalidInput(f"shard {shard!r}: output column(s) {taken} collide with the "
                               "shard's own 'time' and 'diff' columns; rename them first")
        if any(s.shard == shard for s in self.sinks):
            raise InvalidInput(f"shard {shard!r} is written by this pipeline already")
        if not isinstance(node, Operator):  # a stateless node: a pass-through stage writes it
            node = self._add("identity", self._auto_name("sink"), [node], {})
        self.sinks.append(Sink(node, shard, mode, start))

    @property
    def fingerprint(self) -> str:
        """The whole graph, buckets and backend in one digest: still committed, and the only
        marker of progress written before per-part digests (plan/evolve.py)."""
        return fingerprint(self.nodes, self.sinks, self.buckets, self.state_backend)
