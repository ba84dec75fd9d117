"""8 producer processes × 2,000 produce() calls into one manifest, on the local store and on S3
(moto): every entry read exactly once, sequences contiguous, per-producer order preserved.

Locally each producer paces its calls over ~2 s and flushes every 10 ms: hundreds of CAS appends
race for the manifest. On S3 (slower round trips) the calls are not paced.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from headrace.buffer import Consumer, ConsumerConfig

WORKER = str(Path(__file__).with_name("buffer_worker.py"))
PRODUCERS = 8


def run_producers(url: str, calls: int, flush_interval_s: float,
                  pause_s: float = 0.0) -> dict[str, float]:
    """Run the producer processes; returns their summed manifest writes and conflicts."""
    procs = [subprocess.Popen([sys.executable, WORKER, "produce", url, f"p{k}", str(calls),
                               str(flush_interval_s), str(pause_s)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for k in range(PRODUCERS)]
    totals = {"producer_manifest_writes": 0, "producer_manifest_conflicts": 0}
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
        line = next(x for x in err.decode().splitlines() if x.startswith("METRICS "))
        metrics = json.loads(line[len("METRICS "):])
        for k in totals:
            totals[k] += metrics[k]
    return totals


def check_exactly_once(url: str, calls: int) -> None:
    consumer = Consumer(ConsumerConfig(url=url, gc_interval_s=0))
    consumer.initialize()
    seen: list[str] = []
    sequences = []
    while (batch := consumer.next_batch()) is not None:
        sequences.append(batch.sequence)
        seen.extend(e.decode() for e in batch.entries)
        # each metadata item names its producer, and covers only that producer's entries
        bounds = [m.start_index for m in batch.metadata] + [len(batch.entries)]
        for m, lo, hi in zip(batch.metadata, bounds, bounds[1:], strict=False):
            assert {e.split(b":")[0] for e in batch.entries[lo:hi]} == {m.payload}
        consumer.ack(batch.sequence)
    consumer.close()
    assert sequences == list(range(len(sequences))), "sequences are contiguous from 0"
    assert len(seen) == len(set(seen)) == PRODUCERS * calls
    for k in range(PRODUCERS):
        mine = [int(e.split(":")[1]) for e in seen if e.startswith(f"p{k}:")]
        assert mine == list(range(calls)), f"producer p{k} out of order"


CALLS = 2000


def test_eight_producer_processes_local(tmp_path):
    url = str(tmp_path / "q")
    totals = run_producers(url, CALLS, 0.01, pause_s=0.001)  # ~2 s of steady flushing
    print("local", totals)
    check_exactly_once(url, CALLS)
    assert totals["producer_manifest_conflicts"] > 0, "the processes really contended"


def test_eight_producer_processes_s3(s3_url):
    totals = run_producers(s3_url, CALLS, 0.02)
    print("s3", totals)
    check_exactly_once(s3_url, CALLS)
    assert totals["producer_manifest_conflicts"] > 0, totals
