"""PySpark integration: data sources (headrace.queue, headrace.shard) and the Pipeline.

Importing this package does not import pyspark; ``register(spark)`` registers both data
sources on a session.
"""

from __future__ import annotations


def register(spark) -> None:
    """Register the ``headrace.queue`` and ``headrace.shard`` data sources on ``spark``."""
    from headrace.spark import queue_source, shard_source

    queue_source.register(spark)
    shard_source.register(spark)


def __getattr__(name: str):
    if name == "Pipeline":
        from headrace.pipeline.runner import Pipeline

        return Pipeline
    raise AttributeError(name)


__all__ = ["Pipeline", "register"]
