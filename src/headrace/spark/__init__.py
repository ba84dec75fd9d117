"""PySpark integration: data sources (headrace.queue, headrace.shard) and the Pipeline.

Importing this package does not import pyspark. ``session()`` builds a local SparkSession
configured for headrace with both data sources registered; on a session of your own, call
``register(spark)``.
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
    if name == "session":
        from headrace.spark.local_session import session

        return session
    raise AttributeError(name)


__all__ = ["Pipeline", "register", "session"]
