"""Event time in a micro-batch: the watermark's input, late rows, and closing windows.

Semantics follow Spark Structured Streaming's. ``with_watermark(c, delay)`` tracks the largest
``c`` seen; the watermark used by batch t is (largest ``c`` in batches before t) - delay, the
minimum over a pipeline's watermarks (Spark's default policy), stored with the batch's progress
so a restart uses the same one. At an aggregate grouped by a window of ``c`` (or by ``c``):

- a row whose group is already final (window_end <= watermark) is *late*: dropped and counted
  (``metrics["late_rows"]``), as Spark drops it;
- every group that became final is deleted from state — its key range is the prefix of the
  bucket below the encoded bound, because the event-time column leads the group key — and, in
  append mode, emitted then (once, final); update mode emitted it as it changed.

To reach every bucket, not only those the batch's rows fall in, the stage gets one weight-0
row per bucket ("ticks"); tasks drop them before the kernel.
"""

from __future__ import annotations

import pyarrow as pa

from headrace.pipeline import keys
from headrace.pipeline.names import BUCKET, W
from headrace.pipeline.tasks import KIND, PAYLOAD


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


def prepare(spark, node, frame, watermark_us: int | None, buckets: int):
    """(input frame without late rows + one tick per bucket, late-count control DataFrame or
    None, the stage's ``expire`` spec) for an aggregate with event-time groups."""
    from pyspark.sql import functions as F

    column, offset = node.expiry["column"], node.expiry["offset_us"]
    if watermark_us is None:  # no watermark yet: nothing is final, nothing late
        return frame, None, ((b"", True) if node.emit_final else None)
    bound = watermark_us - offset  # a group with column <= bound is final
    value = F.unix_micros(F.col(f"`{column}`"))
    late = F.coalesce(value <= F.lit(bound), F.lit(False))
    count = frame.filter(late).agg(F.count(F.lit(1)).alias("n")).select(
        *_control("late", node.name, F.col("n")))
    kept = frame.filter(~late)
    ticks = spark.range(buckets).select(*[
        (F.col("id").cast("int") if f.name == BUCKET else
         F.lit(0).cast("long") if f.name == W else F.lit(None).cast(f.dataType)).alias(f.name)
        for f in kept.schema.fields])
    below = bound_key(node.sources[0].schema, column, bound)
    return kept.unionByName(ticks), count, (below, node.emit_final)


def parse_control(payload: bytes) -> tuple[str, int] | None:
    """("node", value) of a "wm"/"late" control row; None when the batch had no rows."""
    if payload is None:
        return None
    name, _, value = payload.decode().rpartition("=")
    return (name, int(value)) if value else None
