"""SIGKILL crash tests: acknowledged durability survives, resumed consumption is exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from headrace.buffer import (
    Consumer,
    ConsumerConfig,
    GarbageCollector,
    Producer,
    ProducerConfig,
    read_entries,
)
from headrace.codec import ManualClock, SystemClock
from headrace.store import open_store

WORKER = str(Path(__file__).with_name("buffer_worker.py"))


def test_producer_killed_mid_stream_loses_nothing_reported_durable(tmp_path):
    url = str(tmp_path / "q")
    proc = subprocess.Popen([sys.executable, WORKER, "produce", url, "p", "100000", "0.005"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    durable = []
    while len(durable) < 300:  # let several batches become durable, then kill mid-stream
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode()[-2000:]
        durable.append(int(line))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    durable += [int(x) for x in proc.stdout.read().split()]  # lines already printed
    seen = [e.decode() for b in read_entries(open_store(url), "ingest/manifest", None)
            for e in b.entries]
    assert len(seen) == len(set(seen)), "no entry enqueued twice"
    indices = [int(e.split(":")[1]) for e in seen]
    assert indices == list(range(len(indices))), "a prefix of the produce calls, in order"
    assert set(durable) <= set(indices) and len(indices) < 100000


def _lines(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    complete = text[: text.rfind("\n") + 1]  # a line cut by the kill was never acked
    return [json.loads(x) for x in complete.splitlines()]


def test_consumer_killed_and_restarted_reads_each_batch_once(tmp_path):
    url = str(tmp_path / "q")
    expected = []
    with Producer(ProducerConfig(url=url, flush_size_bytes=1)) as p:
        for i in range(60):
            p.produce([f"e{i}a".encode(), f"e{i}b".encode()])
            expected += [f"e{i}a", f"e{i}b"]
    out = tmp_path / "sink.jsonl"
    proc = subprocess.Popen([sys.executable, WORKER, "consume", url, str(out), "none", "0.02"],
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(_lines(out)) < 20:
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = _lines(out)
    last_acked = first[-1]["seq"]
    assert 20 <= len(first) < 60
    # restart with the last sequence the sink holds: nothing acked is re-read, nothing skipped
    subprocess.run([sys.executable, WORKER, "consume", url, str(out), str(last_acked), "0"],
                   check=True, timeout=120)
    lines = _lines(out)
    assert lines[len(first)]["seq"] == last_acked + 1
    assert [x["seq"] for x in lines] == list(range(60))
    assert [e for x in lines for e in x["entries"]] == expected
    c = Consumer(ConsumerConfig(url=url, gc_interval_s=0))
    c.initialize()
    assert c.next_batch() is None  # the restarted consumer dequeued everything on close


def test_producer_stalled_past_gc_then_killed_after_durable_loses_nothing(tmp_path):
    """Issue 15 item 6 across processes: the producer stops between upload and append, a
    collector (clock two hours ahead, so the producer's own age check cannot help) deletes the
    file, the producer resumes, reports durable and is SIGKILLed at once. The consumer must
    still read the batch: the producer put it back before reporting it durable."""
    url = str(tmp_path / "q")
    proc = subprocess.Popen([sys.executable, WORKER, "stall", url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("UPLOADED "), proc.stderr.read()[-2000:]
        location = line.split()[1]
        ahead = ManualClock(start_ms=SystemClock().now_ms() + 7_200_000)
        collected = GarbageCollector(open_store(url), grace_period_s=600, clock=ahead).run_once()
        assert collected.deleted == [location]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.startswith("DURABLE "), proc.stderr.read()[-2000:]
        _, sequence, durable_at = line.split()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert durable_at == location
    c = Consumer(ConsumerConfig(url=url, gc_interval_s=0))
    c.initialize()
    batch = c.next_batch()
    assert (batch.sequence, batch.location) == (int(sequence), location)
    assert batch.entries == [b"stalled-1", b"stalled-2"]
