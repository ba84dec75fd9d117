"""Backup and restore throughput vs shutil.copytree; incremental bytes; host-affinity restore.

Full: a 1 GiB directory of 64 MiB files + 1,000 small files. --quick: ~64 MiB (8 x 8 MiB + 250
small files), same code path. All on the local store (a temp folder), which fsyncs every object
as it always does; the restore fsyncs too. copytree does not fsync (it copies page cache to page
cache), so two like-for-like figures are added: ``*_vs_copytree_fsync`` (copytree followed by an
fsync of every file and folder it wrote: the same durability on both sides) and
``*_vs_copytree_nofsync_store`` (headrace on LocalStore(fsync=False), restoring with fsync=False,
vs plain copytree: no durability on either side). Backup computes a crc32 and a BLAKE3 of every
byte (the content hash host affinity compares); restore checks every chunk's crc32.
``durable_copy_ceiling_vs_copytree``: copytree followed by fsyncs from 16 threads (the fastest
durable copy we know, measured last in each round) ÷ plain copytree: no durable copy, headrace
or other, can reach a higher ratio to plain copytree on the machine of the run.

(a) full backup and restore MB/s ÷ copytree MB/s of the same directory, same run (best of 2
    interleaved rounds with --quick, 3 without);
(b) incremental backup after replacing 5% of the files (an LSM compaction writes new files):
    bytes uploaded (CountingStore, index included) ÷ bytes changed;
(c) restore into a directory that already equals the snapshot: seconds and GETs (default check:
    size + content hash (BLAKE3) + crc32 of every local file; ``_mtime`` figures: size + mtime,
    no file read).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Timer, parse_args, report, scratch_dir  # noqa: E402

from headrace.backup import BackupConfig, BackupManager, RestoreManager  # noqa: E402
from headrace.store import CountingStore, LocalStore  # noqa: E402

MIB = 1 << 20


def make_source(root: Path, big_files: int, big_size: int, small_files: int,
                rng: np.random.Generator) -> int:
    """An LSM-like state directory; returns its size in bytes."""
    (root / "small").mkdir(parents=True)
    total = 0
    for i in range(big_files):
        data = rng.bytes(big_size)
        (root / f"{i:06d}.sst").write_bytes(data)
        total += len(data)
    for i in range(small_files):
        data = rng.bytes(int(rng.integers(512, 8192)))
        (root / "small" / f"{i:06d}.sst").write_bytes(data)
        total += len(data)
    for name, size in (("MANIFEST-000001", 4096), ("CURRENT", 16), ("OPTIONS-000001", 6000)):
        (root / name).write_bytes(rng.bytes(size))
        total += size
    return total


def change_files(root: Path, fraction: float, rng: np.random.Generator) -> int:
    """Replace ``fraction`` of the big and of the small files by new files of the same size (new
    names, as a compaction does) and rewrite the mutable files; returns the bytes changed."""
    changed = 0
    for folder in (root, root / "small"):
        files = sorted(p for p in folder.iterdir() if p.suffix == ".sst")
        for p in files[: max(1, math.ceil(len(files) * fraction))]:
            size = p.stat().st_size
            p.unlink()
            (folder / f"new-{p.name}").write_bytes(rng.bytes(size))
            changed += size
    for name in ("MANIFEST-000001", "CURRENT", "OPTIONS-000001"):
        size = (root / name).stat().st_size
        (root / name).write_bytes(rng.bytes(size))
        changed += size
    return changed


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in [*files, "."]:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def fsync_tree_parallel(root: Path, workers: int = 16) -> None:
    """fsync every file from ``workers`` threads (concurrent fsyncs share journal commits, as
    restore's fsync pool does), then every folder."""
    def one(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    files, dirs = [], []
    for dirpath, _dirs, names in os.walk(root):
        files.extend(os.path.join(dirpath, n) for n in names)
        dirs.append(dirpath)
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, files))
    for d in dirs:
        one(d)


