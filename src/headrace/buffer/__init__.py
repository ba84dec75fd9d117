"""headrace.buffer: the stateless ingest buffer of RFC 0001 on any object store.

Producers batch entries into ``{ULID}.batch`` files and append their locations to a queue
manifest by compare-and-set; one epoch-fenced consumer reads them in order and acks.
"""

from headrace.buffer.batches import fetch_batch, fetch_block, load_block, skip_batch
from headrace.buffer.config import ConsumerConfig, ProducerConfig
from headrace.buffer.consumer import Consumer, list_entries, read_entries
from headrace.buffer.gc import GarbageCollector, GcResult
from headrace.buffer.producer import DurabilityWatcher, Producer, WriteHandle
from headrace.buffer.queue import QueueConsumer, QueueProducer, read_manifest
from headrace.buffer.skips import read_skips
from headrace.buffer.types import (
    ConsumedBatch,
    Fenced,
    InvalidLocation,
    ManifestEntry,
    Metadata,
    MissingBatch,
    OutOfOrderAck,
    SkipRecord,
    StaleBatch,
)

__all__ = [
    "ConsumedBatch", "Consumer", "ConsumerConfig", "DurabilityWatcher", "Fenced",
    "GarbageCollector", "GcResult", "InvalidLocation", "ManifestEntry", "Metadata",
    "MissingBatch", "OutOfOrderAck", "Producer", "ProducerConfig", "QueueConsumer",
    "QueueProducer", "SkipRecord", "StaleBatch", "WriteHandle", "fetch_batch", "fetch_block",
    "list_entries", "load_block", "read_entries", "read_manifest", "read_skips", "skip_batch",
]
