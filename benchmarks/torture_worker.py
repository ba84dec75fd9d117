"""Child processes of benchmarks/torture.py (not a benchmark): each prints what it has had
acknowledged, one line at a time, so the parent can SIGKILL it anywhere and check the store.

    produce URL PRODUCER N             "D i" once produce() call i is durable
    consume URL SINK LAST_ACKED        appends "seq entry,entry…" lines to SINK (fsynced) before
                                       each ack, until the queue is empty
    reservoir URL REGISTRY ME ROUNDS   checkpoints ROUNDS times into one stream: "C version tag"
                                       per committed checkpoint, "F" when fenced (then reset())
    persist URL ME BARRIER TARGET      races compare_and_append to TARGET: "W upper" per win
    hostile TMP                        imports once, then runs each hostile-input case
                                       (torture_hostile.CASES) in a forked child of its own, which
                                       prints {"case", "outcome", "growth_mib"} as JSON
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def produce(url: str, producer: str, n: int) -> None:
    from headrace.buffer import Producer, ProducerConfig

    handles: list = []
    ready = threading.Condition()

    def report() -> None:
        for i in range(n):
            with ready:
                ready.wait_for(lambda i=i: len(handles) > i)
            handles[i].watcher.await_durable()
            print(f"D {i}", flush=True)

    reporter = threading.Thread(target=report, name="torture-durable")
    reporter.start()
    with Producer(ProducerConfig(url=url, flush_interval_s=0.005)) as p:
        for i in range(n):
            h = p.produce([f"{producer}:{i}".encode()], producer.encode())
            with ready:
                handles.append(h)
                ready.notify()
    reporter.join()


def consume(url: str, sink: str, last_acked: str) -> None:
    from headrace.buffer import Consumer, ConsumerConfig

    c = Consumer(ConsumerConfig(url=url, gc_interval_s=0, acks_per_dequeue=3))
    c.initialize(None if last_acked == "none" else int(last_acked))
    fd = os.open(sink, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while (batch := c.next_batch()) is not None:
        os.write(fd, f"{batch.sequence} {','.join(e.decode() for e in batch.entries)}\n".encode())
        os.fsync(fd)
        c.ack(batch.sequence)
    c.close()


PAGES = 20


def page(tag: str, pid: int) -> bytes:
    """Page ``pid`` of the checkpoint tagged ``tag``: ~2.5 KB, so 16 KiB files fill up."""
    return f"{tag}|{pid}|".encode() + bytes([pid]) * 2500


def reservoir(url: str, registry: str, me: str, rounds: int) -> None:
    from headrace.reservoir import (
        ConcurrentWriter,
        ReservoirFailed,
        ReservoirOptions,
        ReservoirStorage,
    )
    from headrace.store import open_store

    opts = ReservoirOptions(max_file_size=16384, registry=registry, snapshot_interval=4)
    st = ReservoirStorage.open(open_store(url), options=opts)
    for r in range(rounds):
        tag = f"{me}.{r}"
        s = st.session()
        for pid in range(PAGES):
            s.write(pid, page(tag, pid))
        s.commit()
        try:
            v = st.checkpoint()
        except (ConcurrentWriter, ReservoirFailed):  # fenced, or CommitUnknown: reload
            print("F", flush=True)
            st.reset()
        else:
            print(f"C {v} {tag}", flush=True)
    st.close()


def persist(url: str, me: str, barrier: str, target: int) -> None:
    from headrace.persist import PersistClient, UpperMismatch, make_updates

    w = PersistClient(url).open_writer("race")
    w.upper()
    open(os.path.join(barrier, f"ready-{me}"), "w").close()
    while not os.path.exists(os.path.join(barrier, "go")):
        time.sleep(0.002)
    while (upper := w.upper()) < target:
        batch = make_updates({"writer": [int(me)] * 3, "at": [upper] * 3, "i": [0, 1, 2]},
                             [upper] * 3)
        try:
            w.compare_and_append(batch, upper, upper + 1)
            print(f"W {upper}", flush=True)
        except UpperMismatch:
            pass


def hostile(tmp: str) -> None:
    """Each case in a fork of a warm process: its ru_maxrss starts at the parent's RSS, so the
    growth is the case's own; the address space is capped 1.5 GiB above the start."""
    import torture_hostile

    torture_hostile.warm_up()
    for case in torture_hostile.CASES:
        where = os.path.join(tmp, case)
        os.makedirs(where)
        pid = os.fork()
        if pid == 0:
            try:
                _one_case(case, where)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status:
            print(json.dumps({"case": case, "outcome": f"untyped crash, wait status {status}",
                              "growth_mib": 0.0}), flush=True)


def _one_case(case: str, tmp: str) -> None:
    import resource

    import torture_hostile

    from headrace.errors import HeadraceError

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1536 << 20), resource.RLIM_INFINITY))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        torture_hostile.CASES[case](tmp)
        outcome = "accepted"
    except HeadraceError as e:
        outcome = f"typed {type(e).__name__}: {str(e)[:160]}"
    except MemoryError:
        outcome = "untyped MemoryError (hit the 1.5 GiB address-space cap)"
    except Exception as e:  # noqa: BLE001 - counted by the parent
        outcome = f"untyped {type(e).__name__}: {str(e)[:160]}"
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"case": case, "outcome": outcome, "growth_mib": (after - before) / 1024}),
          flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "produce":
        produce(rest[0], rest[1], int(rest[2]))
    elif mode == "consume":
        consume(*rest)
    elif mode == "reservoir":
        reservoir(rest[0], rest[1], rest[2], int(rest[3]))
    elif mode == "persist":
        persist(rest[0], rest[1], rest[2], int(rest[3]))
    elif mode == "hostile":
        hostile(rest[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
