"""SIGKILL a process in the middle of many puts: every key is absent or whole, no temp file shows.

Half the puts are gather puts (the object as a list of parts), which must be exactly as atomic.

Each object carries the SHA-256 of its payload in its first 32 bytes, so a torn write (a prefix of
the bytes, or a mix of two versions) cannot pass the check. Objects are large enough (up to
~3 MiB) that the kill usually lands inside a write.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from headrace.store import LocalStore

_WRITER = textwrap.dedent(
    """
    import hashlib, os, random, sys
    from headrace.store import CREATE, IfMatch, LocalStore
    from headrace.errors import AlreadyExists, PreconditionFailed

    store = LocalStore(sys.argv[1])
    rng = random.Random(int(sys.argv[2]))
    for i in range(100000):
        key = f"k/{rng.randrange(40):02d}"
        payload = os.urandom(rng.choice([0, 1, 4096, 100_000, 1 << 20, 3 << 20]))
        obj = hashlib.sha256(payload).digest() + payload
        if rng.random() < 0.5:  # a gather put: the same bytes as several parts
            cuts = sorted(rng.randrange(len(obj) + 1) for _ in range(rng.randrange(1, 4)))
            obj = [memoryview(obj)[a:b] for a, b in zip([0, *cuts], [*cuts, len(obj)])]
        kind = rng.choice(["overwrite", "create", "ifmatch"])
        try:
            if kind == "overwrite":
                store.put(key, obj)
            elif kind == "create":
                store.put(key, obj, CREATE)
            else:
                try:
                    etag = store.head(key).etag
                except FileNotFoundError:
                    continue
                store.put(key, obj, IfMatch(etag))
        except (AlreadyExists, PreconditionFailed):
            continue
        print(key, flush=True)  # acknowledged: the put returned
    """
)


def _check_whole(store: LocalStore) -> dict[str, int]:
    sizes = {}
    for meta in store.list(""):
        assert not meta.key.rsplit("/", 1)[-1].startswith(".hr"), f"temp file listed: {meta.key}"
        data = store.get(meta.key).data
        assert len(data) >= 32, f"{meta.key}: torn object of {len(data)} bytes"
        assert hashlib.sha256(data[32:]).digest() == data[:32], f"{meta.key}: torn object"
        sizes[meta.key] = len(data)
    return sizes


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_during_puts_leaves_every_key_absent_or_whole(tmp_path, seed):
    root = tmp_path / "store"
    LocalStore(root)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(root), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked: list[str] = []
    try:
        # let it get going, then kill it at an arbitrary moment
        while len(acked) < 15:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            acked.append(line.strip())
        time.sleep(random.Random(seed).uniform(0.0, 0.05))
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    acked += out.split()

    store = LocalStore(root)
    sizes = _check_whole(store)
    # a put that returned is durable and visible (it may have been overwritten since, whole)
    assert set(acked) <= set(sizes)
    # what a crash can leave behind is only temp files, which list never shows; sweep them
    leftovers = [n for _, _, files in os.walk(root) for n in files if n.startswith(".hrtmp-")]
    assert store.sweep_temp_files() == len(leftovers)
    assert _check_whole(store) == sizes
