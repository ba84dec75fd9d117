"""One local SparkSession configured for this sandbox (loopback binding, small shuffles)."""

from __future__ import annotations

import os

# A child process of the tests that starts its own Spark JVM lives seconds (start-up, a few
# batches, often a SIGKILL): C2's compilations never pay off there, C1 alone starts it ~20%
# sooner (measured: ~8.4 -> ~6.6 s to a SparkSession and its first job on 2 cores). Children
# only: the tests' own long-lived session keeps the default JIT.
CHILD_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def local_spark(app_name: str = "headrace-tests", master: str = "local[2]",
                shuffle_partitions: int = 4, extra: dict[str, str] | None = None):
    """The tests' and benchmarks' session: ``headrace.spark.session`` with their knobs."""
    from headrace.spark.local_session import session

    return session(app_name, master, shuffle_partitions=shuffle_partitions, conf=extra)


def child_env(env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment for a short-lived child process that starts a Spark JVM: ``env`` (by
    default this process's), ``extra``, and :data:`CHILD_JAVA_OPTIONS` added to
    ``JAVA_TOOL_OPTIONS``."""
    out = dict(os.environ if env is None else env, **extra)
    out["JAVA_TOOL_OPTIONS"] = " ".join(
        o for o in (out.get("JAVA_TOOL_OPTIONS", ""), CHILD_JAVA_OPTIONS) if o)
    return out
