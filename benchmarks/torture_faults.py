"""Torture, part 4: a FaultyStore (random transient failures and lost replies) under a buffer
producer and consumer, and under persist writers racing on one shard. An operation that raised
is not acknowledged (it may still have landed); everything acknowledged must be there once."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from headrace.errors import HeadraceError
from headrace.store import FaultyStore, LocalStore

RATES = {"fail_rate": 0.05, "lost_reply_rate": 0.05}


def _retry(fn, attempts: int = 60):
    """Call ``fn`` until it does not raise a HeadraceError (the faults are transient)."""
    for i in range(attempts):
        try:
            return fn()
        except HeadraceError:
            if i == attempts - 1:
                raise


def faulty_buffer(work: Path, quick: bool) -> dict:
    from headrace.buffer import Consumer, ConsumerConfig, OutOfOrderAck, Producer, ProducerConfig

    root = work / "faulty-queue"
    calls = 400 if quick else 2000
    pstore = FaultyStore(LocalStore(root, fsync=False), seed=3, **RATES)
    acked, failed = [], 0
    with Producer(ProducerConfig(store=pstore, flush_interval_s=0.005)) as p:
        handles = []
        for i in range(calls):  # a batch per few calls: many uploads and manifest CASes
            handles.append((i, p.produce([f"f:{i}".encode()])))
            if i % 4 == 3:
                try:
                    handles[-1][1].watcher.await_durable(120)
                except HeadraceError:
                    pass
        for i, h in handles:
            try:
                h.watcher.await_durable(120)
                acked.append(f"f:{i}")
            except HeadraceError:
                failed += 1
    cstore = FaultyStore(LocalStore(root, fsync=False), seed=4, **RATES)
    c = Consumer(ConsumerConfig(store=cstore, gc_interval_s=0, acks_per_dequeue=5))
    _retry(c.initialize)
    consumed: list[str] = []
    while (batch := _retry(c.next_batch)) is not None:
        consumed += [e.decode() for e in batch.entries]
        for attempt in range(60):
            try:
                c.ack(batch.sequence)
                break
            except OutOfOrderAck:
                if attempt == 0:
                    raise
                break  # an earlier attempt landed
            except HeadraceError:
                continue
    _retry(c.close)
    got = Counter(consumed)
    return {"faults": sum(pstore.injected.values()) + sum(cstore.injected.values()),
            "acked_lost": len(set(acked) - set(got)),
            "acked_duplicated": sum(n - 1 for n in got.values()),
            "detail": f"{len(acked)} acked, {failed} failed, {len(consumed)} consumed"}


def faulty_persist(work: Path, quick: bool) -> dict:
    from headrace.persist import PersistClient, UpperMismatch, make_updates

    root, target = work / "faulty-persist", (25 if quick else 120)
    acked: list[tuple[int, int]] = []
    stores = [FaultyStore(LocalStore(root, fsync=False), seed=10 + i, **RATES) for i in range(3)]
    errors: list[str] = []

    def writer(i: int) -> None:
        client = PersistClient(stores[i])
        w = _retry(lambda: client.open_writer("f"))
        while (u := _retry(w.upper)) < target:
            batch = make_updates({"writer": [i], "at": [u]}, [u])
            try:
                w.compare_and_append(batch, u, u + 1)
                acked.append((u, i))
            except UpperMismatch:
                pass
            except HeadraceError:
                pass  # not acknowledged; it may have landed: the next upper() tells
        try:
            client.close()
        except HeadraceError as e:  # a background compaction that met a fault
            errors.append(repr(e))

    threads = [threading.Thread(target=writer, args=(i,), name=f"torture-persist-{i}")
               for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    client = PersistClient(LocalStore(root, fsync=False))
    snap = client.read_only("f").snapshot(target - 1, timeout_s=0)
    rows = Counter(zip(snap.column("at").to_pylist(), snap.column("writer").to_pylist(),
                       snap.column("diff").to_pylist(), strict=True))
    client.close()
    per_time = Counter(at for (at, _w, _d) in rows)
    stored = {(at, w) for (at, w, d) in rows if d == 1}
    return {"faults": sum(sum(s.injected.values()) for s in stores),
            "acked_lost": len(set(acked) - stored),
            "acked_duplicated": sum(n - 1 for n in per_time.values()) +
            sum(1 for (_a, _w, d) in rows if d != 1),
            "committed_damaged": int(sorted(per_time) != list(range(target))),
            "detail": f"{len(acked)} acked of {target} times; close errors {errors[:2]}"}
