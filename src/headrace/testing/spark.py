"""One local SparkSession configured for this sandbox (loopback binding, small shuffles)."""

from __future__ import annotations


def local_spark(app_name: str = "headrace-tests", master: str = "local[2]",
                shuffle_partitions: int = 4, extra: dict[str, str] | None = None):
    """The tests' and benchmarks' session: ``headrace.spark.session`` with their knobs."""
    from headrace.spark.local_session import session

    return session(app_name, master, shuffle_partitions=shuffle_partitions, conf=extra)
