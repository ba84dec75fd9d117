"""The Python worker daemon of headrace's sessions (``spark.python.daemon.module``).

Why: Spark forks every Python worker from one daemon process, and each fork then imports
``pyspark.worker`` and its ~150 modules. Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``
first on the workers' path, and a zip holds no bytecode: each fork *compiled* PySpark from
source, ~1 s of CPU (measured: ``import pyspark.worker`` takes 1.2-1.5 s from the zip, 0.35 s
from the installed package). A micro-batch of a pipeline uses several workers per task
(the queue read, each Python stage), and Spark replaces idle ones, so the 2 cores of a small
machine spent seconds per query compiling.

This daemon does four things, then runs PySpark's own (``pyspark.daemon.manager``):

1. When the zip is the one pip ships inside the very PySpark package installed here (the same
   build), it is taken off the path, so imports use the package and its cached bytecode. A
   Spark distribution's zip (another ``SPARK_HOME``) is left alone: it may be another build.
2. It imports ``pyspark.worker`` before forking, so every worker starts with it loaded. That
   module starts no thread and loads neither pandas nor pyarrow (PySpark's reason to import
   the worker module after the fork), and a check below keeps it that way.
3. It keeps the garbage collector off what every task needs. PySpark's daemon runs a full
   ``gc.collect()`` in the worker after each task; with PySpark, pyarrow, numpy and headrace
   loaded that walks ~90k objects, 50-130 ms per task measured in a worker, three workers per
   task of a micro-batch (the queue read and two Python stages): ~0.5 s of a 2-core batch's
   CPU. ``gc.freeze()`` moves what is alive to a generation the collector skips: once in the
   daemon before forking, and once in each worker at the start of its second task, when the
   first task has imported the modules and the daemon has just collected (so nothing frozen is
   garbage). Objects made later are collected as before.
4. Where ``spark.executor.pyspark.memory`` caps the workers (Spark passes the cap as
   ``PYSPARK_EXECUTOR_MEMORY_MB`` and each worker sets RLIMIT_AS, which counts address space,
   not memory in use), it fits the allocators to the cap, unless the user's environment says
   otherwise: Arrow allocates with the system allocator (jemalloc keeps address space it has
   used), glibc keeps 2 arenas (each thread's arena reserves 64 MiB) and mmaps every block of
   1 MiB or more (glibc's threshold otherwise rises to 32 MiB as large blocks are freed; the
   heap then holds them and keeps the holes they leave). Measured by
   ``benchmarks/merge_memory.py`` (one bucket's 1.5M-key state built and merged under a 1 GiB
   cap): peak address space 1,113-1,137 MB without these settings, 821 MB with them (the fixed
   threshold alone, 2 arenas both ways: 852 -> 795 MB).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from importlib.util import find_spec


def _drop_shipped_zip() -> None:
    """Take pip PySpark's own ``pyspark.zip`` off ``sys.path`` when the package beside it is
    importable, so the package's bytecode serves."""
    for entry in list(sys.path):
        if not entry.endswith("pyspark.zip"):
            continue
        package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(entry))))
        # <site-packages>/pyspark/python/lib/pyspark.zip beside <site-packages>/pyspark/
        if os.path.basename(package) != "pyspark":
            continue
        others = [p for p in sys.path if p != entry]
        saved, sys.path[:] = sys.path[:], others
        try:
            spec = find_spec("pyspark")
        finally:
            sys.path[:] = saved
        found = spec is not None and spec.origin is not None and (
            os.path.dirname(os.path.abspath(spec.origin)) == package)
        if found:
            sys.path[:] = others


def _preload() -> None:
    before = threading.active_count()
    import pyspark.worker  # noqa: F401 - loaded once, inherited by every fork

    if threading.active_count() != before or "pyarrow" in sys.modules:
        raise RuntimeError("importing pyspark.worker started a thread or loaded pyarrow: "
                           "forking workers from this daemon is unsafe; unset "
                           "spark.python.daemon.module")


_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # glibc's mallopt parameters (malloc.h)


def _fit_allocators_to_cap() -> None:
    """Item 4 of the module docstring; runs before the fork, so every worker inherits it."""
    try:
        capped = int(os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB") or -1) > 0
    except ValueError:
        capped = False
    if not capped:
        return
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # read when pyarrow loads
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, 2)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        mallopt(_M_MMAP_THRESHOLD, 1 << 20)


def _freeze_after_first_task() -> None:
    import pyspark.worker

    main, tasks = pyspark.worker.main, 0

    def main_frozen_from_second_task(infile, outfile):
        nonlocal tasks
        tasks += 1
        if tasks == 2:
            gc.freeze()
        return main(infile, outfile)

    pyspark.worker.main = main_frozen_from_second_task  # the daemon looks it up per task


if __name__ == "__main__":
    _drop_shipped_zip()
    _fit_allocators_to_cap()
    _preload()
    _freeze_after_first_task()
    gc.collect()
    gc.freeze()
    from pyspark.daemon import manager

    manager()
