"""headrace.persist (after Materialize's persist): definite time-varying collections on the
object store.

See docs/persist.md. Entry point: :class:`PersistClient`.
"""

from headrace.persist.client import PersistClient, make_updates
from headrace.persist.compaction import CompactionResult, SweepResult
from headrace.persist.consensus import Consensus, ObjectStoreConsensus, VersionedData
from headrace.persist.errors import (
    ConsensusContended,
    DefinitenessViolation,
    InvalidBounds,
    LeaseExpired,
    SinceViolation,
    SnapshotTimeout,
    TokenMismatch,
    UpperMismatch,
)
from headrace.persist.handles import ListenEvent, ReadHandle
from headrace.persist.state import PartMeta, ShardState, WriterLease
from headrace.persist.uploads import upload_part
from headrace.persist.writer import WriteHandle

__all__ = [
    "CompactionResult", "Consensus", "ConsensusContended", "DefinitenessViolation",
    "InvalidBounds", "LeaseExpired", "ListenEvent", "ObjectStoreConsensus", "PartMeta",
    "PersistClient", "ReadHandle", "ShardState", "SinceViolation", "SnapshotTimeout",
    "SweepResult", "TokenMismatch", "UpperMismatch", "VersionedData", "WriteHandle",
    "WriterLease", "make_updates", "upload_part",
]
