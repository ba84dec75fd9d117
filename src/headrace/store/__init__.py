"""headrace.store: the one door to bytes. See base.py for the contract."""

from headrace.errors import AlreadyExists, InvalidKey, NotFound, PreconditionFailed, StoreError
from headrace.store.base import (
    CREATE,
    OVERWRITE,
    Capabilities,
    Create,
    GetResult,
    IfMatch,
    ObjectMeta,
    ObjectStore,
    Overwrite,
    Payload,
    PutMode,
    StoreNotFound,
    payload_bytes,
    payload_size,
    payload_views,
    validate_key,
)
from headrace.store.counting import S3_STANDARD, CountingStore, PriceTable
from headrace.store.faulty import FaultyStore, InjectedFault
from headrace.store.local import LocalStore
from headrace.store.memory import MemoryStore
from headrace.store.prefixed import PrefixedStore
from headrace.store.url import open_store

__all__ = [
    "CREATE", "OVERWRITE", "AlreadyExists", "Capabilities", "CountingStore", "Create",
    "FaultyStore", "GetResult", "IfMatch", "InjectedFault", "InvalidKey", "LocalStore",
    "MemoryStore", "NotFound", "ObjectMeta", "ObjectStore", "Overwrite", "PrefixedStore",
    "Payload", "PreconditionFailed", "PriceTable", "PutMode", "payload_bytes", "payload_size",
    "payload_views", "S3_STANDARD", "StoreError", "StoreNotFound", "open_store",
    "validate_key",
]
