"""headrace.spine: persistent Z-set state (after DBSP's storage design).

Batch (immutable sorted consolidated Z-set, Arrow in memory, mmap'd HRSB file on disk), Spine
(LSM of batches with background merges and a consolidated view), Cursor, BatchStore
(LocalBatchStore: a locked storage directory; ReservoirBatchStore: reservoir pages) and Circuit
(checkpoint / resume a group of spines). See docs/spine.md.
"""

from headrace.spine.batch import Batch, zset_schema
from headrace.spine.batchstore import BatchStore, LocalBatchStore
from headrace.spine.catalog import CheckpointInfo, SpineManifest
from headrace.spine.circuit import Circuit
from headrace.spine.cursor import Cursor
from headrace.spine.errors import (
    CheckpointNotFound,
    FingerprintMismatch,
    SpineError,
    SpineWriteError,
    StorageLocked,
)
from headrace.spine.reservoir_store import ReservoirBatchStore
from headrace.spine.spine import Spine, SpineConfig

__all__ = [
    "Batch", "BatchStore", "CheckpointInfo", "CheckpointNotFound", "Circuit", "Cursor",
    "FingerprintMismatch", "LocalBatchStore", "ReservoirBatchStore", "Spine", "SpineConfig", "SpineError",
    "SpineManifest", "SpineWriteError", "StorageLocked", "zset_schema",
]
