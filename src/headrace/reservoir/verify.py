"""Verify every CRC in the chain (registry → checkpoints → data files → pages) and inspect.

Used by ``headrace reservoir verify`` / ``inspect``; also the library's one place that reads a
data file fully and checks its structure against the checkpoint that references it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from headrace.codec import crc32, crc64
from headrace.errors import ChecksumMismatch, FormatError, HeadraceError
from headrace.reservoir.formats import datafile
from headrace.reservoir.keys import data_key, stream_prefix
from headrace.reservoir.options import ReservoirOptions, check_stream_name
from headrace.reservoir.recovery import CheckpointLoader
from headrace.reservoir.state import FileRow, State
from headrace.store import ObjectStore


def verify_data_file(buf, key: str, row: FileRow) -> tuple[np.ndarray, np.ndarray]:
    """Check a data file against its checkpoint row: CRC64 first, then its structure.

    Returns (page ids, page offsets) from its index.
    """
    if len(buf) < row.size:
        raise FormatError(key, len(buf), f"data file has {len(buf)} bytes, checkpoint says "
                          f"at least {row.size}")
    actual = crc64(memoryview(buf)[:row.size])
    if actual != row.crc64:
        raise ChecksumMismatch(key, 0, f"crc64 of data file (first {row.size} bytes)",
                               expected=row.crc64, actual=actual)
    h, ids, offsets = datafile.parse_index(buf, key)
    if len(ids) != row.page_count:
        raise FormatError(key, 8, f"data file holds {len(ids)} pages, checkpoint says "
                          f"{row.page_count}")
    return ids, offsets[:-1]


@dataclass
class VerifyReport:
    version: int = 0
    checkpoints: int = 0
    files: int = 0
    pages: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _loader(store: ObjectStore, stream: str, options: ReservoirOptions) -> CheckpointLoader:
    prefix = stream_prefix(check_stream_name(stream), options.stream_version)
    mode = options.registry
    bundled = store.capabilities.listable if mode == "auto" else mode == "bundled"
    return CheckpointLoader(store, prefix, bundled, options.max_checkpoint_bytes)


def verify_stream(store: ObjectStore, stream: str = "default", version: int | None = None,
                  options: ReservoirOptions | None = None, progress=None) -> VerifyReport:
    """Check registry, checkpoint chain, every referenced data file and every page CRC32."""
    opts = options or ReservoirOptions()
    loader = _loader(store, stream, opts)
    rep = VerifyReport()
    try:
        state = loader.load(version).state
    except HeadraceError as e:
        rep.problems.append(str(e))
        return rep
    rep.version = state.version
    rep.checkpoints = len(state.registry)
    order = np.argsort(state.fids, kind="stable")
    fids_sorted = state.fids[order]
    for fid, row in sorted(state.files.items()):
        key = data_key(loader.prefix, fid)
        try:
            buf = store.get(key).data
            rep.bytes_checked += len(buf)
            verify_data_file(buf, key, row)
            f = np.uint64(fid)
            rows = order[np.searchsorted(fids_sorted, f, "left"):
                         np.searchsorted(fids_sorted, f, "right")]
            for off, size, crc in zip(state.offs[rows].tolist(), state.sizes[rows].tolist(),
                                      state.crcs[rows].tolist(), strict=True):
                page = memoryview(buf)[off:off + size]
                if len(page) != size or crc32(page) != crc:
                    raise ChecksumMismatch(key, off, f"crc32 of page at [{off}, {off + size})",
                                           expected=crc, actual=crc32(page))
            rep.pages += len(rows)
        except HeadraceError as e:
            rep.problems.append(str(e))
        rep.files += 1
        if progress is not None:
            progress(1)
    return rep


def inspect_stream(store: ObjectStore, stream: str = "default", version: int | None = None,
                   options: ReservoirOptions | None = None) -> dict:
    """A summary: checkpoints in the registry, files with live ratios, page counts."""
    opts = options or ReservoirOptions()
    loader = _loader(store, stream, opts)
    state: State = loader.load(version).state
    reg = state.registry
    return {
        "prefix": loader.prefix,
        "version": state.version,
        "next_file_id": state.next_file_id,
        "pages": len(state),
        "page_bytes": int(state.sizes.sum()) if len(state) else 0,
        "checkpoints": [{"version": int(v), "snapshot": bool(s), "bundle": bool(b),
                         "crc64": f"{int(c):016x}"}
                        for v, s, b, c in zip(reg.versions, reg.snapshot, reg.bundle,
                                              reg.crc64s, strict=True)],
        "files": [{"file_id": f"{r.file_id:016x}", "pages": r.page_count,
                   "non_active": r.non_active, "size": r.size, "live_bytes": r.live_bytes,
                   "live_ratio": round(r.live_bytes / opts.max_file_size, 4),
                   "added_at": r.added_at} for r in sorted(state.files.values(),
                                                           key=lambda r: r.file_id)],
        "pending_deletes": {f"{f:016x}": at for f, at in sorted(state.deleted_files.items())},
        "recovery_gets": loader.gets,
    }
