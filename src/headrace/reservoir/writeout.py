"""Writing one checkpoint: bundle or separate files, the CRC chain, the commit PUT, cleanup.

CRC chain (as in Flowtide's Reservoir): the data part's CRC64 goes into the checkpoint's file
row for the file; the checkpoint section's CRC64 goes into the registry entry; the registry's
CRC64 into its footer.

Two writers (docs/reservoir.md): every object a checkpoint writes has a key no other writer can
write (random data file ids, one Create-only key per version, CRC-named checkpoint objects), so a
fenced writer's objects are orphans beside the winner's, never on them; the commit point decides
who wins and the loser gets ConcurrentWriter. A commit whose reply and read-back are both lost is
reported as CommitUnknown; ``reset()`` then reloads whatever is committed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from headrace.codec import crc64
from headrace.errors import AlreadyExists, HeadraceError, PreconditionFailed
from headrace.reservoir.batch import new_writer
from headrace.reservoir.errors import CommitUnknown, ConcurrentWriter
from headrace.reservoir.formats import checkpoint as ckfmt
from headrace.reservoir.formats import registry as regfmt
from headrace.reservoir.formats.datafile import encode_bundle
from headrace.reservoir.inflight import FileRef
from headrace.reservoir.keys import bundle_id, checkpoint_key, parse_checkpoint_name, registry_key
from headrace.reservoir.state import NewFile, PageChanges
from headrace.store import CREATE, IfMatch, payload_size, payload_views

if TYPE_CHECKING:
    from headrace.reservoir.storage import ReservoirStorage

log = logging.getLogger("headrace.reservoir")


def _changes(committed: dict) -> PageChanges:
    up_ids, fids, offs, sizes, crcs, dels = [], [], [], [], [], []
    for pid, loc in committed.items():
        if loc is None:
            dels.append(pid)
            continue
        ref, off, size, crc = loc
        up_ids.append(pid)
        fids.append(ref.file_id)
        offs.append(ref.data_offset + off)
        sizes.append(size)
        crcs.append(crc)
    ids = np.array(up_ids, np.int64)
    order = np.argsort(ids, kind="stable")
    return PageChanges(ids[order], np.array(fids, np.uint64)[order],
                       np.array(offs, np.uint32)[order], np.array(sizes, np.uint32)[order],
                       np.array(crcs, np.uint32)[order], np.sort(np.array(dels, np.int64)))


def _estimate(s: ReservoirStorage, snapshot: bool) -> int:
    st = s._state
    n = len(s._committed)
    files = len(s._new_files) + 1 + (len(st.files) if snapshot else min(len(st.files), n))
    pages = len(st) + n if snapshot else n
    reg = len(st.registry) + 1
    return (ckfmt.estimate_size(pages, n, files, files + len(st.deleted_files))
            + regfmt.HEADER_SIZE + 16 * reg + 8 * (-(-reg // 32)) + 8)


def _dead_weigh_more(s: ReservoirStorage) -> bool:
    """snapshot_dead_ratio: the files dead since the last snapshot, kept only for the
    checkpoints back to it, reach that fraction of the live bytes and the snapshot's own size.
    Never right after a snapshot: what it kept (for ``keep_from``) goes at the next checkpoint
    anyway, so a second snapshot would free nothing more."""
    ratio, st = s.opts.snapshot_dead_ratio, s._state
    if ratio <= 0 or len(st.registry) == 0 or bool(st.registry.snapshot[-1]):
        return False
    dead = sum(s._dead_bytes.values())
    return dead >= ratio * int(st.sizes.sum()) and dead >= _estimate(s, True) - _estimate(s, False)


def write_checkpoint(s: ReservoirStorage, keep_from: int | None = None) -> int:
    s._uploader.raise_if_failed()
    state = s._state
    v = state.version + 1
    snapshot = v % s.opts.snapshot_interval == 0 or _dead_weigh_more(s)
    mw = s._merged.writer
    # a bundle's key is its version's, so only registry="bundled" (where that key is the commit
    # point) may write one; registry="file" names checkpoint objects by CRC (see keys.py)
    bundle = (s.opts.bundle and s.bundled_registry and len(mw) > 0
              and mw.projected_size() + _estimate(s, snapshot) <= s.opts.max_file_size)
    if not bundle:
        s._ship_merged()
    s._uploader.flush()  # every data file this checkpoint references is in the store
    merged: FileRef = s._merged
    if bundle:
        merged.file_id = bundle_id(v)
        merged.data_offset = mw.data_offset()
    changes = _changes(s._committed)
    base_files = [ref.info for ref in s._new_files.values()]
    built: dict = {}

    def build(bundle_crc: int, data_end: int) -> tuple[bytes, bytes]:
        files = list(base_files)
        if bundle:
            files.append(NewFile(merged.file_id, len(mw), int(np.frombuffer(
                mw.sizes, np.uint32).sum()), data_end, bundle_crc))
        new_state, cp = state.next_checkpoint(v, snapshot, changes, files, s._next_file_id,
                                              state.registry)
        raw = ckfmt.encode(cp)
        section = raw if bundle else ckfmt.compress(raw)
        reg = state.registry.appended(v, snapshot, bundle, crc64(section), keep_from)
        new_state.registry = reg
        built.update(state=new_state, section=section, reg=reg, files=files)
        return section, regfmt.encode(reg)

    if bundle:
        enc = encode_bundle(mw, lambda crc, end, _offs: build(crc, end))
        obj = enc.parts  # written with a gather put: the page area is not copied
        key = checkpoint_key(s.prefix, v, snapshot=snapshot, bundle=True)
    elif s.bundled_registry:  # one key per version, whatever the object holds
        section, reg_bytes = build(0, 0)
        obj = ckfmt.encode_combined(snapshot, section, reg_bytes)
        key = checkpoint_key(s.prefix, v, snapshot=snapshot, bundle=True)
    else:
        section, _reg_bytes = build(0, 0)
        obj = section
        key = checkpoint_key(s.prefix, v, snapshot=snapshot, bundle=False, crc=crc64(section))
    new_state, new_reg = built["state"], built["reg"]
    puts = _commit(s, key, obj, new_reg)
    # committed: from here on, the new state is the truth
    old_reg = state.registry
    sizes = {f.file_id: f.size for f in built["files"]}
    for f in new_state.deleted_files.keys() - state.deleted_files.keys():
        s._dead_bytes[f] = state.files[f].size if f in state.files else sizes.get(f, 0)
    s._state = new_state
    s._ckpt_keys[v] = key
    if bundle:
        merged.info = built["files"][-1]
        s.source.register(merged.file_id, merged.info.crc64, obj)
        merged.writer = None
    s._committed = {}
    s._new_files = {}
    s._merged = FileRef(_new_writer(s))
    s._stats["checkpoints"] += 1
    s._stats["bundles"] += int(bundle)
    s.last_checkpoint_puts = puts
    try:
        s._collect_garbage(old_reg, new_reg)
        if not s._versions_cleaned:
            s._versions_cleaned = True
            s.versions.cleanup()
    except Exception as e:  # noqa: BLE001 - cleanup is retried by the next checkpoint/open
        log.warning("cleanup after checkpoint %d failed (will be retried): %s", v, e)
    log.debug("checkpoint %d: %d pages changed, bundle=%s, %d bytes", v, len(changes.ids),
              bundle, payload_size(obj))
    return v


def _payload_crc(obj) -> int:
    crc = 0
    for part in payload_views(obj):
        crc = crc64(part, crc)
    return crc


def _read_back(s: ReservoirStorage, key: str, what: str):
    """GET ``key`` to settle a commit whose reply was lost; CommitUnknown if it cannot be read."""
    try:
        return s.retry.call(lambda: s.store.get(key), what=f"read back {key}")
    except HeadraceError as e:
        raise CommitUnknown(f"{what}: the reply was lost and reading {key!r} back failed "
                            f"({e}); call reset() to reload what is committed") from e


def _commit(s: ReservoirStorage, key: str, obj, reg: regfmt.Registry) -> int:
    """The commit PUT(s). Returns how many PUTs it took."""
    store, retry = s.store, s.retry
    v = reg.latest()
    if s.bundled_registry:
        try:
            retry.call(lambda: store.put(key, obj, CREATE), what=f"put {key}")
        except AlreadyExists:
            got = _read_back(s, key, f"checkpoint {v}")
            if crc64(got.data) != _payload_crc(obj):  # not our own put whose reply was lost
                raise ConcurrentWriter(f"checkpoint {key!r} was written by another writer") \
                    from None
        _check_still_latest(s, key, v)
        return 1
    try:  # named by its CRC: an existing object under this key holds these very bytes
        retry.call(lambda: store.put(key, obj, CREATE), what=f"put {key}")
    except AlreadyExists:
        pass
    rkey = registry_key(s.prefix)
    reg_bytes = regfmt.encode(reg)
    mode = IfMatch(s._registry_etag) if s._registry_etag else CREATE
    try:
        s._registry_etag = retry.call(lambda: store.put(rkey, reg_bytes, mode),
                                      what=f"put {rkey}")
    except (AlreadyExists, PreconditionFailed):
        got = _read_back(s, rkey, f"registry for checkpoint {v}")
        if got.data != reg_bytes:
            raise ConcurrentWriter(f"registry {rkey!r} was changed by another writer") from None
        s._registry_etag = got.etag
    return 2


def _check_still_latest(s: ReservoirStorage, key: str, v: int) -> None:
    """registry="bundled": the Create of version ``v`` only proves nobody wrote ``v``; a writer
    fenced long ago can find ``v`` free again because the winner deleted it after a later
    snapshot. One LIST settles it: any later version means another writer is ahead, and our
    object (never the newest, so never recovered) is removed again."""
    try:
        listed = s.retry.call(lambda: list(s.store.list(f"{s.prefix}/ckpt/")),
                              what="list checkpoints")
    except HeadraceError as e:
        raise CommitUnknown(f"checkpoint {v} was written but listing to confirm it failed ({e}); "
                            "call reset() to reload what is committed") from e
    ahead = [m.key for m in listed
             if (p := parse_checkpoint_name(m.key)) is not None and p[0] > v]
    if ahead:
        try:
            s.retry.call(lambda: s.store.delete(key), what=f"delete {key}")
        except HeadraceError as e:  # an orphan: the sweep removes it later
            log.warning("could not delete fenced checkpoint %s: %s", key, e)
        raise ConcurrentWriter(f"checkpoint {v} lost to another writer already at "
                               f"{sorted(ahead)[-1]!r}")


def _new_writer(s: ReservoirStorage):
    return new_writer(s.opts)
