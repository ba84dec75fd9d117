"""Object keys of a reservoir and the three file-id spaces.

    {stream}/v/{version}/data/{file_id:016x}.dat                 data files (driver and task files)
    {stream}/v/{version}/ckpt/{n:020d}.checkpoint                incremental checkpoint n
    {stream}/v/{version}/ckpt/{n:020d}.snapshot.checkpoint       snapshot checkpoint n
    {stream}/v/{version}/ckpt/{n:020d}.bundle                    data + checkpoint n (+ registry)
    {stream}/v/{version}/registry                                registry (registry="file" only)
    {stream}/versions/{version}                                  stream-version marker

File ids: the driver counts up from 1 (below 2**62); files uploaded by PageRunWriter tasks have
bit 62 set and 62 random bits (uploaded with Create, so a collision is detected, not overwritten);
a bundle's id is ``1 << 63 | checkpoint_version`` as in the seed.
"""

from __future__ import annotations

import re

from headrace.errors import FormatError

BUNDLE_BIT = 1 << 63
RUN_BIT = 1 << 62
COUNTER_LIMIT = RUN_BIT
_CKPT_NAME = re.compile(r"^(\d{20})\.(checkpoint|snapshot\.checkpoint|bundle)$")
_DATA_NAME = re.compile(r"^([0-9a-f]{16})\.dat$")


def stream_prefix(stream: str, version: str | None) -> str:
    return f"{stream}/v/{version or 'default'}"


def version_marker_prefix(stream: str) -> str:
    return f"{stream}/versions/"


def is_bundle_id(file_id: int) -> bool:
    return bool(file_id & BUNDLE_BIT)


def bundle_id(checkpoint_version: int) -> int:
    return BUNDLE_BIT | checkpoint_version


def data_key(prefix: str, file_id: int) -> str:
    if file_id & BUNDLE_BIT:
        return checkpoint_key(prefix, file_id & ~BUNDLE_BIT, snapshot=False, bundle=True)
    return f"{prefix}/data/{file_id:016x}.dat"


def checkpoint_key(prefix: str, version: int, *, snapshot: bool, bundle: bool) -> str:
    if bundle:
        return f"{prefix}/ckpt/{version:020d}.bundle"
    kind = "snapshot.checkpoint" if snapshot else "checkpoint"
    return f"{prefix}/ckpt/{version:020d}.{kind}"


def registry_key(prefix: str) -> str:
    return f"{prefix}/registry"


def parse_checkpoint_name(key: str) -> tuple[int, bool, bool] | None:
    """(version, snapshot, bundle) of a checkpoint object key, or None for other keys."""
    m = _CKPT_NAME.match(key.rsplit("/", 1)[-1])
    if not m:
        return None
    kind = m.group(2)
    return int(m.group(1)), kind == "snapshot.checkpoint", kind == "bundle"


def parse_data_name(key: str) -> int | None:
    m = _DATA_NAME.match(key.rsplit("/", 1)[-1])
    return int(m.group(1), 16) if m else None


def check_file_id(file_id: int, *, key: str | None, offset: int | None) -> int:
    if file_id == 0:
        raise FormatError(key, offset, "file id 0 is not a valid file id")
    return file_id
