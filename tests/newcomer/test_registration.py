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



@pytest.fixture(scope="module")
def children(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Both fresh processes, run at once (each is mostly a JVM's start-up: the suite's time)."""
    base = tmp_path_factory.mktemp("registration")
    venv_bin = str(Path(sys.executable).parent)
    from headrace.testing.spark import child_env

    plain = {k: v for k, v in os.environ.items()
             if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_TESTING")}
    # an activated venv: `python3` on the PATH is the one with headrace (Spark's default)
    plain.update(PATH=f"{venv_bin}{os.pathsep}{plain.get('PATH', '')}",
                 SPARK_LOCAL_IP="127.0.0.1")
    # PySpark skips its lookup of pyspark_* packages when the JVM's default Python
    # (PYSPARK_DRIVER_PYTHON, else PYSPARK_PYTHON, else python3) cannot be run
    off = {**os.environ, "PYSPARK_DRIVER_PYTHON": str(base / "no-python"),
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    # each child's JVM with C1 only (JAVA_TOOL_OPTIONS: no effect on the data source lookup)
    plain, off = child_env(plain), child_env(off)
    runs = {}
    for name, script, env in (("plain", SCRIPT, plain), ("lookup_off", FALLBACK, off)):
        d = base / name
        d.mkdir()
        with open(d / "out", "w") as out, open(d / "err", "w") as err:  # no pipe to fill
            runs[name] = subprocess.Popen([sys.executable, "-c", script, str(d / "store")],
                                          stdout=out, stderr=err, text=True, env=env, cwd=d)
    done = {}
    for name, proc in runs.items():
        proc.wait(timeout=600)
        done[name] = subprocess.CompletedProcess(
            proc.args, proc.returncode, (base / name / "out").read_text(),
            (base / name / "err").read_text())
    return done


def test_data_sources_work_on_a_plain_session_without_register(children):
    out = children["plain"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"entries": ["e1", "e2", "e3"],
                                                               "shard": [1, 2]}
    assert "replaced a statically registered" not in out.stderr


def test_register_still_works_where_the_lookup_is_off(children):
    """Where PySpark's lookup is off, register(spark) registers both data sources on the
    session."""
    out = children["lookup_off"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-2:] == ["not found", "[5]"]
