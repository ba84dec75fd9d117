"""PySpark integration: data sources (headrace.queue, headrace.shard) and the Pipeline.

The data sources need no registration: installing headrace installs the top-level packages
``pyspark_headrace_queue`` and ``pyspark_headrace_shard``, and PySpark (4.0+, SPARK-45917)
registers the ``DefaultSource`` of every importable ``pyspark_*`` package in each new JVM, for
every session, the first time a data source is looked up. That lookup runs in the JVM's default
Python (``PYSPARK_DRIVER_PYTHON``, else ``PYSPARK_PYTHON``, else ``python3`` on the PATH, as the
JVM started with), so that Python must have headrace; ``session()`` sees to it for local runs.
``register(spark)`` remains for where the lookup cannot see headrace, and is a no-op where it
already worked.

Importing this package does not import pyspark.
"""

from __future__ import annotations


def register(spark) -> None:
    """Make ``headrace.queue`` and ``headrace.shard`` available on ``spark`` if they are not."""
    from headrace.pipeline.exec import queue_source
    from headrace.spark import shard_source

    queue_source.register(spark)
    shard_source.register(spark)


def __getattr__(name: str):
    """The public names, imported on first use (importing this package imports no pyspark)."""
    if name == "Pipeline":
        from headrace.pipeline import Pipeline

        return Pipeline
    if name == "register_source":
        from headrace.pipeline.exec.queue_source import register_source

        return register_source
    if name in ("session", "new_store"):
        from headrace.spark import local_session

        return getattr(local_session, name)
    raise AttributeError(name)


__all__ = ["Pipeline", "new_store", "register", "register_source", "session"]
