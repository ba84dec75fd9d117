"""Crash test: a writer process is SIGKILLed at random points of checkpoint() and compact() 50
times (before, during and after data uploads, before and after the checkpoint/registry PUT,
during cleanup);
every reopen yields exactly the last completed checkpoint (or the one in flight, if its commit
PUT landed), with exactly that checkpoint's contents."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from reservoir_crash_child import META, model

from headrace.reservoir import ReservoirOptions, ReservoirStorage
from headrace.store import LocalStore

CHILD = Path(__file__).with_name("reservoir_crash_child.py")


@pytest.fixture(scope="module")
def launcher():
    """One helper process (sys.executable) that forks a fresh writer per run."""
    proc = subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def _run_child(launcher, root, registry, target, when, timer_s, log_path):
    """Fork a writer, let it be SIGKILLed (by itself at a put, or from outside on a timer)."""
    open(log_path, "w").close()
    launcher.stdin.write(f"{root} {registry} {target} {when} {timer_s or 0} {log_path}\n")
    launcher.stdin.flush()
    reply = launcher.stdout.readline().split()
    assert reply == ["killed-by", str(int(signal.SIGKILL))], reply
    lines = open(log_path).read().splitlines()
    intents = [tuple(int(f) for f in x.split()[1:]) for x in lines if x.startswith("intent")]
    dones = [int(x.split()[1]) for x in lines if x.startswith("done")]
    return intents, dones


@pytest.mark.parametrize("registry", ["bundled", "file"])
def test_sigkill_during_checkpoint_25_times_each(launcher, tmp_path, registry):
    rng = random.Random(4242 + len(registry))
    root = tmp_path / "store"
    opts = ReservoirOptions(max_file_size=16384, snapshot_interval=4, registry=registry)
    log = tmp_path / "child.log"
    last_done = 0
    kills = 0
    content_of: dict[int, int] = {}
    for i in range(25):
        if i % 5 == 4:  # some kills come from outside, at a random moment
            intents, dones = _run_child(launcher, root, registry, 0, "none", rng.uniform(0.05, 0.4), log)
        else:
            intents, dones = _run_child(launcher, root, registry, rng.randint(1, 14),
                                        rng.choice(["before", "after"]), None, log)
        kills += 1
        for v, k in intents:  # version v holds the contents of round k (later lines win)
            content_of[v] = k
        last_done = max([last_done, *dones])
        in_flight = max([v for v, _k in intents], default=last_done)
        with ReservoirStorage.open(LocalStore(root, fsync=False), options=opts) as st:
            v = st.version
            assert last_done <= v <= max(in_flight, last_done), (v, last_done, in_flight)
            k = content_of.get(v, 0)
            if v:
                assert st.read(META) == k.to_bytes(8, "little"), (v, k)
            expected = model(k)
            for pid in range(40):
                if pid in expected:
                    assert st.read(pid) == expected[pid], (v, pid)
                else:
                    assert not st.contains(pid), (v, pid)
            last_done = v
    assert kills == 25
