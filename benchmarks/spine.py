"""Spine benchmark: lookups (persistent vs in-memory vs RocksDB), insert+merge vs pyarrow,
checkpoint and reopen.

(a) ``lookup_many`` of random keys on the same batches held in memory and held in mmap'd files
    (memory budget = state / 4), against rocksdict ``get`` (multi-get) of the same keys from a
    RocksDB holding the same consolidated state (key -> packed (val, w) pairs).
(b) insert + merge throughput (chunks inserted, background merges until idle, then a final
    compaction) against pyarrow sort + group_by of the same rows: the physical floor for the work.
(c) checkpoint (persist every batch + manifest + catalog) and reopen (lock, catalog, mmap).

Full run: 10M rows, 1M lookups; --quick: 400k rows, 100k lookups.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Timer, parse_args, report, scratch_dir  # noqa: E402

from headrace.spine import Batch, Circuit, Spine, SpineConfig  # noqa: E402


def make_rows(n: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"key": rng.integers(0, n, n, dtype=np.int64),
                     "val": rng.integers(0, 1 << 20, n, dtype=np.int64),
                     "w": rng.choice(np.array([-1, 1, 1, 2], dtype=np.int64), n)})


def arrow_floor(rows: pa.Table) -> float:
    """pyarrow group_by (sum w) + sort of the same rows: the work a consolidated batch needs."""
    with Timer() as t:
        g = rows.group_by(["key", "val"]).aggregate([("w", "sum")])
        g = g.filter(pc.not_equal(g.column("w_sum"), 0))
        g.sort_by([("key", "ascending"), ("val", "ascending")])
    return t.s


def spine_ingest(rows: pa.Table, chunk: int, config: SpineConfig) -> tuple[Spine, float]:
    sp = Spine(pa.int64(), pa.int64(), name="bench", config=config)
    with Timer() as t:
        for start in range(0, rows.num_rows, chunk):
            sp.insert(Batch.from_arrow(rows.slice(start, chunk)))
        sp.wait_idle()
    return sp, t.s


def rocksdb_load(path: Path, state: pa.Table):
    from rocksdict import Options, Rdict, WriteBatch

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(str(path), opts)
    keys = state.column("key").to_numpy()
    pairs = np.stack([state.column("val").to_numpy(), state.column("w").to_numpy()], 1)
    packed = pairs.astype("<i8").tobytes()
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    ends = np.append(starts[1:], len(keys))
    kbytes = keys[starts].astype(">i8")
    wb = WriteBatch(raw_mode=True)
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        wb.put(kbytes[i].tobytes(), packed[16 * s: 16 * e])
        if i % 100_000 == 99_999:
            db.write(wb)
            wb = WriteBatch(raw_mode=True)
    db.write(wb)
    db.flush()
    return db


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n = 400_000 if args.quick else 10_000_000
    n_lookups = 100_000 if args.quick else 1_000_000
    chunk = 20_000 if args.quick else 250_000
    rows = make_rows(n)
    fig: dict = {"rows": n, "lookups": n_lookups, "chunk_rows": chunk,
                 "load_avg_1m_at_start": os.getloadavg()[0]}

    # (b) insert + merge vs pyarrow
    floor_s = min(arrow_floor(rows) for _ in range(2))
    gc.collect()
    mem_cfg = SpineConfig(merge_fanout=4, memory_budget_bytes=1 << 40)
    sp, ingest_s = spine_ingest(rows, chunk, mem_cfg)
    with Timer() as tc:
        sp.compact()
    fig["arrow_sort_groupby_rows_per_s"] = n / floor_s
    fig["spine_insert_merge_rows_per_s"] = n / ingest_s
    fig["spine_insert_merge_compact_rows_per_s"] = n / (ingest_s + tc.s)
    fig["insert_ratio_vs_arrow"] = fig["spine_insert_merge_rows_per_s"] / fig[
        "arrow_sort_groupby_rows_per_s"]
    sp.close()

    # an LSM-shaped state for lookups: ingest again without the final compaction
    sp, _ = spine_ingest(rows, chunk, mem_cfg)
    state_bytes = sum(b.nbytes for b in sp.batches)
    fig["state_bytes"] = state_bytes
    fig["state_batches"] = len(sp.batches)
    rng = np.random.default_rng(11)
    probe = pa.array(rng.integers(0, n, n_lookups, dtype=np.int64))

    def timed_lookup(spine: Spine) -> tuple[float, int]:
        with Timer() as t:
            out = spine.lookup_many(probe)
        return t.s, out.num_rows

    with scratch_dir("spine") as d:
        budget = max(1, state_bytes // 4)
        pcfg = SpineConfig(merge_fanout=4, memory_budget_bytes=budget, background_merge=False)
        circuit = Circuit.open(d / "state", "bench-graph", config=pcfg)
        pspine = circuit.spine("bench", pa.int64(), pa.int64())
        for b in sp.batches:
            pspine.insert(b)
        with Timer() as tck:
            circuit.commit(step=1)
        fig["checkpoint_s"] = tck.s
        fig["checkpoint_batches_written"] = circuit.store.metrics()["batches_written"]
        fig["checkpoint_bytes_written"] = circuit.store.metrics()["bytes_written"]
        circuit.close()
        gc.collect()
        with Timer() as tro:
            circuit = Circuit.open(d / "state", "bench-graph", config=pcfg)
            pspine = circuit.spine("bench")
        fig["reopen_s"] = tro.s
        fig["memory_budget_bytes"] = budget
        fig["persistent_memory_bytes"] = pspine.metrics()["memory_bytes"]

        first_s, hits_p = timed_lookup(pspine)  # includes first-touch block CRC checks
        mem_runs, pers_runs = [], []
        for _ in range(3):  # alternate, so both see the same machine load
            mem_runs.append(timed_lookup(sp)[0])
            pers_runs.append(timed_lookup(pspine)[0])
        mem_s, pers_s = min(mem_runs), min(pers_runs)
        hits_m = timed_lookup(sp)[1]
        assert hits_m == hits_p, (hits_m, hits_p)
        fig["lookup_rows_returned"] = hits_m
        fig["lookup_memory_s"] = mem_s
        fig["lookup_persistent_first_s"] = first_s
        fig["lookup_persistent_s"] = pers_s
        fig["lookup_ratio_persistent_vs_memory"] = pers_s / mem_s
        fig["lookup_ratio_persistent_first_vs_memory"] = first_s / mem_s

        state = sp.to_table()
        with Timer() as tl:
            db = rocksdb_load(d / "rocks", state)
        fig["rocksdb_load_s"] = tl.s
        keylist = [x.tobytes() for x in probe.to_numpy().astype(">i8")]
        with Timer() as tr:
            got = db.get(keylist)
        fig["lookup_rocksdb_s"] = tr.s
        fig["rocksdb_keys_found"] = sum(v is not None for v in got)
        fig["lookup_speedup_vs_rocksdict"] = tr.s / pers_s
        fig["lookup_us_per_key_spine"] = pers_s / n_lookups * 1e6
        fig["lookup_us_per_key_rocksdb"] = tr.s / n_lookups * 1e6
        db.close()
        fig["files_in_state_dir"] = len(os.listdir(d / "state"))
        circuit.close()
    sp.close()
    # no ObjectStore is involved: LocalBatchStore writes a directory through the OS
    fig["load_avg_1m_at_end"] = os.getloadavg()[0]
    report("spine", fig, args, {"puts": 0, "gets": 0, "lists": 0, "deletes": 0})


if __name__ == "__main__":
    main()
