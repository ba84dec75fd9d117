"""persist: compare_and_append latency vs one raw put; append and snapshot throughput.

(a) CAS latency: small batches (100 rows) appended one after another with compare_and_append;
    each is paired, in the same loop, with a raw put of the same encoded Parquet part to the same
    store. ``cas_p50_ratio_vs_put`` = p50(CAS) / p50(put) (target <= 3), same for p99. A CAS is:
    encode + Create put of the part, Create put of the state version, GET of the floor.
(b) append throughput: big batches appended with compare_and_append vs pyarrow writing the same
    table as Parquet (same options) to a file on the same disk. MB = Arrow in-memory bytes.
    ``append_ratio_vs_parquet`` = headrace MB/s / pyarrow MB/s.
(c) snapshot: the consolidated snapshot at the last time of (b), MB/s of Arrow bytes read.
Full: 500 CAS rounds, 8 x 1M-row batches. --quick: 80 rounds, 4 x 200k rows.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Timer, parse_args, report, scratch_dir  # noqa: E402

from headrace.persist import PersistClient  # noqa: E402
from headrace.persist import parts as P  # noqa: E402
from headrace.store import CountingStore, LocalStore, open_store  # noqa: E402

MB = 1e6


def batch(rng: np.random.Generator, rows: int, t0: int, width: int) -> pa.Table:
    return pa.Table.from_arrays(
        [pa.array(rng.integers(0, max(rows // 4, 1), rows)),
         pa.array(rng.random(rows)),
         pa.array(np.char.add("user-", rng.integers(0, 1000, rows).astype(str))),
         pa.array(rng.integers(t0, t0 + width, rows).astype(np.uint64)),
         pa.array(np.ones(rows, np.int64))],
        names=["key", "value", "user", "time", "diff"])


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds, big_batches, big_rows = (80, 4, 200_000) if args.quick else (500, 8, 1_000_000)
    rng = np.random.default_rng(7)
    with scratch_dir("persist") as tmp:
        inner = open_store(args.url) if args.url else LocalStore(tmp / "store")
        store = CountingStore(inner)
        client = PersistClient(store)

        # (a) CAS vs a raw put of the same part, interleaved
        writer = client.open_writer("cas")
        cas_s, put_s = [], []
        store.reset()
        for i in range(rounds):
            small = batch(rng, 100, i, 1)
            data = P.encode_part(small)
            t = time.perf_counter()
            store.put(f"bench/raw/{i}.parquet", data)
            put_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            writer.compare_and_append(small, i, i + 1)
            cas_s.append(time.perf_counter() - t)
        cas_counts = store.counts()
        cas_p50, cas_p99 = np.percentile(cas_s, 50), np.percentile(cas_s, 99)
        put_p50, put_p99 = np.percentile(put_s, 50), np.percentile(put_s, 99)

        # (b) append throughput vs pyarrow.parquet.write_table of the same tables
        tables = [batch(rng, big_rows, i * 10, 10) for i in range(big_batches)]
        arrow_mb = sum(t.nbytes for t in tables) / MB
        big = client.open_writer("big")
        store.reset()
        with Timer() as hr:
            for i, t in enumerate(tables):
                big.compare_and_append(t, i * 10, i * 10 + 10)
        append_counts = store.counts()
        (tmp / "pq").mkdir()
        with Timer() as base:
            for i, t in enumerate(tables):
                pq.write_table(t, tmp / "pq" / f"{i}.parquet", **P.PARQUET_OPTIONS)

        # (c) snapshot read of everything appended
        store.reset()
        reader = client.read_only("big")
        with Timer() as snap_t:
            snap = reader.snapshot(big_batches * 10 - 1)
        snap_counts = store.counts()
        assert int(np.asarray(snap.column("diff")).sum()) == big_batches * big_rows

        figures = {
            "cas_p50_ms": cas_p50 * 1e3, "cas_p99_ms": cas_p99 * 1e3,
            "put_p50_ms": put_p50 * 1e3, "put_p99_ms": put_p99 * 1e3,
            "cas_p50_ratio_vs_put": cas_p50 / put_p50, "cas_p99_ratio_vs_put": cas_p99 / put_p99,
            "cas_requests_per_append": (cas_counts["requests"] - rounds) / rounds,
            "append_mb_s": arrow_mb / hr.s, "parquet_mb_s": arrow_mb / base.s,
            "append_ratio_vs_parquet": (arrow_mb / hr.s) / (arrow_mb / base.s),
            "snapshot_mb_s": arrow_mb / snap_t.s, "snapshot_rows": snap.num_rows,
            "arrow_mb": arrow_mb, "rounds": rounds, "big_rows": big_rows,
        }
        counts = {f"cas_{k}": v for k, v in cas_counts.items()}
        counts.update({f"append_{k}": v for k, v in append_counts.items()})
        counts.update({f"snapshot_{k}": v for k, v in snap_counts.items()})
        client.close()
        report("persist", figures, args, counts)


if __name__ == "__main__":
    main()
