"""The data sources need no registration: a plain SparkSession in a fresh process (as a user
with the venv activated starts one) reads ``format("headrace.queue")`` and
``format("headrace.shard")`` without ``register()`` or ``headrace.spark.session()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SCRIPT = r"""
import json, sys
import headrace.spark  # what a user imports; it registers nothing by itself and needs no call
from pyspark.sql import SparkSession
from headrace.buffer import Producer, ProducerConfig
from headrace.persist import PersistClient, make_updates

root = sys.argv[1]
with Producer(ProducerConfig(url=root)) as producer:
    producer.produce([b"e1", b"e2", b"e3"]).watcher.await_durable(timeout=60)
client = PersistClient(root)
client.open_writer("s").compare_and_append(make_updates({"k": [1, 2]}, [0, 0]), 0, 1)
client.close()

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
query = (spark.readStream.format("headrace.queue").option("url", root).load()
         .writeStream.format("memory").queryName("entries").trigger(availableNow=True)
         .option("checkpointLocation", root + "-checkpoint").start())
query.awaitTermination()
entries = sorted(bytes(r.entry).decode() for r in spark.table("entries").collect())
shard = sorted(r.k for r in spark.read.format("headrace.shard").option("url", root)
               .option("shard", "s").load().collect())
headrace.spark.register(spark)  # still allowed: a no-op here, and no warning about it
print(json.dumps({"entries": entries, "shard": shard}))
spark.stop()
"""


def test_data_sources_work_on_a_plain_session_without_register(tmp_path):
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_TESTING")}
    # an activated venv: `python3` on the PATH is the one with headrace (Spark's default)
    env.update(PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}", SPARK_LOCAL_IP="127.0.0.1")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"entries": ["e1", "e2", "e3"],
                                                               "shard": [1, 2]}
    assert "replaced a statically registered" not in out.stderr


FALLBACK = r"""
import sys
from pyspark.sql import SparkSession
from headrace.persist import PersistClient, make_updates
from headrace.spark import register

root = sys.argv[1]
PersistClient(root).open_writer("s").compare_and_append(make_updates({"k": [5]}, [0]), 0, 1)
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
read = lambda: spark.read.format("headrace.shard").option("url", root).option("shard", "s").load()
try:
    read()
    print("found without register")
except Exception as e:
    print("not found" if "DATA_SOURCE_NOT_FOUND" in str(e) else f"failed otherwise: {e}")
register(spark)
print([r.k for r in read().collect()])
spark.stop()
"""


def test_register_still_works_where_the_lookup_is_off(tmp_path):
    """PySpark skips its lookup of pyspark_* packages when the JVM's default Python
    (PYSPARK_DRIVER_PYTHON, else PYSPARK_PYTHON, else python3) cannot be run: then
    register(spark) registers both data sources on the session."""
    env = {**os.environ, "PYSPARK_DRIVER_PYTHON": str(tmp_path / "no-python"),
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run([sys.executable, "-c", FALLBACK, str(tmp_path / "store")],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-2:] == ["not found", "[5]"]
