"""Reservoir benchmark (issue 4): headrace vs its baselines, in the same run.

(a) object-store operations per checkpoint of 1,000 changed 8 KiB pages: headrace vs one object
    per page (+ one manifest object) -> ops_ratio_vs_page_per_object (baseline ops / headrace ops)
(b) cached page read latency p50/p99 vs os.pread of the same bytes from the same local file
    -> cached_read_p50_ratio_vs_pread (headrace p50 / pread p50; target <= 2)
(c) checkpoint throughput MB/s vs raw file writes of the same bytes (both fsynced)
    -> checkpoint_ratio_vs_raw (headrace MB/s / raw MB/s; target >= 0.5; the raw files are
    written by as many threads as headrace's upload workers), pages written with
    Session.write_many; checkpoint_ratio_vs_raw_per_page_writes: one write() call per page
(d) recovery after 100 checkpoints: time and GETs, vs replaying every checkpoint (no snapshots)
    -> recovery_gets
"""

from __future__ import annotations

import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Timer, parse_args, report, scratch_dir  # noqa: E402

from headrace.codec import crc32, crc64  # noqa: E402
from headrace.reservoir import ReservoirOptions, ReservoirReader, ReservoirStorage  # noqa: E402
from headrace.store import CountingStore, LocalStore  # noqa: E402

PAGE = 8192


def ops_per_checkpoint(root: Path, checkpoints: int) -> dict:
    store = CountingStore(LocalStore(root / "a-headrace", fsync=False))
    rng = np.random.default_rng(1)
    with ReservoirStorage.open(store) as st:
        for _ in range(checkpoints):
            s = st.session()
            for pid in range(1000):
                s.write(pid, rng.bytes(PAGE))
            s.commit()
            st.checkpoint()
    hr = store.counts()
    base = CountingStore(LocalStore(root / "a-baseline", fsync=False))
    for c in range(checkpoints):  # one object per changed page, then a manifest naming them
        for pid in range(1000):
            base.put(f"pages/{pid:08d}", rng.bytes(PAGE))
        base.put(f"manifests/{c:08d}", b"m" * 16)
    bl = base.counts()
    return {"headrace_ops_per_checkpoint": hr["requests"] / checkpoints,
            "baseline_ops_per_checkpoint": bl["requests"] / checkpoints,
            "ops_ratio_vs_page_per_object": bl["requests"] / hr["requests"],
            "headrace_cost_usd_per_checkpoint": store.cost_usd() / checkpoints,
            "baseline_cost_usd_per_checkpoint": base.cost_usd() / checkpoints}, hr


def cached_reads(root: Path, pages: int, reads: int) -> dict:
    store = LocalStore(root / "b", fsync=False)
    rng = np.random.default_rng(2)
    with ReservoirStorage.open(store) as st:
        s = st.session()
        for pid in range(pages):
            s.write(pid, rng.bytes(PAGE))
        s.commit()
        st.checkpoint()
    cache = root / "b-cache"
    order = [random.Random(3).randrange(pages) for _ in range(reads)]
    with ReservoirReader.open(store, cache_dir=cache) as r:
        for pid in range(pages):
            r.read(pid)  # warm: the whole file is in the local cache
        state = r.state()
        ns = np.empty(reads, np.int64)
        clock = time.perf_counter_ns
        for i, pid in enumerate(order):
            t0 = clock()
            r.read(pid)
            ns[i] = clock() - t0
        # the same reads with every lookup a miss of the hot-page tables (cleared outside the
        # timed window): a binary search per read, what a working set larger than the tables'
        # 65,536 entries pays
        cold = np.empty(reads, np.int64)
        for i, pid in enumerate(order):
            r._hot.clear()
            state._hot.clear()
            t0 = clock()
            r.read(pid)
            cold[i] = clock() - t0
        (cached_file,) = list(cache.glob("*.dat"))
        fd = os.open(cached_file, os.O_RDONLY)
        offs, sizes = state.offs, state.sizes
        base = np.empty(reads, np.int64)
        for i, pid in enumerate(order):
            off, size = int(offs[pid]), int(sizes[pid])
            t0 = clock()
            os.pread(fd, size, off)
            base[i] = clock() - t0
        os.close(fd)
        page = bytes(8192)
        crc = np.empty(reads, np.int64)
        for i in range(reads):  # the CRC32 every read must pay (the floor of the ratio)
            t0 = clock()
            crc32(page)
            crc[i] = clock() - t0
    p50, p99 = np.percentile(ns, [50, 99]) / 1000
    b50, b99 = np.percentile(base, [50, 99]) / 1000
    c50 = float(np.percentile(cold, 50)) / 1000
    return {"cached_read_p50_us": p50, "cached_read_p99_us": p99, "pread_p50_us": b50,
            "cached_read_no_hot_table_p50_us": c50,
            "cached_read_no_hot_table_p50_ratio_vs_pread": c50 / b50,
            "pread_p99_us": b99, "cached_read_p50_ratio_vs_pread": p50 / b50,
            "crc32_8k_p50_us": float(np.percentile(crc, 50)) / 1000,
            "cached_read_p99_ratio_vs_pread": p99 / b99}


