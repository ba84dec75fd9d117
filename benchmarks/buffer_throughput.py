"""Buffer throughput (issue 3): headrace.buffer vs plain file I/O, in the same run.

(a) producer MB/s and records/s, 1 KiB entries, 4 producers on the local store, vs writing the
    same bytes (the same length-prefixed records, into files of flush_size_bytes, fsynced like
    the local store does) with plain buffered file writes from 4 threads;
(b) consumer MB/s (Consumer.next_batch → list of entries, and the Spark source's Arrow path)
    vs reading the same files with plain file reads;
(c) PUTs per GiB ingested (CountingStore), against 2 × (1 GiB / flush_size_bytes) + manifest writes;
(d) produce-to-durable latency p50/p99 at flush_interval 100 ms.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Timer, parse_args, report, scratch_dir  # noqa: E402

from headrace.buffer import Consumer, ConsumerConfig, Producer, ProducerConfig  # noqa: E402
from headrace.buffer.batch_format import U32  # noqa: E402
from headrace.store import CountingStore, LocalStore  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
ENTRY = 1024
PRODUCERS = 4
PER_CALL = 64  # entries per produce() call


def entry_pool() -> list[bytes]:
    rng = np.random.default_rng(7)
    return [rng.bytes(ENTRY) for _ in range(1024)]


def run_producers(store, total_bytes: int, flush_size: int, pool: list[bytes]) -> float:
    per_producer = total_bytes // PRODUCERS // ENTRY
    calls = per_producer // PER_CALL
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            cfg = ProducerConfig(store=store, flush_size_bytes=flush_size, flush_interval_s=5.0)
            with Producer(cfg) as p:
                for c in range(calls):
                    i = (c * PER_CALL + k * 97) % (len(pool) - PER_CALL)
                    p.produce(pool[i : i + PER_CALL])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,), name=f"bench-producer-{k}")
               for k in range(PRODUCERS)]
    with Timer() as t:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if errors:
        raise errors[0]
    return t.s


def run_raw_writes(folder: Path, total_bytes: int, flush_size: int, pool: list[bytes]) -> float:
    per_producer = total_bytes // PRODUCERS // ENTRY
    prefix = U32.pack(ENTRY)

    def work(k: int) -> None:
        written, n_file = 0, 0
        f = None
        for r in range(per_producer):
            if f is None:
                f = open(folder / f"raw-{k}-{n_file}.bin", "wb")
                n_file += 1
            f.write(prefix)
            f.write(pool[(r + k * 97) % len(pool)])
            written += ENTRY + 4
            if written >= flush_size:
                f.flush()
                os.fsync(f.fileno())
                f.close()
                f, written = None, 0
        if f is not None:
            f.flush()
            os.fsync(f.fileno())
            f.close()

    threads = [threading.Thread(target=work, args=(k,), name=f"bench-raw-{k}")
               for k in range(PRODUCERS)]
    with Timer() as t:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    return t.s


def consume_all(store) -> tuple[float, int]:
    c = Consumer(ConsumerConfig(store=store, gc_interval_s=0))
    c.initialize()
    n = 0
    with Timer() as t:
        while (b := c.next_batch()) is not None:
            n += len(b.entries)
            c.ack(b.sequence)
        c.flush()
    c.close()
    return t.s, n


def consume_arrow(store) -> float:
    from headrace.buffer import read_manifest
    from headrace.buffer.batch_format import decode_block
    from headrace.pipeline.exec.queue_source import batch_to_arrow

    entries = read_manifest(store, "ingest/manifest").entries
    with Timer() as t:
        for e in entries:
            md = [(m.start_index, m.ingestion_time_ms, m.payload) for m in e.metadata]
            batch_to_arrow(decode_block(store.get(e.location).data, e.location), e.sequence,
                           e.location, md)
    return t.s


def raw_reads(files: list[Path]) -> float:
    with Timer() as t:
        for p in files:
            with open(p, "rb") as f:
                f.read()
    return t.s


def durable_latency(store, seconds: float) -> np.ndarray:
    lat: list[float] = []
    handles: list = []
    done = threading.Event()

    def waiter() -> None:
        i = 0
        while not (done.is_set() and i >= len(handles)):
            if i >= len(handles):
                time.sleep(0.001)
                continue
            t0, h = handles[i]
            h.watcher.await_durable(30)
            lat.append((time.perf_counter() - t0) * 1000)
            i += 1

    th = threading.Thread(target=waiter, name="bench-latency-waiter")
    th.start()
    with Producer(ProducerConfig(store=store, flush_interval_s=0.1)) as p:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            handles.append((time.perf_counter(), p.produce([b"x" * ENTRY] * 8)))
            time.sleep(0.005)
    done.set()
    th.join()
    return np.array(lat)


def main() -> None:
    args = parse_args(__doc__)
    total = 128 * MIB if args.quick else GIB
    flush_size = 16 * MIB if args.quick else 64 * MIB
    pool = entry_pool()
    figures: dict[str, float] = {"total_bytes": total, "flush_size_bytes": flush_size,
                                 "entry_bytes": ENTRY, "producers": PRODUCERS}
    with scratch_dir("buffer") as d:
        store = CountingStore(LocalStore(d / "q"))
        secs = run_producers(store, total, flush_size, pool)
        ingest_counts = store.counts()
        raw_dir = d / "raw"
        raw_dir.mkdir()
        raw_secs = run_raw_writes(raw_dir, total, flush_size, pool)
        ingested = (total // PRODUCERS // ENTRY // PER_CALL) * PER_CALL * PRODUCERS * ENTRY
        figures["producer_mb_s"] = ingested / MIB / secs
        figures["producer_records_s"] = ingested / ENTRY / secs
        raw_bytes = (total // PRODUCERS // ENTRY) * PRODUCERS * ENTRY
        figures["raw_write_mb_s"] = raw_bytes / MIB / raw_secs
        figures["producer_ratio_vs_raw"] = figures["producer_mb_s"] / figures["raw_write_mb_s"]
        batch_files = sum(1 for o in store.inner.list("ingest/") if o.key.endswith(".batch"))
        manifest_puts = ingest_counts["puts"] - batch_files  # appends, lost CAS races included
        gib = ingested / GIB
        figures["puts_per_gib"] = ingest_counts["puts"] / gib
        figures["data_puts_per_gib"] = batch_files / gib
        figures["manifest_puts_per_gib"] = manifest_puts / gib
        figures["puts_target_per_gib"] = 2 * (GIB / flush_size) + manifest_puts / gib
        figures["batch_files"] = batch_files

        arrow_secs = consume_arrow(store)
        store.reset()
        cons_secs, n = consume_all(store)
        consume_counts = store.counts()
        raw_read_secs = raw_reads(sorted(raw_dir.iterdir()))
        figures["consumer_mb_s"] = n * ENTRY / MIB / cons_secs
        figures["consumer_arrow_mb_s"] = ingested / MIB / arrow_secs
        figures["raw_read_mb_s"] = total / MIB / raw_read_secs
        figures["consumer_ratio_vs_raw"] = figures["consumer_mb_s"] / figures["raw_read_mb_s"]
        figures["consumer_arrow_ratio_vs_raw"] = (figures["consumer_arrow_mb_s"]
                                                  / figures["raw_read_mb_s"])
        figures["consumer_gets"] = consume_counts["gets"]
        figures["consumer_puts"] = consume_counts["puts"]

        lat_store = CountingStore(LocalStore(d / "lat"))
        lat = durable_latency(lat_store, 2.0 if args.quick else 10.0)
        figures["durable_latency_p50_ms"] = float(np.percentile(lat, 50))
        figures["durable_latency_p99_ms"] = float(np.percentile(lat, 99))
        figures["latency_samples"] = len(lat)
    report("buffer_throughput", figures, args, ingest_counts)


if __name__ == "__main__":
    main()
