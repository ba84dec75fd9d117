"""Recovery: find the latest (or a given) checkpoint and rebuild the state from its chain.

Chain of trust: the registry's footer CRC64 protects the registry; the registry's CRC64 of each
checkpoint protects that checkpoint section; a checkpoint's file rows carry each data file's
CRC64 (a bundle's data part included). Recovery reads the latest snapshot and the incrementals
after it, nothing older.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from headrace.codec import crc64
from headrace.errors import ChecksumMismatch, FormatError, NotFound
from headrace.reservoir.errors import CheckpointNotFound
from headrace.reservoir.formats import checkpoint as ckfmt
from headrace.reservoir.formats import datafile
from headrace.reservoir.formats import registry as regfmt
from headrace.reservoir.formats.registry import Registry
from headrace.reservoir.keys import checkpoint_key, parse_checkpoint_name, registry_key
from headrace.reservoir.state import State
from headrace.retry import DEFAULT_RETRY, RetryPolicy
from headrace.store import ObjectStore

log = logging.getLogger("headrace.reservoir")


@dataclass
class CheckpointObject:
    """A checkpoint object split into its parts (nothing decoded or trusted yet)."""

    key: str
    kind: str  # "bundle", "combined" (HRCB) or "plain" (HRCZ)
    section: memoryview  # the bytes the registry's crc64 covers
    section_offset: int
    registry: Registry | None
    data: bytes  # the whole object


def split_object(data: bytes, key: str) -> CheckpointObject:
    """Recognise a checkpoint object by magic; the embedded registry is verified by its footer."""
    magic = bytes(data[:4])
    mv = memoryview(data)
    if magic == datafile.MAGIC:
        h = datafile.parse_header(data, key)
        if not h.is_bundle:
            raise FormatError(key, 6, "data file without the bundle flag in the checkpoint folder")
        reg = regfmt.decode(mv[h.registry_offset:], key, base=h.registry_offset)
        return CheckpointObject(key, "bundle", mv[h.checkpoint_offset:h.registry_offset],
                                h.checkpoint_offset, reg, data)
    if magic == ckfmt.BMAGIC:
        _snap, section, reg_bytes, c_off, g_off = ckfmt.split_combined(data, key)
        return CheckpointObject(key, "combined", section, c_off,
                                regfmt.decode(reg_bytes, key, base=g_off), data)
    if magic == ckfmt.ZMAGIC:
        return CheckpointObject(key, "plain", mv, 0, None, data)
    raise FormatError(key, 0, f"not a checkpoint object (magic {magic!r})")


def decode_object(obj: CheckpointObject, expected_crc: int, max_raw: int) -> ckfmt.CheckpointData:
    """Verify the section against the registry's CRC64, then decode it."""
    actual = crc64(obj.section)
    if actual != expected_crc:
        raise ChecksumMismatch(obj.key, obj.section_offset, "crc64 of checkpoint section",
                               expected=expected_crc, actual=actual)
    if obj.kind == "bundle":
        return ckfmt.decode(obj.section, obj.key, base=obj.section_offset)
    raw = ckfmt.decompress(obj.section, obj.key, max_raw, base=obj.section_offset)
    return ckfmt.decode(raw, obj.key)


def _extends(reg: Registry, chain: list[int], base: State | None) -> int | None:
    """The position in ``chain`` after base's version when ``reg``'s chain passes through the
    very checkpoints base was built from (the registry base carries is a prefix of ``reg``, no
    snapshot after it, base's version in the chain); None: read the whole chain."""
    if base is None or base.registry is None or not len(base.registry) or not chain:
        return None
    b = base.registry
    n = len(b)
    if n > len(reg) or int(b.versions[-1]) != base.version:
        return None
    for mine, theirs in ((b.versions, reg.versions), (b.snapshot, reg.snapshot),
                         (b.bundle, reg.bundle), (b.crc64s, reg.crc64s)):
        if not np.array_equal(mine, theirs[:n]):
            return None
    if n - 1 not in chain:  # a snapshot came after base: its chain starts there
        return None
    return chain.index(n - 1) + 1


@dataclass
class Loaded:
    state: State
    latest_object: CheckpointObject | None  # the object of the recovered version
    registry_etag: str | None  # registry="file": etag for the next conditional write
    keys: dict[int, str] = field(default_factory=dict)  # version -> object key, chain read


_STALE_LISTING_RETRIES = 5