def _checkpoint_seconds(root: Path, name: str, blob: bytes, file_mb: int, bulk: bool) -> float:
    opts = ReservoirOptions(max_file_size=file_mb << 20)
    n_pages = len(blob) // PAGE
    mv = memoryview(blob)
    store = LocalStore(root / name, fsync=True)
    with ReservoirStorage.open(store, options=opts) as st, Timer() as t:
        s = st.session()
        if bulk:  # one call for all pages (the vectorised path)
            s.write_many(np.arange(n_pages), blob, np.full(n_pages, PAGE))
        else:  # one write() per page
            for pid in range(n_pages):
                s.write(pid, mv[pid * PAGE:(pid + 1) * PAGE])
        s.commit()
        st.checkpoint()
    return t.s


def checkpoint_throughput(root: Path, total_mb: int, file_mb: int) -> dict:
    """Pages -> durable checkpoint (uploads fsynced, checkpoint committed) vs writing the same
    bytes as plain files of the same size, each fsynced. Best of 3 rounds each, interleaved."""
    blob = np.random.default_rng(4).bytes(total_mb << 20)
    mv = memoryview(blob)
    step = file_mb << 20
    workers = ReservoirOptions().upload_workers

    def raw_seconds(rnd: int) -> float:
        """The same files written and fsynced by as many threads as headrace uploads with
        (its default upload_workers): the baseline gets the same parallelism."""
        raw_dir = root / f"c-raw-{rnd}"
        raw_dir.mkdir()

        def write_file(i: int) -> None:
            fd = os.open(raw_dir / f"{i // step}.bin", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, mv[i:i + step])
            os.fsync(fd)
            os.close(fd)

        with Timer() as r, ThreadPoolExecutor(workers) as pool:
            list(pool.map(write_file, range(0, len(blob), step)))
        return r.s

    times: dict[str, list[float]] = {"bulk": [], "page": [], "raw": []}
    runs = {"bulk": lambda rnd: _checkpoint_seconds(root, f"c-bulk-{rnd}", blob, file_mb, True),
            "page": lambda rnd: _checkpoint_seconds(root, f"c-page-{rnd}", blob, file_mb, False),
            "raw": raw_seconds}
    order = list(runs)
    for rnd in range(3):
        for name in order[rnd:] + order[:rnd]:  # rotate: no side always runs after the others
            os.sync()  # start from a clean page cache: no phase pays for another's writeback
            times[name].append(runs[name](rnd))
    bulk, per_page, raw = times["bulk"], times["page"], times["raw"]
    with Timer() as c:  # the CRC64 every data file needs (ECMA-182)
        crc64(mv[: min(len(blob), 64 << 20)])
    crc64_mbs = min(total_mb, 64) / c.s
    hr_mbs, page_mbs, raw_mbs = (total_mb / min(x) for x in (bulk, per_page, raw))
    return {"checkpoint_mb_s": hr_mbs, "checkpoint_per_page_writes_mb_s": page_mbs,
            "raw_write_mb_s": raw_mbs, "checkpoint_ratio_vs_raw": hr_mbs / raw_mbs,
            "checkpoint_ratio_vs_raw_per_page_writes": page_mbs / raw_mbs,
            "checkpoint_mb": total_mb, "crc64_mb_s": crc64_mbs}


def _reopen(store: CountingStore, opts: ReservoirOptions, version: int) -> tuple[dict, float]:
    store.reset()
    with Timer() as t, ReservoirStorage.open(store, options=opts) as st:
        assert st.version == version
    return store.counts(), t.s


def recovery(root: Path, checkpoints: int) -> dict:
    """Reopen after 100 checkpoints (a snapshot: 1 GET), and after 119 (the worst case: the
    snapshot + 19 incrementals); the baseline replays every checkpoint (no snapshots)."""
    out = {}
    for name, interval in (("headrace", 20), ("baseline", 1 << 30)):
        store = CountingStore(LocalStore(root / f"d-{name}", fsync=False))
        opts = ReservoirOptions(snapshot_interval=interval)
        rng = np.random.default_rng(5)
        key = "recovery" if name == "headrace" else "baseline_recovery"
        with ReservoirStorage.open(store, options=opts) as st:
            for v in range(1, checkpoints + 20):
                s = st.session()
                for j in range(20):
                    s.write((v * 20 + j) % 5000, rng.bytes(512))
                s.commit()
                st.checkpoint()
                if v == checkpoints:
                    c, secs = _reopen(store, opts, v)
                    out.update({f"{key}_gets": c["gets"], f"{key}_lists": c["lists"],
                                f"{key}_s": secs})
        c, secs = _reopen(store, opts, checkpoints + 19)
        out.update({f"{key}_worst_gets": c["gets"], f"{key}_worst_s": secs})
    return out


def main() -> None:
    args = parse_args(__doc__)
    quick = args.quick
    figures: dict = {}
    with scratch_dir("reservoir") as root:
        a, counts = ops_per_checkpoint(root, 3 if quick else 10)
        figures.update(a)
        figures.update(cached_reads(root, 2000 if quick else 8000, 20000 if quick else 100000))
        figures.update(checkpoint_throughput(root, 64 if quick else 512, 16 if quick else 64))
        figures.update(recovery(root, 100))
    report("reservoir", figures, args, counts)


if __name__ == "__main__":
    main()
