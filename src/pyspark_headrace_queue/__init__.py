"""``format("headrace.queue")`` with no ``register()``: PySpark registers, in every new JVM, the
``DefaultSource`` of each importable top-level ``pyspark_*`` package (SPARK-45917)."""

from headrace.pipeline.exec.queue_source import QueueDataSource as DefaultSource

__all__ = ["DefaultSource"]
