"""Verify a snapshot on the store: the index decodes, every blob it needs exists and is long
enough, and (deep) every chunk's bytes match their crc32. For `headrace backup verify`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from headrace.backup.blobs import BlobStore
from headrace.backup.index import FileBlob
from headrace.codec import crc32
from headrace.errors import NotFound, StoreError


@dataclass
class VerifyReport:
    index_blob_id: str
    checkpoint_id: str = ""
    files: int = 0
    blobs: int = 0
    bytes: int = 0
    committed: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_snapshot(blobs: BlobStore, index_id: str, *, deep: bool = False,
                    workers: int = 4) -> VerifyReport:
    """Check one snapshot; problems are collected (not raised) so one run reports them all.
    A missing or undecodable index raises (NotFound / FormatError): there is nothing to check."""
    index = blobs.get_index(index_id)
    report = VerifyReport(index_id, index.checkpoint_id, committed=blobs.is_permanent(index_id))
    segments: dict[str, list[tuple[str, FileBlob]]] = {}
    for rel, f in index.dir_index.walk_files():
        report.files += 1
        report.bytes += f.size
        for b in f.blobs:
            segments.setdefault(b.blob_id, []).append((rel, b))
    report.blobs = len(segments)

    def check(blob_id: str) -> list[str]:
        key = blobs.blob_key(blob_id)
        need = max(b.blob_offset + b.size for _, b in segments[blob_id])
        try:
            if not deep:
                size = blobs.retry.call(lambda: blobs.store.head(key).size, what=f"head {key}")
                return [] if size >= need else [f"{key}: {size} bytes, the index needs {need}"]
            data = memoryview(blobs.get_blob(blob_id, need))
        except NotFound:
            files = sorted({rel for rel, _ in segments[blob_id]})
            return [f"{key}: missing (used by {', '.join(files[:3])})"]
        except StoreError as e:
            return [f"{key}: {e}"]
        out = []
        for rel, b in segments[blob_id]:
            part = data[b.blob_offset:b.blob_offset + b.size]
            if len(part) != b.size:
                out.append(f"{key}: too short for chunk at offset {b.offset} of {rel!r}")
            elif crc32(part) != b.crc32:
                out.append(f"{key}: crc32 mismatch for chunk at offset {b.offset} of {rel!r}")
        return out

    with ThreadPoolExecutor(workers, thread_name_prefix="headrace-backup-verify") as pool:
        for problems in pool.map(check, sorted(segments)):
            report.problems.extend(problems)
    return report
