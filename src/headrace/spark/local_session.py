"""``headrace.spark.session()``: a local SparkSession that works with headrace out of the box.

What a first run otherwise trips on: Python workers must run the interpreter that has headrace
installed (``PYSPARK_PYTHON``; also ``PYSPARK_DRIVER_PYTHON``, the Python in which PySpark looks
up the ``headrace.queue`` / ``headrace.shard`` data sources, see ``headrace.spark``), the driver
must bind to loopback on machines without a resolvable host name, and Arrow must be on for
``mapInArrow``. This does all three, and registers the data sources itself where PySpark's
lookup could not.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from headrace.errors import InvalidInput


def session(app_name: str = "headrace", master: str = "local[2]", *,
            shuffle_partitions: int = 4, conf: dict[str, str] | None = None):
    """Build (or get) a local SparkSession configured for headrace, data sources registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName(app_name)
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         # a loaded 2-core machine can take longer than the 15 s default to connect workers
         .config("spark.python.authenticate.socketTimeout", "120s")
         .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
         # event times compare equal whatever the machine's zone (windows, timestamps in JSON)
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.sql.streaming.stopTimeout", "30s")
         .config("spark.python.worker.reuse", "true")
         # workers forked with PySpark loaded, from its bytecode (worker_daemon.py)
         .config("spark.python.daemon.module", "headrace.spark.worker_daemon")
         # PySpark otherwise records the Python call site of every DataFrame call (several
         # JVM round trips each): a pipeline builds hundreds of them per micro-batch
         .config("spark.python.sql.dataFrameDebugging.enabled", "false"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from headrace.pipeline.exec import queue_source
    from headrace.spark import shard_source

    queue_source.register(spark)  # where PySpark's own lookup could not see them
    shard_source.register(spark)
    return spark


def new_store(location: str | None = None) -> str:
    """A store root for a fresh run: ``location`` (a URL, or a local folder that is new or
    empty, made absolute because Spark's workers may run in another directory), else a new
    temporary folder. A non-empty folder is refused: its earlier input would be counted too."""
    if location is None:
        return tempfile.mkdtemp(prefix="headrace-example-")
    if "://" in location:
        return location
    if Path(location).is_dir() and any(Path(location).iterdir()):
        raise InvalidInput(f"{location} is not empty: give a new folder")
    return str(Path(location).absolute())
