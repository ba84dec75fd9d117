"""Writer process for test_reservoir_crash (kept free of pytest so it starts fast)."""

from __future__ import annotations

import os
import signal

from headrace.reservoir import ReservoirOptions, ReservoirStorage
from headrace.store import OVERWRITE, LocalStore


def PLAN(k: int) -> list[tuple[int, bytes | None]]:
    """What checkpoint k writes: deterministic, so the parent can rebuild any version."""
    out: list[tuple[int, bytes | None]] = []
    for j in range(12 if k % 2 else 3):
        pid = (k * 7 + j) % 40
        out.append((pid, f"{k}:{pid}:".encode() * (1 + (k * 13 + j) % 250)))
    if k % 3 == 0:
        out.append(((k * 5) % 40, None))
    return out


class KillingStore(LocalStore):
    """Kills its own process (SIGKILL) at the target-th put/delete, before or after it lands."""

    def __init__(self, root, target: int, when: str):
        super().__init__(root, fsync=False)
        self.target, self.when, self.calls = target, when, 0

    def _maybe(self, phase: str) -> None:
        if self.target and phase == self.when:
            self.calls += 1
            if self.calls == self.target:
                os.kill(os.getpid(), signal.SIGKILL)

    def put(self, key, data, mode=OVERWRITE):
        self._maybe("before")
        etag = super().put(key, data, mode)
        self._maybe("after")
        return etag

    def delete_many(self, keys):
        self._maybe("before")
        super().delete_many(keys)
        self._maybe("after")


META = 1000  # a page holding k: the content index of the state it sits in


def child_main(root: str, registry: str, target: int, when: str, log_path: str) -> None:
    """The writer: checkpoints forever (until killed), compacting every third round, logging
    ``intent <version> <k>`` before and ``done <version>`` after each checkpoint."""
    opts = ReservoirOptions(max_file_size=16384, snapshot_interval=4, registry=registry,
                            in_flight_capacity=2)
    st = ReservoirStorage.open(KillingStore(root, target, when), options=opts)
    with open(log_path, "a", buffering=1) as log:
        k = int.from_bytes(st.read(META), "little") if st.contains(META) else 0
        while True:
            k += 1
            s = st.session()
            for pid, data in PLAN(k):
                if data is None:
                    s.delete(pid)
                else:
                    s.write(pid, data)
            s.write(META, k.to_bytes(8, "little"))
            s.commit()
            log.write(f"intent {st.version + 1} {k}\n")
            v = st.checkpoint()
            log.write(f"done {v}\n")
            if k % 3 == 2:  # compaction: a checkpoint that moves pages, same contents
                log.write(f"intent {st.version + 1} {k}\n")
                v = st.compact(sweep=False)
                if v is not None:
                    log.write(f"done {v}\n")


def model(version: int) -> dict[int, bytes]:
    pages: dict[int, bytes] = {}
    for k in range(1, version + 1):
        for pid, data in PLAN(k):
            if data is None:
                pages.pop(pid, None)
            else:
                pages[pid] = data
    return pages


def serve() -> None:
    """Launcher: imports everything once, then forks one writer per request line
    ``root registry target when timer_s log_path`` and replies with the writer's exit status.
    (The launcher is single-threaded, so forking it is safe.)"""
    import sys
    import time

    for line in sys.stdin:
        root, registry, target, when, timer_s, log_path = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                child_main(root, registry, int(target), when, log_path)
            finally:
                os._exit(3)
        if float(timer_s) > 0:
            time.sleep(float(timer_s))
            os.kill(pid, signal.SIGKILL)
        _pid, status = os.waitpid(pid, 0)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        print(f"killed-by {sig}", flush=True)


if __name__ == "__main__":
    serve()
