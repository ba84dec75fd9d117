"""Subprocess worker for the buffer's contention and crash tests (not a test module).

    produce URL PRODUCER_ID N [FLUSH_INTERVAL_S [PAUSE_S]]
                                                   produce N calls (PAUSE_S apart), print each
                                                   durable index
    consume URL OUTFILE LAST_ACKED DELAY_S         consume to OUTFILE (one JSON line per batch,
                                                   fsynced before the ack), until the queue is empty
    stall URL                                      produce one batch; after its upload print
                                                   "UPLOADED loc" and wait for a stdin line; once
                                                   durable print "DURABLE seq loc", wait forever
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from hookstore import HookStore

from headrace.buffer import Consumer, ConsumerConfig, Producer, ProducerConfig
from headrace.store import open_store


def produce(url: str, producer_id: str, n: int, flush_interval_s: float,
            pause_s: float = 0.0) -> None:
    cfg = ProducerConfig(url=url, flush_interval_s=flush_interval_s)
    handles = []
    ready = threading.Condition()

    def report() -> None:  # print indices as they become durable, in produce order
        i = 0
        while i < n:
            with ready:
                ready.wait_for(lambda i=i: len(handles) > i)
                h = handles[i]
            h.watcher.await_durable()
            sys.stdout.write(f"{i}\n")
            sys.stdout.flush()
            i += 1

    reporter = threading.Thread(target=report, name="durable-reporter")
    reporter.start()
    with Producer(cfg) as producer:
        for i in range(n):
            h = producer.produce([f"{producer_id}:{i}".encode()], producer_id.encode())
            with ready:
                handles.append(h)
                ready.notify()
            if pause_s:
                time.sleep(pause_s)
    reporter.join()
    sys.stderr.write("METRICS " + json.dumps(producer.metrics()) + "\n")


def consume(url: str, outfile: str, last_acked: str, delay_s: float) -> None:
    consumer = Consumer(ConsumerConfig(url=url, gc_interval_s=0, acks_per_dequeue=3))
    consumer.initialize(None if last_acked == "none" else int(last_acked))
    fd = os.open(outfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while (batch := consumer.next_batch()) is not None:
        line = json.dumps({"seq": batch.sequence,
                           "entries": [e.decode() for e in batch.entries]}) + "\n"
        os.write(fd, line.encode())
        os.fsync(fd)
        consumer.ack(batch.sequence)
        time.sleep(delay_s)
    consumer.close()
    os.close(fd)


def stall(url: str) -> None:
    """A producer that stalls between upload and append until the parent says go."""
    stalled = []

    def after(verb: str, key: str) -> None:
        if verb == "put" and key.endswith(".batch") and not stalled:
            stalled.append(key)
            print(f"UPLOADED {key}", flush=True)
            sys.stdin.readline()

    store = HookStore(open_store(url), after=after)
    producer = Producer(ProducerConfig(store=store))
    handle = producer.produce([b"stalled-1", b"stalled-2"])
    handle.watcher.await_durable(60)
    print(f"DURABLE {handle.watcher.sequence} {handle.watcher.location}", flush=True)
    threading.Event().wait()  # the parent SIGKILLs us: no close(), no cleanup


if __name__ == "__main__":
    if sys.argv[1] == "stall":
        stall(sys.argv[2])
    elif sys.argv[1] == "produce":
        interval = float(sys.argv[5]) if len(sys.argv) > 5 else 0.1
        pause = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), interval, pause)
    else:
        consume(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
