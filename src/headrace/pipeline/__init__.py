"""The streaming pipeline engine, in layers; each imports only itself and the layers below it
(tests/test_import_rules.py checks it):

- ``api``: what a user writes — ``Pipeline``, the fluent ``Frame``, the query handle, and the
  planning of Spark expressions (aggregates, window functions, session windows) into nodes.
- ``driver``: what runs on the Spark driver — the batch loop and its commit, the streaming
  query, restart, history batches, rescaling, the static plan and the direct job, read_stream
  ingest.
- ``exec``: what runs inside Spark tasks — operator stages, control rows, outputs, decoding of
  queue entries, the queue source, per-worker caches.
- ``plan``: the logical graph — nodes, event time, evolution, the progress shard's rows.
- ``state``: per (operator, side, bucket) an LSM of sorted, paged runs in the reservoir (or a
  local spine backed up).
- ``operators``: incremental Z-set kernels (Arrow in, Arrow out), no Spark, and the interfaces
  of kernels and state.
- ``encoding``: row keys, columnar queue entries, Spark's hash, Arrow/Spark types, IPC bytes.

``errors`` and ``names`` sit below every layer. Importing this package does not import pyspark;
``Pipeline``, ``PipelineQuery``, ``Frame``, the errors and ``columnar`` are importable from here.
"""

from __future__ import annotations

from headrace.pipeline.errors import (
    ArithmeticOverflow,
    BadEntry,
    ColumnarEntryError,
    GraphChanged,
    ImpossibleRetraction,
    NegativeMultiplicity,
    NotDirect,
    PipelineError,
    RangeGone,
    RescaleError,
    StreamCheckpointLost,
    StreamIngestError,
)


def __getattr__(name: str):
    """``Pipeline``, ``PipelineQuery``, ``Frame`` and ``columnar``, imported on first use."""
    if name == "Pipeline":
        from headrace.pipeline.api.pipeline import Pipeline

        return Pipeline
    if name == "PipelineQuery":
        from headrace.pipeline.api.query import PipelineQuery

        return PipelineQuery
    if name == "Frame":
        from headrace.pipeline.api.frame import Frame

        return Frame
    if name == "columnar":
        from headrace.pipeline.encoding import columnar

        return columnar
    raise AttributeError(name)


__all__ = ["ArithmeticOverflow", "BadEntry", "ColumnarEntryError", "Frame", "GraphChanged",
           "ImpossibleRetraction", "NegativeMultiplicity", "NotDirect", "Pipeline", "PipelineError", "PipelineQuery", "RangeGone",
           "RescaleError", "StreamCheckpointLost", "StreamIngestError", "columnar"]
