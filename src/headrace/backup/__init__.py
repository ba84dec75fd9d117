"""headrace.backup (after Samza's blob-store backup): incremental snapshots of a local state
directory to the object store, and restore on any host. See docs/backup.md and
docs/formats/backup-index.md."""

from headrace.backup.backup import BackupManager
from headrace.backup.blobs import BlobStore
from headrace.backup.config import DEFAULT_IMMUTABLE_PATTERNS, BackupConfig
from headrace.backup.diff import DirDiff, DirDiffer
from headrace.backup.index import (
    SCHEMA_VERSION,
    DirIndex,
    FileBlob,
    FileIndex,
    SnapshotIndex,
    decode_index,
    encode_index,
)
from headrace.backup.lifecycle import SweepReport, cleanup_snapshot, sweep
from headrace.backup.progress import Progress, ProgressCallback
from headrace.backup.restore import RestoreManager, RestoreResult
from headrace.backup.verify import VerifyReport, verify_snapshot

__all__ = [
    "DEFAULT_IMMUTABLE_PATTERNS", "SCHEMA_VERSION", "BackupConfig", "BackupManager", "BlobStore",
    "DirDiff", "DirDiffer", "DirIndex", "FileBlob", "FileIndex", "Progress", "ProgressCallback",
    "RestoreManager", "RestoreResult", "SnapshotIndex", "SweepReport", "cleanup_snapshot",
    "VerifyReport", "decode_index", "encode_index", "sweep", "verify_snapshot",
]
