"""One local SparkSession configured for this sandbox (loopback binding, small shuffles)."""

from __future__ import annotations

import os
import sys


def local_spark(app_name: str = "headrace-tests", master: str = "local[2]",
                shuffle_partitions: int = 4, extra: dict[str, str] | None = None):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    # Python workers must run the interpreter that has headrace installed
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
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.sql.streaming.stopTimeout", "30s")
         .config("spark.python.worker.reuse", "true"))
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
