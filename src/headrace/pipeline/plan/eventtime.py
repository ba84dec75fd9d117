"""Event time in a micro-batch: the watermark's input, late rows, and closing state.

Semantics follow Spark Structured Streaming's. ``with_watermark(c, delay)`` tracks the largest
``c`` seen; the watermark used by batch t is (largest ``c`` in batches before t) - delay, the
minimum over a pipeline's watermarks (Spark's default policy), stored with the batch's progress
so a restart uses the same one.

Event time flows through the plan as *time columns* ({column: offset µs} on every node): the
watermarked column (offset 0), a window of it (``window_start``: the size, ``window_end``: 0),
and, downstream, the group columns of an aggregate and the keys of a join that are time columns
on both sides. A value v with v + offset <= watermark is *final*: no non-late row can carry it
any more. At an operator whose state is keyed by such a column (an aggregate grouped by it, a
join on it, an interval join on two of them, a session window of it):

- an input row whose time is final is *late*: dropped and counted (``metrics["late_rows"]``),
  as Spark drops it;
- every state key that became final is deleted — its key range is the prefix of the bucket
  below an encoded bound, because the time column leads the key (``bound_key``; interval joins:
  ``operators.interval``) — and, in append mode (aggregates, session windows, interval
  joins), emitted then (once, final); update mode emitted it as it changed. Output already emitted stays.

A session window of a time column with offset o expires with offset o + gap: a row is late
once its own session ``[t, t + gap)`` is final (Spark's rule), and a session once its end + o
<= watermark; its state is keyed by session end, so the bound is an encoded end
(``operators.session``).

To reach every bucket, not only those the batch's rows fall in, the stage gets one weight-0
row per bucket ("ticks"); tasks drop them before the kernel.
"""

from __future__ import annotations

import pyarrow as pa

from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.names import BUCKET, KIND, PAYLOAD, SIDE, W
from headrace.pipeline.operators.interval import expiry_bounds
from headrace.pipeline.plan.nodes import Map, Operator
from headrace.pipeline.plan.progress import WM_KEY


def _control(kind: str, name: str, value):
    from pyspark.sql import functions as F

    return F.lit(kind).alias(KIND), F.concat(F.lit(f"{name}="), value.cast("string")).cast(
        "binary").alias(PAYLOAD)


def max_event_time(df, node):
    """A control row ("wm", "<node>=<max event time in µs>") of this batch's rows."""
    from pyspark.sql import functions as F

    m = F.max(F.unix_micros(F.col(f"`{node.event_time}`"))).alias("m")
    return df.agg(m).select(*_control("wm", node.name, F.col("m")))


def bound_key(schema: pa.Schema, column: str, bound_us: int) -> bytes:
    """The encoded group-key prefix below which every key has ``column`` <= ``bound_us``."""
    t = schema.field(column).type
    codec = keys.RowCodec(pa.schema([pa.field(column, t)]), [column], normalize=True)
    return codec.encode(pa.table({column: pa.array([bound_us + 1], t)})).to_pylist()[0]


def time_columns(probe, out, source_times: dict[str, int]) -> dict[str, int]:
    """The source's time columns that a stateless step passes through unchanged: the same
    Spark attribute (expression id) in its output, so ``with_column("t", ...)`` over a time
    column ``t`` (or ``select(expr.alias("t"))``) ends its event time."""
    names = [c for c in source_times if c in out.columns]
    if not names:
        return {}
    try:
        def ids(df):
            attrs = df._jdf.queryExecution().analyzed().output()
            return {attrs.apply(i).name(): attrs.apply(i).exprId().id()
                    for i in range(attrs.size())}

        before, after = ids(probe), ids(out)
        names = [c for c in names if before.get(c) is not None and before[c] == after.get(c)]
    except Exception:  # noqa: BLE001 — no JVM plan (Spark Connect): by name, as before
        pass
    return {c: source_times[c] for c in names}


def prepare(spark, node, frame, watermark_us: int | None, buckets: int):
    """(input frame without late rows + one tick per bucket, late-count control DataFrame or
    None, the stage's ``expire`` spec) for an operator with event-time state."""
    from pyspark.sql import functions as F

    columns, offsets = node.expiry["columns"], node.expiry["offsets_us"]
    if watermark_us is None:  # no watermark yet: nothing is final, nothing late
        return frame, None, ((b"", True) if node.emit_final else None)
    late = F.lit(False)
    for side, (column, offset) in enumerate(zip(columns, offsets, strict=True)):
        value = F.unix_micros(F.col(f"`{column}`"))
        this = F.coalesce(value <= F.lit(watermark_us - offset), F.lit(False))
        late = this if len(columns) == 1 else F.when(F.col(SIDE) == side, this).otherwise(late)
    count = frame.filter(late).agg(F.count(F.lit(1)).alias("n")).select(
        *_control("late", node.name, F.col("n")))
    kept = frame.filter(~late)
    ticks = spark.range(buckets).select(*[
        (F.col("id").cast("int") if f.name == BUCKET else
         F.lit(0).cast("long") if f.name == W else F.lit(None).cast(f.dataType)).alias(f.name)
        for f in kept.schema.fields])
    interval = node.params.get("interval")
    if interval is not None:
        below = expiry_bounds(interval, offsets, watermark_us)
    elif node.kind == "session":  # sessions whose end is final: end + (offset - gap) <= wm
        gap = node.params["gap_us"]
        below = bound_key(node.sources[0].schema, columns[0], watermark_us - offsets[0] + gap)
    else:  # the time column leads the state key; keys below the bound are final
        below = bound_key(node.sources[0].schema, columns[0], watermark_us - offsets[0])
    return kept.unionByName(ticks), count, (below, node.emit_final)


def parse_control(payload: bytes) -> tuple[str, int] | None:
    """("node", value) of a "wm"/"late" control row; None when the batch had no rows."""
    if payload is None:
        return None
    name, _, value = payload.decode().rpartition("=")
    return (name, int(value)) if value else None


def watermark_nodes(nodes: list) -> list:
    """The with_watermark nodes of a plan."""
    return [n for n in nodes if isinstance(n, Map) and n.declares_watermark]


def expiring(nodes: list) -> bool:
    """Does any operator keep event-time state (and so expire it)?"""
    return any(isinstance(n, Operator) and n.expiry for n in nodes)


def watermark_of(nodes: list, bindings: dict) -> int | None:
    """The watermark (µs) of the next batch: min over with_watermark nodes of (largest event
    time seen so far - delay); None until every one has seen a row."""
    marks = watermark_nodes(nodes)
    seen = [bindings.get(f"{WM_KEY}:{n.name}") for n in marks]
    if not seen or any(m is None for m in seen):
        return None
    return min(m - n.delay_us for m, n in zip(seen, marks, strict=True))


def event_time_bindings(nodes: list, bindings: dict, seen: dict[str, int]) -> dict[str, int]:
    """Largest event time per watermark node through this batch (for the progress bindings):
    the stored one or this batch's ``seen``, whichever is larger."""
    out = {}
    for n in watermark_nodes(nodes):
        key = f"{WM_KEY}:{n.name}"
        vals = [v for v in (bindings.get(key), seen.get(n.name)) if v is not None]
        if vals:
            out[key] = int(max(vals))
    return out
