"""``format("headrace.shard")`` with no ``register()``: PySpark registers, in every new JVM, the
``DefaultSource`` of each importable top-level ``pyspark_*`` package (SPARK-45917)."""

from headrace.spark.shard_source import ShardDataSource as DefaultSource

__all__ = ["DefaultSource"]
