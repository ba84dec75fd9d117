"""headrace.reservoir: stream state as pages packed into immutable files on an object store.

After Flowtide's "Reservoir" design: data files, incremental and snapshot checkpoints, a registry,
data+checkpoint bundles, CRC32 per page / CRC64 per file, an in-flight buffer, a local disk cache,
compaction and stream versions. See docs/reservoir.md.
"""

from headrace.reservoir.errors import (
    CacheFull,
    CacheTooSmall,
    CheckpointNotFound,
    CommitUnknown,
    ConcurrentWriter,
    PageNotFound,
    ReservoirFailed,
)
from headrace.reservoir.options import ReservoirOptions
from headrace.reservoir.reader import ReservoirReader
from headrace.reservoir.runs import PageRun, PageRunWriter
from headrace.reservoir.storage import ReservoirStorage, Session

__all__ = [
    "CacheFull", "CacheTooSmall", "CheckpointNotFound", "CommitUnknown", "ConcurrentWriter", "PageNotFound", "PageRun",
    "PageRunWriter", "ReservoirFailed", "ReservoirOptions", "ReservoirReader", "ReservoirStorage",
    "Session",
]
