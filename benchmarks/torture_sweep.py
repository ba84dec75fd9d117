"""Torture, part 2: the corruption sweep over every file type (see torture.py).

Each target builds a small dataset on a local folder, reads it once through the public API
(the reference result), then for every file of each type flips one byte or truncates the file at
many offsets and reads again. A read must return the reference result or raise a HeadraceError;
a different result is a silent wrong read, any other exception an untyped error. After every
read the folder is put back exactly as it was (a read may register a reader, heal a cache...).
"""

from __future__ import annotations

import os
import random
import shutil
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.store import LocalStore


@dataclass
class Target:
    """One component's dataset: ``files()`` maps a file type to its paths under ``root`` (asked
    after the reference read, which may itself write, e.g. register a reader)."""

    component: str
    root: Path
    files: Callable[[], dict[str, list[Path]]]
    read: Callable[[], object]
    # (want, got) -> True when a wrong read differs only where the format has no check by design
    unchecked: Callable[[object, object], bool] | None = None


@dataclass
class SweepResult:
    mutations: int = 0
    right: int = 0
    typed: int = 0
    silent_wrong_reads: int = 0
    # wrong reads where a format has no integrity check by design (RFC 0001's uncompressed
    # "none" batch, whereas headrace's producers write zstd batches whose frames carry a
    # checksum; the queue manifest's metadata items)
    unchecked_wrong_reads: int = 0
    untyped_errors: int = 0
    by_type: Counter = field(default_factory=Counter)  # "type:outcome" -> count
    examples: list[str] = field(default_factory=list)


def _snapshot_tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _restore_tree(root: Path, snap: dict[str, bytes]) -> None:
    """Put ``root`` back to ``snap`` (files only; extra files deleted, changed ones rewritten)."""
    seen = set()
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            seen.add(rel)
            want = snap.get(rel)
            if want is None:
                p.unlink()
            elif p.read_bytes() != want:
                p.write_bytes(want)
    for rel, data in snap.items():
        if rel not in seen:
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)


