"""Buffer throughput: headrace.buffer vs plain file I/O, in the same run.

(a) producer MB/s and records/s, 1 KiB entries, 4 producers on the local store, vs writing the
    same bytes (the same length-prefixed records, into files of flush_size_bytes, fsynced like
    the local store does) with plain buffered file writes from 4 threads;
(b) consumer MB/s vs reading the same records from those plain files (``f.read()`` per file),
    both sets warm in the page cache (each is read once, untimed, first). Consumer: the default
    ``Consumer`` (read-ahead off, every check on) with ``next_batch`` + ``ack`` + the final
    dequeue, the records taken through ``batch.records`` (one buffer plus offsets: the bulk
    API); also through ``batch.entries`` (one ``bytes`` per entry) and the Spark source's Arrow
    path. Each figure is the median of ROUNDS rounds; a round times a raw read, each consumer
    path, and a raw read again, and its ratio uses the mean of its two raw reads, so a shared
    machine's load drifts out of the ratio (min and max are reported too). The entries come
    from a 1 MiB pool, so zstd (the producers' default) stores each batch in a small fraction
    of its size (``batch_bytes_per_entry_byte``); ``unique_*`` repeats the consumer figure on entries that never repeat (zstd cannot
    shrink them: the consumer reads as many bytes as the raw read, then inflates them);
    ``caller_50ms_read_ahead_{off,on}_mb_s``: the records path when the caller then waits
    CALLER_S per batch, without and with ``read_ahead`` (the wait is counted in the time);
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


ROUNDS = 3
CALLER_S = 0.05  # per batch, for the read-ahead figures
UNIQUE_POOL = 16384  # 16 MiB of entries: zstd level 3 matches within 2 MiB at most
MANIFEST = "ingest/manifest"


def consume_all(store, path: str, *, read_ahead: bool = False,
                caller_s: float = 0.0) -> tuple[float, int, int]:
    """Seconds, records and record bytes of one pass of a fresh consumer over the queue;
    ``caller_s``: the caller then waits that long per batch (as for a network write)."""
    c = Consumer(ConsumerConfig(store=store, gc_interval_s=0, read_ahead=read_ahead))
    c.initialize()
    n = nbytes = 0
    with Timer() as t:
        while (b := c.next_batch()) is not None:
            time.sleep(caller_s)
            if path == "records":
                n += len(b.records)
                nbytes += b.records.nbytes
            else:
                entries = b.entries
                n += len(entries)
                nbytes += len(entries) * ENTRY  # every entry is ENTRY bytes
            c.ack(b.sequence)
        c.flush()
    c.close()
    return t.s, n, nbytes


def consume_arrow(store) -> tuple[float, int]:
    from headrace.buffer import read_manifest
    from headrace.buffer.batch_format import decode_block
    from headrace.pipeline.exec.queue_source import batch_to_arrow

    entries = read_manifest(store, MANIFEST).entries
    n = 0
    with Timer() as t:
        for e in entries:
            md = [(m.start_index, m.ingestion_time_ms, m.payload) for m in e.metadata]
            n += batch_to_arrow(decode_block(store.get(e.location).data, e.location),
                                e.sequence, e.location, md).num_rows
    return t.s, n


def raw_reads(files: list[Path]) -> float:
    with Timer() as t:
        for p in files:
            with open(p, "rb") as f:
                f.read()
    return t.s


def warm(folder: Path) -> None:
    """Read every file once so both sides start warm in the page cache."""
    raw_reads(sorted(p for p in folder.rglob("*") if p.is_file()))


def consumer_rounds(store, queue_dir: Path, raw_dir: Path, paths: tuple[str, ...],
                    expected_bytes: int) -> dict[str, list[float]]:
    """Per round: raw read, each consumer path, raw read again (MB/s and ratios per path)."""
    files = sorted(raw_dir.iterdir())
    raw_bytes = sum(p.stat().st_size for p in files)
    manifest = store.get(MANIFEST).data  # each pass dequeues: put back for the next one
    warm(queue_dir)
    warm(raw_dir)
    out: dict[str, list[float]] = {"raw": []}
    for path in paths:
        out[path] = []
        out[f"{path}_ratio"] = []
    for _ in range(ROUNDS):
        before = raw_reads(files)
        speeds = {}
        for path in paths:
            if path == "arrow":
                secs, n = consume_arrow(store)
                got = n * ENTRY
            elif path.startswith("caller"):  # read-ahead off / on under a waiting caller
                secs, n, got = consume_all(store, "records", read_ahead=path.endswith("_on"),
                                           caller_s=CALLER_S)
                store.put(MANIFEST, manifest)
            else:
                secs, n, got = consume_all(store, path)
                store.put(MANIFEST, manifest)
            if got != expected_bytes:
                raise AssertionError(f"{path}: read {got} bytes, {expected_bytes} produced")
            speeds[path] = got / MIB / secs
        raw = raw_bytes / MIB / ((before + raw_reads(files)) / 2)
        out["raw"].append(raw)
        for path, mb_s in speeds.items():
            out[path].append(mb_s)
            out[f"{path}_ratio"].append(mb_s / raw)
    return out


def unique_queue(d: Path, total: int, flush_size: int) -> tuple[CountingStore, Path, int]:
    """A queue (and raw files) of entries that never repeat: zstd cannot shrink them."""
    rng = np.random.default_rng(11)
    pool = [rng.bytes(ENTRY) for _ in range(UNIQUE_POOL)]  # repeats lie past zstd's window
    store = CountingStore(LocalStore(d / "uq"))
    run_producers(store, total, flush_size, pool)
    raw_dir = d / "uraw"
    raw_dir.mkdir()
    run_raw_writes(raw_dir, total, flush_size, pool)
    return store, raw_dir, (total // PRODUCERS // ENTRY // PER_CALL) * PER_CALL * PRODUCERS * ENTRY


def median(xs: list[float]) -> float:
    return float(np.median(xs))


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

        stored = sum(o.size for o in store.inner.list("ingest/") if o.key.endswith(".batch"))
        figures["batch_bytes_per_entry_byte"] = stored / ingested

        manifest = store.inner.get(MANIFEST).data
        store.reset()
        consume_all(store, "records")  # one counted pass: the requests of reading the queue
        consume_counts = store.counts()
        store.inner.put(MANIFEST, manifest)
        figures["consumer_gets"] = consume_counts["gets"]
        figures["consumer_puts"] = consume_counts["puts"]
        rounds = consumer_rounds(store.inner, d / "q", raw_dir,
                                 ("records", "entries", "arrow", "caller_off", "caller_on"),
                                 ingested)
        figures["raw_read_mb_s"] = median(rounds["raw"])
        for path, name in (("records", "consumer"), ("entries", "consumer_entries"),
                           ("arrow", "consumer_arrow")):
            figures[f"{name}_mb_s"] = median(rounds[path])
            figures[f"{name}_ratio_vs_raw"] = median(rounds[f"{path}_ratio"])
            figures[f"{name}_ratio_vs_raw_min"] = min(rounds[f"{path}_ratio"])
            figures[f"{name}_ratio_vs_raw_max"] = max(rounds[f"{path}_ratio"])
        for ahead in ("off", "on"):  # MB/s counting the caller's waits
            figures[f"caller_50ms_read_ahead_{ahead}_mb_s"] = median(rounds[f"caller_{ahead}"])

        ustore, uraw, ubytes = unique_queue(d, total, flush_size)
        stored = sum(o.size for o in ustore.inner.list("ingest/") if o.key.endswith(".batch"))
        figures["unique_batch_bytes_per_entry_byte"] = stored / ubytes
        rounds = consumer_rounds(ustore.inner, d / "uq", uraw, ("records",), ubytes)
        figures["unique_raw_read_mb_s"] = median(rounds["raw"])
        figures["unique_consumer_mb_s"] = median(rounds["records"])
        figures["unique_consumer_ratio_vs_raw"] = median(rounds["records_ratio"])
        figures["unique_consumer_ratio_vs_raw_min"] = min(rounds["records_ratio"])
        figures["unique_consumer_ratio_vs_raw_max"] = max(rounds["records_ratio"])

        lat_store = CountingStore(LocalStore(d / "lat"))
        lat = durable_latency(lat_store, 2.0 if args.quick else 10.0)
        figures["durable_latency_p50_ms"] = float(np.percentile(lat, 50))
        figures["durable_latency_p99_ms"] = float(np.percentile(lat, 99))
        figures["latency_samples"] = len(lat)
    report("buffer_throughput", figures, args, ingest_counts)


if __name__ == "__main__":
    main()
