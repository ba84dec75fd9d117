"""headrace: object-storage-native ingestion, state and exactly-once output for PySpark streams."""

from headrace.errors import (
    AlreadyExists,
    ChecksumMismatch,
    FormatError,
    HeadraceError,
    InvalidInput,
    InvalidKey,
    NotFound,
    PreconditionFailed,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "ChecksumMismatch",
    "FormatError",
    "HeadraceError",
    "InvalidInput",
    "InvalidKey",
    "NotFound",
    "PreconditionFailed",
    "StoreError",
    "__version__",
]
