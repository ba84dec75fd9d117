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


_HOLES = """
import ctypes, os, sys
if sys.argv[1] == "capped":
    os.environ["PYSPARK_EXECUTOR_MEMORY_MB"] = "1024"
from headrace.spark import worker_daemon
worker_daemon._fit_allocators_to_cap()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def vm_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1])
libc.free(libc.malloc(16 << 20))  # glibc's dynamic threshold now puts blocks < 16 MiB on the heap
before = vm_kib()
big, small = [], []
for _ in range(32):  # 2 MiB buffers with live 256 KiB ones between them; the 2 MiB ones go
    big.append(libc.malloc(2 << 20))
    small.append(libc.malloc(256 << 10))
for p in big:
    libc.free(p)
print(vm_kib() - before, os.environ.get("ARROW_DEFAULT_MEMORY_POOL"))
"""


def test_capped_workers_return_the_address_space_of_freed_buffers():
    """Under spark.executor.pyspark.memory (RLIMIT_AS counts address space) the daemon fixes
    glibc's mmap threshold at 1 MiB before forking: freed large buffers go back to the system
    instead of leaving holes in the heap, and Arrow uses the system allocator. Without a cap
    nothing changes."""
    out = {}
    for mode in ("capped", "uncapped"):
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYSPARK_EXECUTOR_MEMORY_MB", "ARROW_DEFAULT_MEMORY_POOL",
                            "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")}
        grew, pool = subprocess.run([sys.executable, "-c", _HOLES, mode], env=env, check=True,
                                    capture_output=True, text=True).stdout.split()
        out[mode] = (int(grew), pool)
    # the live 256 KiB buffers hold 8 MiB either way; the freed 2 MiB ones held 64 MiB as holes
    assert out["capped"][0] < 12 << 10 and out["capped"][1] == "system", out
    assert out["uncapped"][0] > 48 << 10 and out["uncapped"][1] == "None", out  # heap holes
