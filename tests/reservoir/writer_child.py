"""A reservoir writer in its own process, driven line by line over stdin/stdout by a test.

    python writer_child.py ROOT REGISTRY
    <- "ready"            opened the stream (at the version it prints) and committed pages
    -> "go"               now checkpoint
    <- "committed N" | "ConcurrentWriter"
"""

from __future__ import annotations

import sys

from headrace.reservoir import ConcurrentWriter, ReservoirOptions, ReservoirStorage
from headrace.store import LocalStore


def main() -> None:
    root, registry = sys.argv[1], sys.argv[2]
    opts = ReservoirOptions(max_file_size=16384, registry=registry, snapshot_interval=100)
    st = ReservoirStorage.open(LocalStore(root, fsync=False), options=opts)
    s = st.session()
    for pid in range(20):
        s.write(pid, b"child" + bytes([pid]) * 3000)
    s.commit()
    print(f"ready {st.version}", flush=True)
    assert sys.stdin.readline().strip() == "go"
    try:
        v = st.checkpoint()
    except ConcurrentWriter:
        print("ConcurrentWriter", flush=True)
    else:
        print(f"committed {v}", flush=True)
    st._uploader.close()  # no close(): a fenced writer has nothing to flush


if __name__ == "__main__":
    main()
