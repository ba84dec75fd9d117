"""store_throughput: LocalStore put/get vs raw file I/O of the same bytes, in the same run.

Baseline: ``open(path, "wb").write(data)`` + ``fsync`` for a put, ``open(path, "rb").read()`` for
a get. LocalStore does more for a put (temp file, fsync, lock, rename, directory fsync) because
that is what makes a put atomic and durable; the figure says what that costs.

Sizes: 64 MiB objects (the reservoir's file size) and 4 KiB objects (a small batch or manifest).
The two sides alternate object by object, so drift of the machine (page cache, other load) hits
both alike; MB/s is the object size over the median time of one operation. Gets read objects
written in the same run (so from the page cache, for both sides).

Target (issue 2): ratio_put_64mib and ratio_get_64mib >= 0.8 (headrace MB/s / raw MB/s).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import parse_args, report, scratch_dir  # noqa: E402

from headrace.store import CountingStore, LocalStore  # noqa: E402

MIB = 1 << 20


def raw_put(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def raw_get(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def measure(store: CountingStore, raw_dir: Path, size: int, count: int, rounds: int,
            tag: str) -> dict[str, float]:
    """Median seconds per operation for each side: ``rounds`` × (``count`` puts, ``count`` gets).

    The median, not the mean: this 2-core machine is shared, and one stalled fsync would
    otherwise decide the figure for whichever side it happened to hit.
    """
    data = os.urandom(size)
    times: dict[str, list[float]] = {"store_put": [], "raw_put": [], "store_get": [],
                                     "raw_get": []}
    for r in range(rounds):
        keys = [f"{tag}/r{r}/obj-{i:05d}" for i in range(count)]
        paths = [raw_dir / f"{tag}-r{r}-obj-{i:05d}" for i in range(count)]
        for verb in ("put", "get"):
            for i in range(count):
                # alternate which side goes first, so neither always meets a warmer cache
                for side in (("store", "raw") if (i + r) % 2 == 0 else ("raw", "store")):
                    t0 = time.perf_counter()
                    if verb == "put":
                        if side == "store":
                            store.put(keys[i], data)
                        else:
                            raw_put(paths[i], data)
                    else:
                        got = store.get(keys[i]).data if side == "store" else raw_get(paths[i])
                        if len(got) != size:
                            raise SystemExit(f"{side} get returned {len(got)} bytes, not {size}")
                    times[f"{side}_{verb}"].append(time.perf_counter() - t0)
        store.delete_many(keys)
        for p in paths:
            p.unlink()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    if args.quick:
        big_count, small_count, rounds = 4, 300, 3
    else:
        big_count, small_count, rounds = 16, 5000, 3
    figures: dict[str, float] = {}
    with scratch_dir("store-throughput") as d:
        raw_dir = d / "raw"
        raw_dir.mkdir()
        store = CountingStore(LocalStore(d / "store"))
        for label, size, count in (("64mib", 64 * MIB, big_count), ("4kib", 4096, small_count)):
            s = measure(store, raw_dir, size, count, rounds, label)
            mb = size / 1e6
            for verb in ("put", "get"):
                store_mbs = mb / s[f"store_{verb}"]
                raw_mbs = mb / s[f"raw_{verb}"]
                figures[f"store_{verb}_{label}_mb_s"] = store_mbs
                figures[f"raw_{verb}_{label}_mb_s"] = raw_mbs
                figures[f"ratio_{verb}_{label}"] = store_mbs / raw_mbs
            figures[f"objects_{label}"] = count
        figures["rounds"] = rounds
        counts = store.counts()
        figures["cost_usd_at_s3_prices"] = store.cost_usd()
    print(f"{'objects':<10}{'verb':<6}{'LocalStore MB/s':>17}{'raw MB/s':>12}{'ratio':>8}")
    for label in ("64mib", "4kib"):
        for verb in ("put", "get"):
            print(f"{label:<10}{verb:<6}{figures[f'store_{verb}_{label}_mb_s']:>17.1f}"
                  f"{figures[f'raw_{verb}_{label}_mb_s']:>12.1f}"
                  f"{figures[f'ratio_{verb}_{label}']:>8.3f}")
    report("store_throughput", figures, args, counts)


if __name__ == "__main__":
    main()
