"""Object keys of a reservoir and the three file-id spaces.

    {stream}/v/{version}/data/{file_id:016x}.dat                 data files (driver and task files)
    {stream}/v/{version}/ckpt/{n:020d}.bundle                    registry="bundled": checkpoint n,
                                                                 with its data or without (HRCB)
    {stream}/v/{version}/ckpt/{n:020d}-{crc:016x}.checkpoint     registry="file": checkpoint n
    {stream}/v/{version}/ckpt/{n:020d}-{crc:016x}.snapshot.checkpoint     (named by its CRC64)
    {stream}/v/{version}/registry                                registry (registry="file" only)
    {stream}/versions/{version}                                  stream-version marker

Nothing a committed checkpoint references can be overwritten by another writer (docs/reservoir.md,
"Two writers"): with registry="bundled" a version has exactly one key, created with Create (the
commit point); with registry="file" a checkpoint object is named by its CRC64, so a second
writer's object for the same version lands beside it, never on it. Legacy names without the CRC
(``{n:020d}.checkpoint`` / ``.snapshot.checkpoint``) are still read.

File ids: driver files have 62 random bits (bit 62 clear), task files (PageRunWriter) bit 62 set
and 62 random bits; both are uploaded with Create, so two writers never share a data file. A
bundle's id is ``1 << 63 | checkpoint_version`` as in Flowtide's Reservoir.
"""

from __future__ import annotations

import re

BUNDLE_BIT = 1 << 63
RUN_BIT = 1 << 62
_CKPT_NAME = re.compile(r"^(\d{20})(?:-([0-9a-f]{16}))?\.(checkpoint|snapshot\.checkpoint|bundle)$")
_DATA_NAME = re.compile(r"^([0-9a-f]{16})\.dat$")


def stream_prefix(stream: str, version: str | None) -> str:
    return f"{stream}/v/{version or 'default'}"


def version_marker_prefix(stream: str) -> str:
    return f"{stream}/versions/"


def bundle_id(checkpoint_version: int) -> int:
    return BUNDLE_BIT | checkpoint_version


def data_key(prefix: str, file_id: int) -> str:
    if file_id & BUNDLE_BIT:
        return checkpoint_key(prefix, file_id & ~BUNDLE_BIT, snapshot=False, bundle=True)
    return f"{prefix}/data/{file_id:016x}.dat"


def checkpoint_key(prefix: str, version: int, *, snapshot: bool, bundle: bool,
                   crc: int | None = None) -> str:
    """The key of checkpoint ``version``: a bundle (or, registry="bundled", any checkpoint:
    ``bundle=True``), or a registry="file" checkpoint named by its CRC64 (``crc``; None gives
    the legacy name)."""
    if bundle:
        return f"{prefix}/ckpt/{version:020d}.bundle"
    kind = "snapshot.checkpoint" if snapshot else "checkpoint"
    tag = "" if crc is None else f"-{crc:016x}"
    return f"{prefix}/ckpt/{version:020d}{tag}.{kind}"


def registry_key(prefix: str) -> str:
    return f"{prefix}/registry"


def parse_checkpoint_name(key: str) -> tuple[int, bool, bool] | None:
    """(version, snapshot, bundle) of a checkpoint object key, or None for other keys."""
    m = _CKPT_NAME.match(key.rsplit("/", 1)[-1])
    if not m:
        return None
    kind = m.group(3)
    return int(m.group(1)), kind == "snapshot.checkpoint", kind == "bundle"


def parse_data_name(key: str) -> int | None:
    m = _DATA_NAME.match(key.rsplit("/", 1)[-1])
    return int(m.group(1), 16) if m else None
