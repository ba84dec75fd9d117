"""headrace's Python worker daemon (worker_daemon.py): workers import PySpark from its bytecode,
start with it loaded, and the collector skips what every task needs."""

from __future__ import annotations

import os
import subprocess
import sys

import pyspark


def test_workers_use_pysparks_bytecode_and_freeze_what_tasks_share(spark):
    import json

    def _worker_facts(batches):
        import gc
        import json
        import os
        import sys

        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps({
            "pid": os.getpid(), "frozen": gc.get_freeze_count(),
            "pyspark": sys.modules["pyspark"].__file__,
            "zip_on_path": any(p.endswith("pyspark.zip") for p in sys.path)})])], names=["facts"])

    facts = []
    for _ in range(4):  # workers are reused: a pid comes back for its second task
        rows = spark.range(0, 2, 1, 2).mapInArrow(_worker_facts, "facts string").collect()
        facts += [json.loads(r[0]) for r in rows]
    shipped = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip")
    if os.path.exists(shipped):  # pip's PySpark: the zip beside the package is not used
        assert all(".zip" not in f["pyspark"] and not f["zip_on_path"] for f in facts), facts
    assert all(f["frozen"] > 0 for f in facts), facts  # frozen in the daemon, before the fork
    # a worker past its first task froze its own imports too (pyarrow, headrace: thousands of
    # objects): more than the daemon froze before forking it
    daemon = int(subprocess.run(
        [sys.executable, "-c", "import gc, headrace.spark.worker_daemon as d; "
         "d._drop_shipped_zip(); d._preload(); gc.collect(); gc.freeze(); "
         "print(gc.get_freeze_count())"],
        capture_output=True, text=True, check=True).stdout)
    pids = [f["pid"] for f in facts]
    again = [f for f in facts if pids.count(f["pid"]) > 1]
    assert again, f"no worker ran two tasks: {facts}"
    assert max(f["frozen"] for f in again) > daemon + 1000, (daemon, facts)


def test_only_the_zip_shipped_inside_this_pyspark_is_dropped(tmp_path):
    from headrace.spark.worker_daemon import _drop_shipped_zip

    shipped = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip")
    elsewhere = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    saved = sys.path[:]
    try:
        sys.path[:] = [shipped, elsewhere, *saved]
        _drop_shipped_zip()
        assert shipped not in sys.path  # the same build, importable with its bytecode
        assert elsewhere in sys.path  # another Spark's zip may be another build: kept
    finally:
        sys.path[:] = saved