def measure(base: Path, src: Path, size: int, fsync: bool, cfg: BackupConfig,
            rounds: int) -> dict:
    """Interleaved rounds of copytree / backup / restore; the best time of each counts (the
    machine is shared: the best round is the least disturbed one)."""
    best = {"copy": float("inf"), "backup": float("inf"), "restore": float("inf"),
            "copy_durable": float("inf"), "copy_durable_parallel": float("inf")}
    for r in range(rounds):
        store = CountingStore(LocalStore(base / f"store-{fsync}-{r}", fsync=fsync))
        with Timer() as t_copy:
            shutil.copytree(src, base / f"copy-{fsync}")
        with Timer() as t_durable:  # copytree, then fsync every file and folder it wrote
            shutil.copytree(src, base / f"copy-durable-{fsync}")
            fsync_tree(base / f"copy-durable-{fsync}")
        shutil.rmtree(base / f"copy-durable-{fsync}")
        with BackupManager(store, config=cfg) as bm, Timer() as t_backup:
            index_id = bm.upload(src, "full")
            bm.cleanup(index_id)
        backup_counts = store.counts()
        store.reset()
        with RestoreManager(store, config=cfg, fsync=fsync) as rm, Timer() as t_restore:
            rm.restore(index_id, base / f"restored-{fsync}")
        restore_counts = store.counts()
        for d in (f"copy-{fsync}", f"restored-{fsync}", f"store-{fsync}-{r}"):
            shutil.rmtree(base / d)
        # last in the round (the headline figures keep their order): the fastest durable copy
        # we know, copytree then fsyncs from 16 threads; its ratio to plain copytree bounds
        # what any durable copy can reach vs plain copytree on this machine
        with Timer() as t_parallel:
            shutil.copytree(src, base / f"copy-durable-parallel-{fsync}")
            fsync_tree_parallel(base / f"copy-durable-parallel-{fsync}")
        shutil.rmtree(base / f"copy-durable-parallel-{fsync}")
        for name, t in (("copy", t_copy), ("backup", t_backup), ("restore", t_restore),
                        ("copy_durable", t_durable), ("copy_durable_parallel", t_parallel)):
            best[name] = min(best[name], t.s)
    return {"copytree_mb_s": size / MIB / best["copy"], "backup_mb_s": size / MIB / best["backup"],
            "copytree_fsync_mb_s": size / MIB / best["copy_durable"],
            "copytree_fsync_parallel_mb_s": size / MIB / best["copy_durable_parallel"],
            "restore_mb_s": size / MIB / best["restore"],
            "backup_puts": backup_counts["puts"], "restore_gets": restore_counts["gets"]}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    if args.quick:
        big_files, big_size, small_files = 8, 8 * MIB, 250
    else:
        big_files, big_size, small_files = 16, 64 * MIB, 1000
    cfg = BackupConfig(chunk_size=16 * MIB, upload_workers=4, download_workers=4)
    rng = np.random.default_rng(42)
    with scratch_dir("backup") as base:
        src = base / "src"
        size = make_source(src, big_files, big_size, small_files, rng)
        print(f"source: {size / MIB:.1f} MiB in {big_files + small_files + 3} files")

        rounds = 2 if args.quick else 3
        durable = measure(base, src, size, True, cfg, rounds)
        fast = measure(base, src, size, False, cfg, rounds)

        # (b) incremental, (c) host affinity, on the default (fsync) local store
        store = CountingStore(LocalStore(base / "store"))
        with BackupManager(store, config=cfg) as bm:
            first = bm.upload(src, "1")
            bm.cleanup(first)
            changed = change_files(src, 0.05, rng)
            before = store.counts()
            with Timer() as t_incr:
                second = bm.upload(src, "2")
            incr = delta(store.counts(), before)
            index_bytes = store.inner.head(bm.blobs.index_key(second)).size
            bm.cleanup(second)
        target = base / "state"
        with RestoreManager(store, config=cfg) as rm:
            rm.restore(second, target)
            before = store.counts()
            with Timer() as t_aff:
                result = rm.restore(second, target)
            aff = delta(store.counts(), before)
            assert result.reused_directory
        mtime_cfg = BackupConfig(chunk_size=16 * MIB, affinity_check="mtime")
        with RestoreManager(store, config=mtime_cfg) as rm:
            before = store.counts()
            with Timer() as t_aff_mtime:
                assert rm.restore(second, target).reused_directory
            aff_mtime = delta(store.counts(), before)
        with RestoreManager(store, config=cfg) as rm:
            # a full restore of the same snapshot, for comparison
            before = store.counts()
            with Timer() as t_full:
                rm.restore(second, base / "fresh")
            full = delta(store.counts(), before)
        total = store.counts()

    figures = {
        "source_mib": size / MIB,
        "copytree_mb_s": durable["copytree_mb_s"],
        "backup_mb_s": durable["backup_mb_s"],
        "restore_mb_s": durable["restore_mb_s"],
        "backup_ratio_vs_copytree": durable["backup_mb_s"] / durable["copytree_mb_s"],
        "restore_ratio_vs_copytree": durable["restore_mb_s"] / durable["copytree_mb_s"],
        "copytree_fsync_mb_s": durable["copytree_fsync_mb_s"],
        "backup_ratio_vs_copytree_fsync": durable["backup_mb_s"] / durable["copytree_fsync_mb_s"],
        "copytree_fsync_parallel_mb_s": durable["copytree_fsync_parallel_mb_s"],
        "durable_copy_ceiling_vs_copytree": (durable["copytree_fsync_parallel_mb_s"]
                                             / durable["copytree_mb_s"]),
        "restore_ratio_vs_copytree_fsync": (durable["restore_mb_s"]
                                            / durable["copytree_fsync_mb_s"]),
        # LocalStore(fsync=False) and RestoreManager(fsync=False): no durability on either side
        "backup_ratio_vs_copytree_nofsync_store": fast["backup_mb_s"] / fast["copytree_mb_s"],
        "restore_ratio_vs_copytree_nofsync_store": fast["restore_mb_s"] / fast["copytree_mb_s"],
        "full_backup_puts": durable["backup_puts"],
        "full_restore_gets": durable["restore_gets"],
        "incremental_bytes_changed": changed,
        "incremental_bytes_uploaded": incr["bytes_written"],
        "incremental_index_bytes": index_bytes,
        "incremental_bytes_ratio": incr["bytes_written"] / changed,
        "incremental_puts": incr["puts"],
        "incremental_backup_s": t_incr.s,
        "affinity_restore_s": t_aff.s,
        "affinity_restore_gets": aff["gets"],
        "affinity_restore_mtime_s": t_aff_mtime.s,
        "affinity_restore_mtime_gets": aff_mtime["gets"],
        "full_restore_s": t_full.s,
        "full_restore_gets_incremental_snapshot": full["gets"],
    }
    report("backup", figures, args, total)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