class CheckpointLoader:
    """Reads checkpoint objects through a store, with retries on transient errors."""

    def __init__(self, store: ObjectStore, prefix: str, bundled_registry: bool, max_raw: int,
                 retry: RetryPolicy = DEFAULT_RETRY):
        self.store = store
        self.prefix = prefix
        self.bundled = bundled_registry
        self.max_raw = max_raw
        self.retry = retry
        self.gets = 0

    def _get(self, key: str):
        self.gets += 1
        return self.retry.call(lambda: self.store.get(key), what=f"get {key}")

    def list_versions(self) -> dict[int, str]:
        """version -> key of every checkpoint object present (listing stores)."""
        out: dict[int, str] = {}
        for m in self.retry.call(lambda: list(self.store.list(f"{self.prefix}/ckpt/")),
                                 what="list checkpoints"):
            parsed = parse_checkpoint_name(m.key)
            if parsed is not None:
                out[parsed[0]] = m.key
        return out

    def get_file_mode_checkpoint(self, version: int, snapshot: bool, bundle: bool,
                                 crc: int) -> tuple[str, bytes]:
        """(key, bytes) of a registry="file" checkpoint: named by its CRC64, or (streams written
        before the CRC naming) by version alone."""
        key = checkpoint_key(self.prefix, version, snapshot=snapshot, bundle=bundle,
                             crc=None if bundle else crc)
        try:
            return key, self._get(key).data
        except NotFound:
            if bundle:
                raise
        legacy = checkpoint_key(self.prefix, version, snapshot=snapshot, bundle=False)
        return legacy, self._get(legacy).data

    def read_registry_file(self) -> tuple[Registry, str | None]:
        key = registry_key(self.prefix)
        try:
            res = self._get(key)
        except NotFound:
            return Registry.empty(), None
        return regfmt.decode(res.data, key), res.etag

    def load(self, version: int | None = None, base: State | None = None) -> Loaded:
        """Recover the state as of ``version`` (None = latest).

        ``base``: a state this process already recovered (an older version of the stream). When
        the chain of ``version`` extends base's chain (the same checkpoints, checked by version,
        kind and CRC64, and no snapshot since), only the checkpoints after base are read and
        applied to it — a reader following a stream one version at a time reads one object per
        version, not the whole chain back to the last snapshot.

        Loading the latest state lists (or reads the registry) and then fetches the chain; a
        second writer's snapshot cleanup may delete a listed object in between. That is a stale
        listing, not damage: the load starts over (bounded) and finds the newer chain."""
        attempts = _STALE_LISTING_RETRIES if version is None else 1
        for attempt in range(1, attempts + 1):
            try:
                return self._load_once(version, base)
            except NotFound as e:
                if attempt == attempts:
                    raise
                log.info("%s: %s vanished while loading (another writer's cleanup); "
                         "loading again", self.prefix, e.key)
        raise AssertionError("unreachable")

    def _load_once(self, version: int | None, base: State | None = None) -> Loaded:
        etag = None
        head: CheckpointObject | None = None
        listed: dict[int, str] = {}
        if self.bundled:
            listed = self.list_versions()
            if not listed:
                if version not in (None, 0):
                    raise CheckpointNotFound(f"{self.prefix}/ckpt/", version)
                return Loaded(State(), None, None)
            target = max(listed) if version is None else version
            if target not in listed:
                raise CheckpointNotFound(f"{self.prefix}/ckpt/{target:020d}", target)
            head = split_object(self._get(listed[target]).data, listed[target])
            if head.registry is None:
                raise FormatError(head.key, 0, "checkpoint object carries no registry")
            reg = head.registry
            if reg.latest() != target:
                raise FormatError(head.key, None,
                                  f"embedded registry ends at {reg.latest()}, not {target}")
        else:
            reg, etag = self.read_registry_file()
            if len(reg) == 0:
                if version not in (None, 0):
                    raise CheckpointNotFound(registry_key(self.prefix), version)
                return Loaded(State(), None, etag)
            target = reg.latest() if version is None else version
        try:
            chain = reg.chain_for(target)
        except KeyError:
            raise CheckpointNotFound(registry_key(self.prefix), target) from None
        state = State()
        keys: dict[int, str] = {}
        start = _extends(reg, chain, base)
        if start is not None:
            state, chain = base, chain[start:]
        for i in chain:
            v = int(reg.versions[i])
            if head is not None and v == target:
                obj = head
            else:
                if self.bundled:
                    if v not in listed:
                        raise CheckpointNotFound(f"{self.prefix}/ckpt/{v:020d}", v)
                    key = listed[v]
                    data = self._get(key).data
                else:
                    key, data = self.get_file_mode_checkpoint(
                        v, bool(reg.snapshot[i]), bool(reg.bundle[i]), int(reg.crc64s[i]))
                obj = split_object(data, key)
                if v == target:
                    head = obj
            keys[v] = obj.key
            cp = decode_object(obj, int(reg.crc64s[i]), self.max_raw)
            if cp.version != v:
                raise FormatError(obj.key, 168, f"checkpoint says version {cp.version}, "
                                  f"registry says {v}")
            sub = Registry(reg.versions[: i + 1], reg.snapshot[: i + 1], reg.bundle[: i + 1],
                           reg.crc64s[: i + 1])
            state = state.applied(cp, sub)
        log.debug("recovered %s at checkpoint %d from %d objects", self.prefix, target, len(chain))
        return Loaded(state, head, etag, keys)
