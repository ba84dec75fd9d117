"""Many processes: 8 writers racing compare_and_append, and writers killed with SIGKILL.

Workers are separate Python processes (real concurrency through the store, real kills); their
code is the WORKER string below, run with ``python -c``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from headrace.codec import ManualClock
from headrace.persist import PersistClient

WORKER = r'''
import json, os, signal, sys, time
from headrace.persist import PersistClient, UpperMismatch, make_updates
from headrace.store import open_store
mode, url, me, arg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
client = PersistClient(open_store(url))

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "race":
    barrier, target = arg.split(",")[0], int(arg.split(",")[1])
    w = client.open_writer("race")
    w.upper()
    open(f"{barrier}/ready-{me}", "w").close()
    while not os.path.exists(f"{barrier}/go"):
        time.sleep(0.001)
    while True:
        upper = w.upper()
        if upper >= target:
            break
        batch = make_updates({"writer": [me] * 3, "at": [upper] * 3, "i": [0, 1, 2]},
                             [upper] * 3)
        try:
            w.compare_and_append(batch, upper, upper + 1)
            print(json.dumps({"won": upper}), flush=True)
        except UpperMismatch:
            print(json.dumps({"lost": upper}), flush=True)
elif mode == "append":  # appends forever; 'kill-before-cas' dies between part upload and CAS
    from headrace.persist import machine
    w = client.open_writer("crash")
    if arg == "kill-before-cas":
        real = machine.ShardMachine.apply
        def apply(self, step, **kw):
            if self.shard == "crash" and client.upper("crash") >= 5:
                die()
            return real(self, step, **kw)
        machine.ShardMachine.apply = apply
    while True:
        upper = w.upper()
        w.append(make_updates({"k": [upper, upper + 1000]}, [upper, upper]), upper, upper + 1)
        print(json.dumps({"acked": upper}), flush=True)
elif mode == "compact":  # 'before-cas' or 'after-cas'
    from headrace.persist import machine
    client.writer_registration("crash").ensure()  # registered first: the kill hits the CAS
    real = machine.ShardMachine.apply
    def apply(self, step, **kw):
        if arg == "before-cas":
            die()
        out = real(self, step, **kw)
        die()
    machine.ShardMachine.apply = apply
    client.compact("crash", max_parts=2)
'''


def spawn(mode: str, url: str, me: int, arg: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, mode, url, str(me), arg],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(proc: subprocess.Popen, key: str) -> list[int]:
    out = proc.stdout.read() if proc.stdout else ""
    return [json.loads(x)[key] for x in out.splitlines() if x.startswith("{")]


@pytest.fixture(params=["local", "s3"])
def url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_url")


def test_eight_writers_race_one_winner_per_upper(url, tmp_path):
    target = 12
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [spawn("race", url, i, f"{barrier},{target}") for i in range(8)]
    deadline = time.time() + 120
    while len(list(barrier.iterdir())) < 8 and time.time() < deadline:
        time.sleep(0.01)  # every writer imported and read the shard: then start the race
    (barrier / "go").touch()
    wins: list[tuple[int, int]] = []
    lost = 0
    for i, p in enumerate(procs):
        out = p.stdout.read()
        events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        wins += [(e["won"], i) for e in events if "won" in e]
        lost += sum(1 for e in events if "lost" in e)
        assert p.wait(60) == 0, p.stderr.read()
    uppers = Counter(u for u, _ in wins)
    assert sorted(uppers) == list(range(target))  # every expected upper won ...
    assert max(uppers.values()) == 1  # ... by exactly one writer
    client = PersistClient(url)
    assert client.upper("race") == target
    snap = client.read_only("race").snapshot(target - 1)
    got = sorted(zip(snap.column("at").to_pylist(), snap.column("writer").to_pylist(),
                     snap.column("diff").to_pylist(), strict=True))
    want = sorted((u, w, 1) for u, w in wins for _ in range(3))
    assert got == want  # contents = the sum of the winning batches
    assert lost > 0  # it was a race: some compare_and_append lost


def after_leases(url: str) -> PersistClient:
    """A client whose clock is past every writer lease of the killed processes (15 min)."""
    return PersistClient(url, clock=ManualClock(int(time.time() * 1000) + 3_600_000))


def _assert_acked_exactly_once(client: PersistClient, acked: list[int]) -> None:
    upper = client.upper("crash")
    assert upper >= (max(acked) + 1 if acked else 0)
    if upper == 0:
        return
    snap = client.read_only("crash").snapshot(upper - 1)
    counts = dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(),
                      strict=True))
    assert set(counts.values()) == {1}  # nothing duplicated
    assert sorted(k for k in counts if k < 1000) == list(range(upper))  # nothing lost, no gap
    assert all(a in counts and a + 1000 in counts for a in acked)


def test_sigkill_between_part_upload_and_cas(tmp_path):
    url = str(tmp_path / "store")
    proc = spawn("append", url, 0, "kill-before-cas")
    acked = _lines(proc, "acked")
    assert proc.wait(60) == -signal.SIGKILL
    client = PersistClient(url)
    _assert_acked_exactly_once(client, acked)
    listed = [m for m in client.store.list("persist/shards/crash/parts/")]
    referenced = {p.key for p in client.state("crash").parts}
    assert len(listed) == len(referenced) + 1  # the uploaded, never linked part
    assert client.sweep(grace_s=0).parts_deleted == 0  # its writer's lease still protects it
    assert after_leases(url).sweep(grace_s=0).parts_deleted == 1  # ... until it runs out
    assert {m.key for m in client.store.list("persist/shards/crash/parts/")} == referenced
    # a restarted writer continues where the acknowledged state ends
    client.open_writer("crash").append(
        __import__("headrace.persist", fromlist=["make_updates"]).make_updates(
            {"k": [client.upper("crash")]}, [client.upper("crash")]),
        client.upper("crash"), client.upper("crash") + 1)
    _assert_acked_exactly_once(client, acked)


def test_sigkill_at_random_moments(tmp_path):
    url = str(tmp_path / "store")
    for delay in (0.01, 0.07, 0.15):
        proc = spawn("append", url, 0, "-")
        first = proc.stdout.readline()  # running and acknowledging: kill it mid-stream
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        acked = [json.loads(first)["acked"]] + _lines(proc, "acked")
        _assert_acked_exactly_once(PersistClient(url), acked)
    client = after_leases(url)
    client.sweep(grace_s=0)
    referenced = {p.key for p in client.state("crash").parts}
    assert {m.key for m in client.store.list("persist/shards/crash/parts/")} == referenced


@pytest.mark.parametrize("when", ["before-cas", "after-cas"])
def test_sigkill_during_compaction(tmp_path, when):
    from headrace.persist import make_updates

    url = str(tmp_path / "store")
    client = PersistClient(url)
    w = client.open_writer("crash")
    for t in range(6):
        w.compare_and_append(make_updates({"k": [t, t + 1000]}, [t, t]), t, t + 1)
    before = client.read_only("crash").snapshot(5)
    parts_before = client.state("crash").parts
    proc = spawn("compact", url, 0, when)
    assert proc.wait(60) == -signal.SIGKILL, proc.stderr.read()
    client = PersistClient(url)
    state = client.state("crash")
    assert (len(state.parts) == len(parts_before)) == (when == "before-cas")
    assert client.read_only("crash").snapshot(5).sort_by("k").equals(before.sort_by("k"))
    # before the CAS: the compactor's part; after it: the inputs it had not deleted yet. Both
    # belong to writers whose leases still run, so only a sweep after the leases collects them.
    assert client.sweep(grace_s=0).parts_deleted == 0
    assert after_leases(url).sweep(grace_s=0).parts_deleted == (1 if when == "before-cas" else 5)
    referenced = {p.key for p in client.state("crash").parts}
    assert {m.key for m in client.store.list("persist/shards/crash/parts/")} == referenced
    assert client.read_only("crash").snapshot(5).sort_by("k").equals(before.sort_by("k"))
