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


def run_sigkilled_child(code: str, *args: str, **env: str) -> str:
    """Run ``python -c code *args`` as a child driver that must SIGKILL itself (a crash test):
    C1 JVM (:func:`child_env`), loopback Spark, its own process group (its JVM is killed
    too); asserts it died by SIGKILL without printing "not killed"; returns its stdout."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", code, *args],
                             env=child_env(SPARK_LOCAL_IP="127.0.0.1",
                                           PYSPARK_PYTHON=sys.executable, **env),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
    out, _ = child.communicate(timeout=600)
    try:
        os.killpg(child.pid, signal.SIGKILL)  # its JVM, if still up
    except ProcessLookupError:
        pass
    assert child.returncode == -signal.SIGKILL and "not killed" not in out, (
        f"the child was not SIGKILLed (exit {child.returncode}): {out[-500:]}")
    return out
