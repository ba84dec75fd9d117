"""ReservoirBatchStore: spine batches as runs of reservoir pages; a spine checkpoint is a
reservoir checkpoint.

Page ids (i64) are split into namespaces by their top byte:

    0                                   the spine catalog (HRCK bytes, as checkpoints.headrace)
    1 << 56 | seq << 16 | 0             batch ``seq``: header page "HRRB" u32 pages u64 length
    1 << 56 | seq << 16 | i  (i >= 1)   batch ``seq``: the HRSB file bytes, page_bytes per page
    2 << 56 | low 48 bits of the uuid   one checkpoint's manifests (u32 count, u32 len + HRSM)*

A batch's name is its sequence number written as 26 decimal digits + ``.batch`` (so manifests
are the same as in a directory). ``commit_checkpoint`` writes the manifests page and the catalog
page in one session, then calls ``ReservoirStorage.checkpoint()``: that conditional PUT is the
commit point, so all spines or none. Pages of batches no checkpoint references (merge outputs
that were never committed before a crash) are deleted on open, and the deletion becomes durable
with the next checkpoint.

One circuit per stream: on a store with local paths the stream is locked like a LocalBatchStore
directory (an flock on ``{prefix}/writer.lock``; a second store is refused with StorageLocked);
on any store the reservoir fences a second writer at its commit (ConcurrentWriter), so the
checkpoint another circuit committed is never changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
import uuid

import pyarrow as pa

from headrace.codec import ByteReader, check_bound
from headrace.errors import FormatError, InvalidInput, NotFound
from headrace.spine.batch import Batch
from headrace.spine.batchstore import BatchStore
from headrace.spine.catalog import (
    CheckpointInfo,
    SpineManifest,
    check_spine_name,
    decode_catalog,
    decode_manifest,
    encode_catalog,
    encode_manifest,
)
from headrace.spine.errors import CheckpointNotFound, StorageLocked

log = logging.getLogger("headrace.spine.reservoir")
CATALOG_PAGE = 0
BATCH_NS = 1 << 56
MANIFEST_NS = 2 << 56
MAX_PAGES_PER_BATCH = (1 << 16) - 1
_HEADER = struct.Struct("<4sIQ")
_HEADER_MAGIC = b"HRRB"


def batch_name(seq: int) -> str:
    return f"{seq:026d}.batch"


def batch_seq(name: str) -> int:
    if not isinstance(name, str) or len(name) != 32 or not name[:26].isdigit() \
            or not name.endswith(".batch"):
        raise NotFound(name)
    return int(name[:26])


def _page(seq: int, i: int) -> int:
    return BATCH_NS | (seq << 16) | i


class ReservoirBatchStore(BatchStore):
    """A BatchStore over ``headrace.reservoir`` (any object store: local folder, S3, ...)."""

    def __init__(self, reservoir_or_url, *, stream: str = "spine",
                 page_bytes: int = 4 << 20, **open_kwargs):
        from headrace.reservoir import ReservoirStorage

        if type(page_bytes) is not int or page_bytes < 4096:
            raise InvalidInput(f"ReservoirBatchStore.page_bytes must be an int >= 4096, got "
                               f"{page_bytes!r:.40}")
        self._owned = not isinstance(reservoir_or_url, ReservoirStorage)
        self._lock_fd: int | None = None
        if self._owned:
            from headrace.reservoir.keys import stream_prefix
            from headrace.reservoir.options import check_stream_name
            from headrace.store import open_store

            store = open_store(reservoir_or_url)
            opts = open_kwargs.get("options")
            prefix = stream_prefix(check_stream_name(stream), open_kwargs.get("version")
                                   or (opts.stream_version if opts is not None else None))
            self._lock_fd = _lock_stream(store, prefix)
            try:
                self.reservoir = ReservoirStorage.open(store, stream=stream, **open_kwargs)
            except BaseException:
                self._unlock()
                raise
        else:
            self.reservoir = reservoir_or_url
            self._lock_fd = _lock_stream(self.reservoir.store, self.reservoir.prefix)
        self.page_bytes = page_bytes
        self._mu = threading.RLock()
        self._live: dict[int, int] = {}  # seq -> data pages, for batches in use
        self._pinned: set[str] = set()
        self._counters = {"batches_written": 0, "bytes_written": 0, "batches_deleted": 0,
                          "checkpoints": 0, "startup_gc_removed": 0}
        self._entries = self._read_catalog()
        self._refs_of = self._referenced(self._entries)
        self._refs = set().union(*self._refs_of.values())
        self._known: set[int] = set(self._stored_seqs())  # batches whose pages exist
        self._next_seq = 1 + max([batch_seq(n) for n in self._refs] + list(self._known) + [0])
        self._counters["startup_gc_removed"] = len(self._startup_gc())

    # ---- pages --------------------------------------------------------------------------
    def _read_page(self, pid: int) -> bytes | None:
        from headrace.reservoir import PageNotFound

        try:
            return self.reservoir.read(pid)
        except PageNotFound:
            return None

    def _read_catalog(self) -> list[CheckpointInfo]:
        data = self._read_page(CATALOG_PAGE)
        return [] if data is None else decode_catalog(data, "reservoir page 0 (spine catalog)")

    def _manifest_page(self, checkpoint_id: str) -> int:
        return MANIFEST_NS | (uuid.UUID(hex=checkpoint_id).int & ((1 << 48) - 1))

    def _referenced(self, entries: list[CheckpointInfo]) -> dict[str, set[str]]:
        """Per checkpoint id, the batches its manifests name (read once, on open)."""
        return {e.id: {b for m in self.read_manifests(e.id).values() for b in m.batches}
                for e in entries}

    def _stored_seqs(self) -> list[int]:
        """Batches in the durable reservoir state (read once, on open)."""
        ids = self.reservoir.state().ids
        heads = ids[((ids >> 56) == 1) & ((ids & 0xFFFF) == 0)]
        return [int((x >> 16) & ((1 << 40) - 1)) for x in heads.tolist()]

    def _startup_gc(self) -> list[str]:
        doomed = [batch_name(s) for s in self._known if batch_name(s) not in self._refs]
        self._delete_batches(doomed)
        return doomed

    def _header(self, seq: int) -> tuple[int, int]:
        key = f"reservoir batch {batch_name(seq)}"
        raw = self._read_page(_page(seq, 0))
        if raw is None:
            raise NotFound(batch_name(seq))
        r = ByteReader(raw, key)
        if bytes(r.take(4, "magic")) != _HEADER_MAGIC:
            raise FormatError(key, 0, "bad batch header magic")
        pages = check_bound(r.u32("page count"), MAX_PAGES_PER_BATCH, key=key, offset=4,
                            what="page count")
        length = check_bound(r.u64("length"), pages * (64 << 20), key=key, offset=8,
                             what="batch length")
        return pages, length

    def _delete_batches(self, names: list[str]) -> None:
        if not names:
            return
        session = self.reservoir.session()
        for name in names:
            seq = batch_seq(name)
            pages = self._live.pop(seq, None)
            if pages is None:
                try:
                    pages, _ = self._header(seq)
                except NotFound:
                    self._known.discard(seq)
                    continue
            for i in range(pages + 1):
                session.delete(_page(seq, i))
            self._known.discard(seq)
            self._counters["batches_deleted"] += 1
        session.commit()

    # ---- batches ------------------------------------------------------------------------
    def write_batch(self, batch: Batch, block_bytes: int = 64 * 1024) -> Batch:
        data = batch.to_bytes(block_bytes)
        step = self.page_bytes
        pages = -(-len(data) // step)
        if pages > MAX_PAGES_PER_BATCH:
            raise InvalidInput(f"batch of {len(data)} bytes needs more than "
                               f"{MAX_PAGES_PER_BATCH} pages of {step} bytes; raise page_bytes")
        with self._mu:
            seq = self._next_seq
            self._next_seq += 1
            session = self.reservoir.session()
            mv = memoryview(data)
            for i in range(pages):
                session.write(_page(seq, i + 1), mv[i * step:(i + 1) * step])
            session.write(_page(seq, 0), _HEADER.pack(_HEADER_MAGIC, pages, len(data)))
            session.commit()
            self._live[seq] = pages
            self._known.add(seq)
            self._counters["batches_written"] += 1
            self._counters["bytes_written"] += len(data)
        return Batch._from_buffer(pa.py_buffer(data), batch_name(seq))

    def open_batch(self, name: str) -> Batch:
        seq = batch_seq(name)
        with self._mu:
            pages, length = self._header(seq)
            parts = []
            for i in range(pages):
                part = self._read_page(_page(seq, i + 1))
                if part is None:
                    raise FormatError(name, None, f"page {i + 1} of {pages} is missing")
                parts.append(part)
            self._live[seq] = pages
        data = b"".join(parts)
        if len(data) != length:
            raise FormatError(name, None, f"{len(data)} bytes in pages, header says {length}")
        return Batch._from_buffer(pa.py_buffer(data), name)

    def discard(self, names: list[str]) -> None:
        with self._mu:
            doomed = []
            for name in names:
                if name is None:
                    continue
                if name in self._refs or name in self._pinned:
                    self._live.pop(batch_seq(name), None)
                else:
                    doomed.append(name)
            self._delete_batches(doomed)

    def pin(self, names: list[str]) -> None:
        with self._mu:
            self._pinned.update(n for n in names if n)

    def batch_names(self) -> list[str]:
        with self._mu:
            return sorted(batch_name(s) for s in self._known)

    # ---- checkpoints --------------------------------------------------------------------
    def commit_checkpoint(self, step: int, fingerprint: str,
                          manifests: dict[str, SpineManifest],
                          identifier: str = "") -> CheckpointInfo:
        body = bytearray(struct.pack("<I", len(manifests)))
        for name, m in manifests.items():
            check_spine_name(name)
            raw = encode_manifest(m)
            body += struct.pack("<I", len(raw)) + raw
        info = CheckpointInfo(uuid.uuid4().hex, step, fingerprint, int(time.time() * 1000),
                              identifier)
        with self._mu:
            entries = self._entries + [info]
            session = self.reservoir.session()
            session.write(self._manifest_page(info.id), bytes(body))
            session.write(CATALOG_PAGE, encode_catalog(entries))
            session.commit()
            self.reservoir.checkpoint()  # the commit point
            self._entries = entries
            self._refs_of[info.id] = {b for m in manifests.values() for b in m.batches}
            self._refs.update(self._refs_of[info.id])
            self._pinned.clear()
            self._counters["checkpoints"] += 1
        return info

    def checkpoints(self) -> list[CheckpointInfo]:
        with self._mu:
            return list(self._entries)

    def read_manifests(self, checkpoint_id: str) -> dict[str, SpineManifest]:
        try:
            pid = self._manifest_page(checkpoint_id)
        except (ValueError, TypeError, AttributeError) as e:  # not a uuid hex str
            raise CheckpointNotFound(f"checkpoint {checkpoint_id!r} not found") from e
        if checkpoint_id not in {e.id for e in self._entries}:
            raise CheckpointNotFound(f"checkpoint {checkpoint_id!r} not found")
        raw = self._read_page(pid)
        if raw is None:
            raise CheckpointNotFound(f"checkpoint {checkpoint_id!r} has no manifests page")
        key = f"reservoir manifests of {checkpoint_id}"
        r = ByteReader(raw, key)
        count = check_bound(r.u32("count"), r.remaining() // 4, key=key, offset=0,
                            what="manifest count")
        out = {}
        for _ in range(count):
            n = check_bound(r.u32("length"), r.remaining(), key=key, offset=r.pos,
                            what="manifest length")
            m = decode_manifest(bytes(r.take(n, "manifest")), key)
            out[m.name] = m
        return out

    def remove_checkpoint(self, checkpoint_id: str) -> None:
        self.remove_checkpoints([checkpoint_id])

    def remove_checkpoints(self, checkpoint_ids: list[str]) -> None:
        """Drop checkpoints and the batches only they referenced, made durable by one reservoir
        checkpoint (one conditional PUT for all of them); before it, a reopen sees them all."""
        with self._mu:
            gone = set(checkpoint_ids)
            missing = gone - {e.id for e in self._entries}
            if missing:
                raise CheckpointNotFound(f"checkpoint {sorted(missing)[0]!r} not found")
            if not gone:
                return
            entries = [e for e in self._entries if e.id not in gone]
            session = self.reservoir.session()
            session.write(CATALOG_PAGE, encode_catalog(entries))
            for cid in gone:
                session.delete(self._manifest_page(cid))
            session.commit()
            self._entries = entries
            for cid in gone:
                self._refs_of.pop(cid, None)
            self._refs = set().union(*self._refs_of.values())
            self.gc()
            self.reservoir.checkpoint()  # the commit point of the removal

    def gc(self) -> list[str]:
        with self._mu:
            keep = self._refs | self._pinned | {batch_name(s) for s in self._live}
            doomed = [n for n in self.batch_names() if n not in keep]
            self._delete_batches(doomed)
        return doomed

    def metrics(self) -> dict:
        with self._mu:
            out = dict(self._counters, live_batches=len(self._live),
                       checkpoints_kept=len(self._entries))
        out.update({f"reservoir_{k}": v for k, v in self.reservoir.metrics().items()
                    if isinstance(v, int | float)})
        return out

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing releases the flock

    def close(self) -> None:
        try:
            if self._owned:
                self.reservoir.close()
        finally:
            self._unlock()


def _lock_stream(store, prefix: str) -> int | None:
    """flock ``{prefix}/writer.lock`` when the store has local paths (None otherwise)."""
    if not store.capabilities.local_path:
        return None
    path = store.local_path(f"{prefix}/writer.lock")
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StorageLocked(f"reservoir stream {prefix!r} is locked by another circuit "
                            f"(pid {holder}); two circuits cannot share it") from None
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
