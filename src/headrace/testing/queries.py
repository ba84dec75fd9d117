"""The pipeline's oracle harness: run a query as a stream and as Spark batch SQL, compare.

``stream_result`` writes rows as queue entries (in waves: one or more micro-batches each),
runs a :class:`~headrace.pipeline.api.pipeline.Pipeline` built by the caller's function and returns
the output shard's consolidated rows; ``batch_result`` runs the caller's PySpark DataFrame
function over the same (net) rows; ``rows_equal`` compares them as multisets, value for value
(NULL, -0.0 and NaN are told apart as Spark tells them apart in output).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math

import pyarrow as pa


def _json_value(v):
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return v.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)  # exact: Spark's JSON reader takes a decimal as text
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(v).decode()  # Spark's JSON reader: binary is base64 text
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def encode_entries(table: str, rows: list[dict], weight: int = 1) -> list[bytes]:
    """Queue entries of ``rows`` for ``table`` (timestamps as ISO-8601 UTC strings, dates as
    ISO dates, decimals as text, binary as base64)."""
    return [json.dumps({"table": table, "w": weight,
                        **{k: _json_value(v) for k, v in r.items()}},
                       allow_nan=False).encode() for r in rows]


def encode_columnar(table: str, rows: list[dict], schema: str, weight: int = 1,
                    entry_bytes: int | None = None) -> list[bytes]:
    """Columnar queue entries (pipeline/columnar.py) of ``rows`` for ``table`` whose declared
    schema is the DDL ``schema``; every row weighs ``weight``."""
    from headrace.pipeline.encoding import columnar
    from headrace.pipeline.encoding.types import parse_schema

    s = parse_schema(schema)
    data = pa.table({f.name: pa.array([r[f.name] for r in rows], f.type) for f in s})
    kw = {} if entry_bytes is None else {"entry_bytes": entry_bytes}
    return columnar.encode(table, data, s, weights=[weight] * len(rows) if weight != 1 else None,
                           **kw)


def produce_entries(root: str, queue: str, payloads: list[bytes], chunk: int = 500) -> None:
    """Append entries to ``queue`` at ``root`` and wait until they are durable."""
    from headrace.buffer import Producer, ProducerConfig

    cfg = ProducerConfig(url=root, data_path_prefix=queue, manifest_path=f"{queue}/manifest",
                         flush_interval_s=0.02)
    with Producer(cfg) as producer:
        handles = [producer.produce(payloads[i : i + chunk])
                   for i in range(0, len(payloads), chunk)]
        for h in handles:
            h.watcher.await_durable(timeout=120)


def stream_result(spark, root: str, schemas: dict[str, str], waves: list[list[bytes]], build,
                  *, name: str = "q", queue: str = "in", checkpoint_dir: str | None = None,
                  partitions: int = 2, buckets: int = 4, **options) -> pa.Table:
    """Run ``build(pipeline, {table: Frame}) -> Frame`` over the waves of entries (one
    ``run`` per wave, so a query meets retractions and restarts); the consolidated shard."""
    from headrace.pipeline import Pipeline

    p = None
    for wave in waves:
        produce_entries(root, queue, wave)
        p = Pipeline(spark, root, name=name, partitions=partitions, buckets=buckets,
                     checkpoint_dir=checkpoint_dir, **options)
        out = build(p, p.read_queue(queue, schemas))
        out.write_shard(f"{name}.out")
        p.run(until_idle=True, max_runs=1)
    return p.read_shard(f"{name}.out")


def batch_result(spark, schemas: dict[str, str], rows: dict[str, list[dict]], query):
    """``query({table: DataFrame}) -> DataFrame`` over the rows, as an Arrow table."""
    frames = {t: spark.createDataFrame([tuple(r[c] for c in _names(schemas[t])) for r in
                                        rows.get(t, [])], schemas[t]) for t in schemas}
    return query(frames).toArrow()


def _names(ddl: str) -> list[str]:
    import re

    return [p.split(None, 1)[0].strip("`") for p in re.split(r",(?![^()]*\))", ddl)]


def _key(v):
    if isinstance(v, float):
        # -0.0, nan and inf spelled out; 12 significant digits, because Spark's double sums
        # depend on the order of additions (its batch result changes with the partitioning)
        # while headrace's are exact, so the last bits may differ
        return ("f", format(v, ".12g"))
    if isinstance(v, dt.datetime):
        return ("t", v.replace(tzinfo=None).isoformat() if v.tzinfo is None
                else v.astimezone(dt.UTC).replace(tzinfo=None).isoformat())
    return (type(v).__name__, repr(v))


def rows_of(table: pa.Table, columns: list[str] | None = None) -> list[tuple]:
    """Rows as sortable tuples; a shard's ``diff`` expands multiplicities (time dropped)."""
    names = columns or [c for c in table.column_names if c not in ("time", "diff")]
    diffs = table["diff"].to_pylist() if "diff" in table.column_names else [1] * table.num_rows
    out = []
    for row, d in zip(table.select(names).to_pylist(), diffs, strict=True):
        if d < 0:
            raise AssertionError(f"negative multiplicity {d} in the result: {row}")
        out += [tuple(_key(row[c]) for c in names)] * d
    return sorted(out)


def rows_equal(streamed: pa.Table, batch: pa.Table) -> tuple[bool, str]:
    """(equal, explanation): same columns, same rows as multisets, value for value."""
    cols = [c for c in batch.column_names]
    have = [c for c in streamed.column_names if c not in ("time", "diff")]
    if have != cols:
        return False, f"columns differ: streamed {have}, batch {cols}"
    a, b = rows_of(streamed, cols), rows_of(batch, cols)
    if a == b:
        return True, f"{len(a)} rows equal"
    extra = [r for r in a if r not in b][:3]
    missing = [r for r in b if r not in a][:3]
    return False, (f"{len(a)} streamed rows vs {len(b)} batch rows; only streamed: {extra}; "
                   f"only batch: {missing}")
