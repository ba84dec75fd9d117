"""The Python workers' caches: sized to the worker's memory cap, and no folders left behind by
workers that exited."""

from __future__ import annotations

import os
import subprocess
import sys

from headrace.pipeline.exec import workers
from headrace.pipeline.state import cache
from headrace.pipeline.state.cache import budget_bytes


def test_cache_budgets_follow_the_workers_memory_cap(monkeypatch):
    """Spark caps a worker's address space (spark.executor.pyspark.memory): the decoded pages
    take an eighth of the cap; the file cache is on disk and read, not mmapped, so it keeps
    its size."""
    monkeypatch.delenv("HEADRACE_STATE_CACHE_MB", raising=False)
    monkeypatch.delenv("PYSPARK_EXECUTOR_MEMORY_MB", raising=False)
    assert workers.reader_options().max_cache_size_bytes == 10 << 30  # no cap
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", "1024")
    assert workers.reader_options().max_cache_size_bytes == 10 << 30
    assert budget_bytes("HEADRACE_PAGE_CACHE_MB", 256, 1 / 8) == 128 << 20
    monkeypatch.setenv("HEADRACE_STATE_CACHE_MB", "64")  # the user's word wins
    opts = workers.reader_options()
    assert opts.max_cache_size_bytes == 64 << 20
    assert opts.max_file_size <= opts.max_cache_size_bytes


def test_decoded_page_cache_defaults_to_a_share_of_the_machine_per_worker(monkeypatch):
    """Without a cap: a quarter of the machine's memory over one worker per core, so a state
    whose run views fit stays decoded between batches; never below 256 MiB nor above 4 GiB."""
    def machine(gib: int, cores: int) -> int:
        pages = {"SC_PHYS_PAGES": gib << 18, "SC_PAGE_SIZE": 4096}
        monkeypatch.setattr(cache.os, "sysconf", lambda name: pages[name])
        monkeypatch.setattr(cache.os, "cpu_count", lambda: cores)
        return cache.machine_share_mb()

    assert machine(64, 8) == 2048
    assert machine(4, 8) == 256
    assert machine(1024, 4) == 4096
    monkeypatch.delenv("HEADRACE_PAGE_CACHE_MB", raising=False)
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", "1024")  # a capped worker: the cap rules
    assert budget_bytes("HEADRACE_PAGE_CACHE_MB", machine(64, 8), 1 / 8) == 128 << 20


def test_cache_folders_of_exited_workers_are_removed(tmp_path, monkeypatch):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / gone.stdout.strip()
    alive = tmp_path / str(os.getpid())
    other = tmp_path / "not-a-pid"
    target = tmp_path.parent / f"{tmp_path.name}-outside"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / "999999999"  # a pid-like symlink: never followed or removed
    for d in (dead, alive, other):
        (d / "stream").mkdir(parents=True)
        (d / "stream" / "f.dat").write_bytes(b"x")
    link.symlink_to(target, target_is_directory=True)
    monkeypatch.setattr(workers, "_swept", set())
    workers._sweep_exited_workers(tmp_path)
    assert not dead.exists()
    assert (alive / "stream" / "f.dat").exists() and (other / "stream" / "f.dat").exists()
    assert link.is_symlink() and (target / "keep").exists()