def _mutations(size: int, budget: int, rng: random.Random):
    """(kind, offset, byte mask): flips at many offsets (all of them for small files; header and
    footer regions always), then truncations."""
    if size <= budget:
        offsets = list(range(size))
    else:
        edge = min(48, budget // 4)
        middle = sorted(rng.sample(range(edge, size - edge), budget - 2 * edge))
        offsets = list(range(edge)) + middle + list(range(size - edge, size))
    for off in offsets:
        yield "flip", off, 1 << rng.randrange(8) if rng.random() < 0.7 else 0xFF
    cuts = {0, 1, size // 2, max(size - 1, 0)}
    cuts |= {rng.randrange(size) for _ in range(max(budget // 20, 2))} if size else set()
    for cut in sorted(c for c in cuts if c < size):
        yield "truncate", cut, 0


def sweep(target: Target, budget: int, files_per_type: int, rng: random.Random,
          result: SweepResult) -> None:
    want = target.read()
    base = _snapshot_tree(target.root)
    for ftype, paths in target.files().items():
        for path in paths[:files_per_type]:
            orig = path.read_bytes()
            for kind, off, mask in _mutations(len(orig), budget, rng):
                if kind == "flip":
                    bad = bytearray(orig)
                    bad[off] ^= mask
                    bad = bytes(bad)
                else:
                    bad = orig[:off]
                path.write_bytes(bad)
                outcome = _classify(target.read, want)
                if outcome == "silent_wrong_reads" and (
                        ftype.endswith("_unchecked") or
                        (target.unchecked is not None and target.unchecked(want, _last_got[0]))):
                    outcome = "unchecked_wrong_reads"
                result.mutations += 1
                setattr(result, outcome, getattr(result, outcome) + 1)
                result.by_type[f"{target.component}/{ftype}:{outcome}"] += 1
                if outcome in ("silent_wrong_reads", "untyped_errors") and \
                        len(result.examples) < 40:
                    result.examples.append(
                        f"{target.component}/{ftype} {path.name} {kind}@{off} mask={mask:#x}: "
                        f"{outcome} {_last_detail[0]}")
                _restore_tree(target.root, base)


_last_detail = [""]
_last_got: list[object] = [None]


def _classify(read: Callable[[], object], want: object) -> str:
    try:
        got = read()
    except HeadraceError as e:
        _last_detail[0] = f"{type(e).__name__}"
        return "typed"
    except Exception as e:  # noqa: BLE001 - the point is to count these
        tb = traceback.extract_tb(e.__traceback__)[-1]
        _last_detail[0] = f"{type(e).__name__}: {str(e)[:120]} at {tb.filename}:{tb.lineno}"
        return "untyped_errors"
    if got == want:
        return "right"
    _last_detail[0] = "result differs"
    _last_got[0] = got
    return "silent_wrong_reads"


# ---- targets ------------------------------------------------------------------------------

def buffer_target(root: Path) -> Target:
    from headrace.buffer import Producer, ProducerConfig, read_entries

    store = LocalStore(root, fsync=False)
    for compression in ("none", "zstd"):
        cfg = ProducerConfig(store=store, flush_interval_s=0.01, batch_compression=compression)
        with Producer(cfg) as p:
            for i in range(3):
                h = p.produce([f"{compression}-{i}-{j}".encode() * (j + 1) for j in range(6)],
                              metadata=f"m{i}".encode())
                h.watcher.await_durable(30)

    def read():
        batches = read_entries(LocalStore(root, fsync=False), "ingest/manifest", None,
                               data_path_prefix="ingest")
        return [(b.sequence, b.location, list(b.entries), tuple(b.metadata)) for b in batches]

    def only_metadata_differs(want, got) -> bool:
        """The manifest has no checksum (RFC 0001): a flipped ingestion time or payload (or a
        start_index still inside its batch) cannot be told from the real one."""
        return len(want) == len(got) and all(
            w[:3] == g[:3] and len(w[3]) == len(g[3]) for w, g in zip(want, got, strict=True))

    def batches(compressed: bool) -> list[Path]:  # the footer's compression byte (@-7)
        return [f for f in sorted((root / "ingest").glob("*.batch"))
                if (f.read_bytes()[-7] != 0) == compressed]

    return Target("buffer", root, lambda: {
        "queue_manifest": [root / "ingest" / "manifest"],
        "batch": batches(True), "batch_none_unchecked": batches(False)}, read,
        only_metadata_differs)


def _reservoir_write(store, opts, rounds: int) -> None:
    from headrace.reservoir import ReservoirStorage

    for r in range(rounds):
        with ReservoirStorage.open(store, options=opts) as st:
            s = st.session()
            for pid in range(r * 3, r * 3 + 12):
                s.write(pid, bytes([r, pid % 256]) * 700)
            s.delete(r)
            s.commit()
            st.checkpoint()


def reservoir_target(root: Path, registry: str) -> Target:
    from headrace.reservoir import ReservoirOptions, ReservoirReader

    store = LocalStore(root, fsync=False)
    opts = ReservoirOptions(max_file_size=8192, registry=registry, snapshot_interval=3)
    _reservoir_write(store, opts, 4)

    def read():
        with ReservoirReader.open(LocalStore(root, fsync=False), options=opts) as r:
            ids = sorted(r.page_ids())
            return r.version, [(i, bytes(r.read(i))) for i in ids]

    return Target(f"reservoir-{registry}", root, lambda: _reservoir_files(root), read)


def _reservoir_files(root: Path) -> dict[str, list[Path]]:
    kinds: dict[str, list[Path]] = {}
    for p in _files(root):
        if p.suffix == ".dat":
            kinds.setdefault("reservoir_data", []).append(p)
        elif p.suffix == ".bundle":
            kinds.setdefault("reservoir_bundle", []).append(p)
        elif p.name.endswith(".checkpoint"):
            kinds.setdefault("reservoir_checkpoint", []).append(p)
        elif p.name == "registry":
            kinds.setdefault("reservoir_registry", []).append(p)
    for k in kinds:  # newest first: those are the ones a read depends on
        kinds[k].sort(reverse=True)
    return kinds


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "/.hr" not in str(p))


def spine_target(root: Path) -> Target:
    from headrace.spine import Batch, Circuit, LocalBatchStore

    with Circuit.open(root, "torture") as c:
        ints = c.spine("ints", pa.int64(), pa.int64())
        strs = c.spine("strs", pa.string(), pa.float64())
        for step in range(3):
            ints.insert(Batch.from_pydict(list(range(step * 50, step * 50 + 400)),
                                          [step] * 400, [1] * 400))
            strs.insert(Batch.from_pydict([f"k{i:04d}" for i in range(step, 300, 3)],
                                          [float(step)] * len(range(step, 300, 3)),
                                          [1] * len(range(step, 300, 3))))
            c.commit(step=step)

    def read():
        store = LocalBatchStore(root, read_only=True)
        try:
            with Circuit.open(store, "torture") as c:
                return {n: c.spine(n).to_table().to_pylist() for n in ("ints", "strs")}
        finally:
            store.close()

    return Target("spine", root, lambda: {
        "spine_catalog": [root / "checkpoints.headrace"],
        "spine_manifest": sorted(root.glob("*/spine-*.dat"), key=os.path.getmtime, reverse=True),
        "spine_batch": sorted(root.glob("*.batch"), key=os.path.getmtime, reverse=True)}, read)


def persist_target(root: Path) -> Target:
    from headrace.persist import PersistClient, make_updates

    client = PersistClient(LocalStore(root, fsync=False))
    w = client.open_writer("s")
    for t in range(5):
        w.compare_and_append(make_updates({"k": [t, t + 100], "v": [f"v{t}", "x"]}, [t, t]),
                             t, t + 1)
    client.close()

    def read():
        c = PersistClient(LocalStore(root, fsync=False))
        try:
            snap = c.read_only("s").snapshot(4, timeout_s=0)
            return sorted(zip(*(snap.column(n).to_pylist() for n in snap.column_names),
                              strict=True))
        finally:
            c.close()

    shard = root / "persist" / "shards" / "s"
    return Target("persist", root, lambda: {  # the head version first: the one a read uses
        "persist_state": sorted((p for p in (shard / "consensus").iterdir()
                                 if p.name.isdigit()), reverse=True),
        "persist_part": sorted((shard / "parts").rglob("*.parquet"))}, read)


def backup_target(root: Path) -> Target:
    from headrace.backup import BackupManager, RestoreManager

    src = root.parent / (root.name + "-src")
    (src / "sub").mkdir(parents=True)
    for i in range(4):
        (src / f"f{i}.sst").write_bytes(bytes([i]) * (i * 3000 + 10))
    (src / "big.log").write_bytes(bytes(range(256)) * 9000)  # its own blob
    (src / "sub" / "meta.json").write_text('{"a": 1}')
    os.chmod(src / "f1.sst", 0o600)
    store = LocalStore(root, fsync=False)
    bm = BackupManager(store, prefix="bk")
    index_id = bm.upload(src, checkpoint_id="1")
    bm.cleanup(index_id)
    bm.close()
    out = root.parent / (root.name + "-restore")

    def read():
        shutil.rmtree(out, ignore_errors=True)
        with RestoreManager(LocalStore(root, fsync=False), prefix="bk") as rm:
            rm.restore(index_id, out)
        return sorted((str(p.relative_to(out)), p.read_bytes() if p.is_file() else None,
                       p.stat().st_mode) for p in out.rglob("*"))

    return Target("backup", root, lambda: {
        "backup_index": [p for p in _files(root) if "/index/" in str(p)],
        "backup_blob": [p for p in _files(root) if "/blobs/" in str(p)]}, read)


def corruption_sweep(work: Path, quick: bool, seed: int = 15) -> SweepResult:
    rng = random.Random(seed)
    budget, per_type = (40, 1) if quick else (160, 3)
    result = SweepResult()
    builders = [("buffer", buffer_target), ("res-file", lambda r: reservoir_target(r, "file")),
                ("res-bundled", lambda r: reservoir_target(r, "bundled")),
                ("spine", spine_target), ("persist", persist_target), ("backup", backup_target)]
    for name, build in builders:
        target = build(work / name)
        sweep(target, budget, per_type, rng, result)
    return result
