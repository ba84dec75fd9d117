"""BlobStore: Samza's BlobStoreManager (put / get / delete / remove_ttl) over an ObjectStore.

Key layout under ``prefix``::

    {prefix}/blobs/{blob_id}        file chunks (immutable, written once)
    {prefix}/index/{blob_id}        snapshot index blobs (immutable, written once)
    {prefix}/permanent/{blob_id}    empty marker: this index is committed, its TTL is removed

Object stores have no per-object TTL that a client can later remove, so headrace emulates it. A
blob id is ``{ULID}-{expiry_ms}``: every blob is born with its TTL deadline in its name.
``remove_ttl(index_id)`` writes the index's permanent marker (one PUT per commit, idempotent);
a blob is permanent exactly when a permanent index references it. The sweep deletes blobs past
their deadline that no permanent (or still-young) index references.
"""

from __future__ import annotations

import logging

from headrace.backup.errors import BackupNotFound
from headrace.backup.index import SnapshotIndex, decode_index, encode_index, validate_blob_id
from headrace.codec import Clock, new_ulid
from headrace.errors import NotFound
from headrace.retry import RetryPolicy
from headrace.store import OVERWRITE, ObjectStore, validate_key
from headrace.store.url import redact_url

log = logging.getLogger("headrace.backup")


class BlobStore:
    """Blob-level verbs with the shared retry policy; thread-safe (the store is)."""

    def __init__(self, store: ObjectStore, prefix: str, *, retry: RetryPolicy, clock: Clock,
                 ttl_ms: int):
        self.store = store
        self.prefix = validate_key(prefix.strip("/")) if prefix.strip("/") else ""
        self.retry = retry
        self.clock = clock
        self.ttl_ms = ttl_ms

    # -- keys -----------------------------------------------------------------------------------
    def _key(self, folder: str, blob_id: str) -> str:
        return f"{self.prefix}/{folder}/{blob_id}" if self.prefix else f"{folder}/{blob_id}"

    def folder(self, folder: str) -> str:
        return f"{self.prefix}/{folder}/" if self.prefix else f"{folder}/"

    def blob_key(self, blob_id: str) -> str:
        return self._key("blobs", blob_id)

    def index_key(self, index_id: str) -> str:
        return self._key("index", index_id)

    def marker_key(self, index_id: str) -> str:
        return self._key("permanent", index_id)

    def new_blob_id(self) -> str:
        return f"{new_ulid(self.clock)}-{self.clock.now_ms() + self.ttl_ms}"

    # -- verbs -----------------------------------------------------------------------------------
    def put_blob(self, data) -> str:
        """Upload one chunk (bytes-like, or a list of parts written as their concatenation) under
        a fresh id (overwrite is safe: the key is new, retries reuse it)."""
        blob_id = self.new_blob_id()
        key = self.blob_key(blob_id)
        self.retry.call(lambda: self.store.put(key, data, OVERWRITE), what=f"put {key}")
        return blob_id

    def get_blob(self, blob_id: str, end: int) -> bytes:
        """Bytes [0, end) of a blob: ``end`` comes from the (validated) index, so a blob longer
        than the index says is never read into memory; a shorter one comes back short."""
        key = self.blob_key(blob_id)
        return self.retry.call(lambda: self.store.get_range(key, 0, end), what=f"get {key}")

    def put_index(self, index: SnapshotIndex) -> tuple[str, int]:
        """Write an index blob; returns its id and size in bytes."""
        index_id = self.new_blob_id()
        key = self.index_key(index_id)
        data = encode_index(index)
        self.retry.call(lambda: self.store.put(key, data, OVERWRITE), what=f"put {key}")
        return index_id, len(data)

    def get_index(self, index_id: str) -> SnapshotIndex:
        validate_blob_id(index_id, key=None, what="index blob id")
        key = self.index_key(index_id)
        try:
            data = self.retry.call(lambda: self.store.get(key).data, what=f"get {key}")
        except NotFound:
            raise BackupNotFound(key, f"snapshot {index_id!r} not found: no object {key!r} "
                                      f"in {self.store_name()}") from None
        return decode_index(data, key=key)

    def store_name(self) -> str:
        """The store as messages may name it (no credentials)."""
        return redact_url(self.store.url) if self.store.url else type(self.store).__name__

    def remove_ttl(self, index_id: str) -> None:
        """Make an index and every blob it references permanent. Idempotent."""
        key = self.marker_key(index_id)
        self.retry.call(lambda: self.store.put(key, b"", OVERWRITE), what=f"put {key}")

    def is_permanent(self, index_id: str) -> bool:
        key = self.marker_key(index_id)
        return self.retry.call(lambda: self.store.exists(key), what=f"head {key}")

    def delete_blobs(self, blob_ids: list[str]) -> None:
        keys = [self.blob_key(b) for b in blob_ids]
        if keys:
            self.retry.call(lambda: self.store.delete_many(keys), what=f"delete {len(keys)} blobs")

    def delete_index(self, index_id: str) -> None:
        """Delete an index blob and then its marker (a marker never outlives its index long)."""
        for key in (self.index_key(index_id), self.marker_key(index_id)):
            try:
                self.retry.call(lambda k=key: self.store.delete(k), what=f"delete {key}")
            except NotFound:
                pass

    def list_ids(self, folder: str) -> list[str]:
        """Ids in ``folder`` ('blobs', 'index', 'permanent'); keys that are not ids are skipped."""
        prefix = self.folder(folder)
        metas = self.retry.call(lambda: list(self.store.list(prefix)), what=f"list {prefix}")
        out = []
        for m in metas:
            name = m.key[len(prefix):]
            try:
                out.append(validate_blob_id(name, key=m.key, what="listed key"))
            except ValueError:
                log.warning("ignoring foreign object %r under %r", m.key, prefix)
        return out
