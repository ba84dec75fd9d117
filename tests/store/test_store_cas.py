"""Compare-and-set under contention: no lost update across processes (local) or threads (S3).

Each worker increments one counter object with get → put(IfMatch(etag)), retrying on
PreconditionFailed. If any IfMatch were accepted on a stale etag, two workers would write the same
value and the final count would fall short of workers × increments.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading

import pytest

from headrace.errors import PreconditionFailed
from headrace.retry import RetryPolicy
from headrace.store import CREATE, IfMatch, LocalStore, ObjectStore, open_store

WORKERS = 8
INCREMENTS = 200
# S3 (threads against one moto server, one request at a time): 50 increments a worker
# still race (measured: 49-83 conflicts over 8 workers, every worker losing some; 144
# at 200), each loss a stale IfMatch that moto refused, at a quarter of the requests
S3_INCREMENTS = 50
KEY = "cas/counter"

# one worker process: its own LocalStore on the shared folder, IfMatch retries with backoff
_WORKER = textwrap.dedent(
    """
    import sys
    from headrace.errors import PreconditionFailed
    from headrace.retry import RetryPolicy
    from headrace.store import IfMatch, LocalStore

    store = LocalStore(sys.argv[1])
    conflicts = 0
    known = None  # (value, etag) after a win: try the next increment on it without a GET
    for _ in range(int(sys.argv[2])):
        policy = RetryPolicy(max_attempts=100_000, base_delay_s=0.002, max_delay_s=0.05,
                             max_elapsed_s=120)
        for _attempt in policy.delays():
            if known is None:
                res = store.get("cas/counter")
                known = (int(res.data), res.etag)
            value, etag = known
            try:
                known = (value + 1, store.put("cas/counter", str(value + 1).encode(),
                                              IfMatch(etag)))
                break
            except PreconditionFailed:
                known = None
                conflicts += 1
        else:
            sys.exit("gave up")
    print(conflicts)
    """
)


def _increment(store: ObjectStore, n: int, conflicts: list[int], base_delay_s: float,
               max_delay_s: float) -> None:
    """``n`` increments. After a win the worker tries its next increment on the etag its own put
    returned, without a GET (as a CAS client caching its last state does); a loss re-reads."""
    lost = 0
    known: tuple[int, str] | None = None
    for _ in range(n):
        policy = RetryPolicy(max_attempts=100_000, base_delay_s=base_delay_s,
                             max_delay_s=max_delay_s, max_elapsed_s=120)
        for _attempt in policy.delays():
            if known is None:
                res = store.get(KEY)
                known = (int(res.data), res.etag)
            value, etag = known
            try:
                known = (value + 1, store.put(KEY, str(value + 1).encode(), IfMatch(etag)))
                break
            except PreconditionFailed:
                known = None
                lost += 1
        else:
            raise AssertionError("increment gave up")
    conflicts.append(lost)


def test_local_store_cas_across_processes(tmp_path):
    root = tmp_path / "store"
    store = LocalStore(root)
    store.put(KEY, b"0", CREATE)
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(root), str(INCREMENTS)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(WORKERS)
    ]
    conflicts = 0
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        conflicts += int(out.strip())
    assert int(store.get(KEY).data) == WORKERS * INCREMENTS
    # the processes really raced (otherwise this test would prove nothing about the lock)
    assert conflicts > 0
    assert [m.key for m in store.list("")] == [KEY]


def test_local_store_cas_across_threads(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put(KEY, b"0", CREATE)
    conflicts: list[int] = []
    threads = [threading.Thread(target=_increment, args=(store, 100, conflicts, 0.0005, 0.01))
               for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conflicts) == WORKERS
    assert int(store.get(KEY).data) == WORKERS * 100


@pytest.fixture
def quiet_werkzeug():
    """moto's server logs every request; thousands of log lines would only slow the test."""
    log = logging.getLogger("werkzeug")
    level = log.level
    log.setLevel(logging.ERROR)
    yield
    log.setLevel(level)


def test_s3_cas_across_threads(s3_url, quiet_werkzeug):
    store = open_store(s3_url)
    store.put(KEY, b"0", CREATE)
    conflicts: list[int] = []
    # moto answers one request at a time in this process: a wider backoff wastes fewer requests
    threads = [threading.Thread(target=_increment,
                                args=(store, S3_INCREMENTS, conflicts, 0.05, 1.0))
               for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conflicts) == WORKERS, "a worker thread died"
    assert int(store.get(KEY).data) == WORKERS * S3_INCREMENTS
    assert sum(conflicts) > 0


def test_create_race_has_exactly_one_winner(tmp_path):
    store = LocalStore(tmp_path / "store")
    winners: list[int] = []
    barrier = threading.Barrier(WORKERS)

    def create(i: int) -> None:
        barrier.wait()
        try:
            store.put("race", str(i).encode(), CREATE)
            winners.append(i)
        except FileExistsError:
            pass

    threads = [threading.Thread(target=create, args=(i,)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert store.get("race").data == str(winners[0]).encode()


def test_stale_etag_after_delete_and_recreate_is_refused(tmp_path):
    """An etag names one write: the same bytes written again later get a new etag."""
    store = LocalStore(tmp_path / "store")
    old = store.put("k", b"same")
    store.delete("k")
    store.put("k", b"same")
    try:
        store.put("k", b"new", IfMatch(old))
    except PreconditionFailed:
        pass
    else:
        raise AssertionError("IfMatch accepted the etag of a deleted object")
    assert store.get("k").data == b"same"
