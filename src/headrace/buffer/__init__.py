"""headrace.buffer: the stateless ingest buffer of RFC 0001 on any object store.

Producers batch entries into ``{ULID}.batch`` files and append their locations to a queue
manifest by compare-and-set; one epoch-fenced consumer reads them in order and acks.
"""

from headrace.buffer.config import ConsumerConfig, ProducerConfig
from headrace.buffer.consumer import Consumer, fetch_batch, list_entries, read_entries
from headrace.buffer.gc import GarbageCollector, GcResult
from headrace.buffer.producer import DurabilityWatcher, Producer, WriteHandle
from headrace.buffer.queue import QueueConsumer, QueueProducer, read_manifest
from headrace.buffer.types import ConsumedBatch, Fenced, ManifestEntry, Metadata, OutOfOrderAck

__all__ = [
    "ConsumedBatch", "Consumer", "ConsumerConfig", "DurabilityWatcher", "Fenced",
    "GarbageCollector", "GcResult", "ManifestEntry", "Metadata", "OutOfOrderAck", "Producer",
    "ProducerConfig", "QueueConsumer", "QueueProducer", "WriteHandle", "fetch_batch",
    "list_entries", "read_entries", "read_manifest",
]
