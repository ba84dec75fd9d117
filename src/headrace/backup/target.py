"""The restore target on local disk, handled without ever following a symlink.

- ``scan_target`` lists what a target holds with ``lstat`` semantics: a symlink (to a file or a
  directory, inside or outside the target) is a *foreign* entry, never entered or read, and a
  restore replaces it (the link, not what it points to).
- The *restore marker* ``.{name}.hr-backup`` next to a directory records which backup (store +
  prefix) the directory was restored from or backed up to, and the directory's identity
  (device, inode, inode generation). Restore replaces a non-empty target only when the marker
  recognises it (or it already equals the snapshot, or the caller forces it): an unrelated
  folder is never wiped. The marker lives beside the directory, not in it, so the restored tree
  is exactly the snapshot and a backed-up tree is unchanged.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from headrace.backup.index import SnapshotIndex
from headrace.codec import new_ulid
from headrace.errors import InvalidInput
from headrace.store.url import redact_url

MARKER_FORMAT = "headrace-restore-marker"
_MAX_MARKER_BYTES = 64 << 10
_FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode generation (ext4, xfs, btrfs)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@dataclass
class TargetScan:
    """What a target directory holds, found without following symlinks."""

    files: dict[str, os.stat_result] = field(default_factory=dict)  # regular files, by rel path
    dirs: set[str] = field(default_factory=set)
    foreign: list[str] = field(default_factory=list)  # symlinks, fifos, sockets, devices

    @property
    def empty(self) -> bool:
        return not (self.files or self.dirs or self.foreign)

    def same_shape(self, index: SnapshotIndex) -> bool:
        """Exactly the snapshot's files and directories, and nothing else (contents aside)."""
        return (not self.foreign and self.dirs == set(index.dir_index.walk_dirs())
                and self.files.keys() == {rel for rel, _ in index.dir_index.walk_files()})


def scan_target(target: Path) -> TargetScan:
    out = TargetScan()
    todo = [(str(target), "")]
    while todo:
        path, base = todo.pop()
        try:
            with os.scandir(path) as it:
                entries = [(e, e.stat(follow_symlinks=False)) for e in it]
        except OSError as e:
            raise InvalidInput(f"cannot scan restore target folder {path!r}: "
                               f"{e.strerror or e}") from e
        for e, st in entries:
            rel = base + e.name
            if stat.S_ISDIR(st.st_mode):
                out.dirs.add(rel)
                todo.append((e.path, rel + "/"))
            elif stat.S_ISREG(st.st_mode):
                out.files[rel] = st
            else:
                out.foreign.append(rel)
    return out


def same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def dir_identity(path: Path) -> list[int] | None:
    """[device, inode, generation] of a real directory (None if ``path`` is not one). The
    generation (-1 where the file system has none) tells a reused inode number apart."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        try:
            gen = struct.unpack("l", fcntl.ioctl(fd, _FS_IOC_GETVERSION, b"\0" * 8))[0]
        except OSError:
            gen = -1
        return [st.st_dev, st.st_ino, gen]
    finally:
        os.close(fd)


def lineage_of(blobs) -> dict[str, str]:
    """Which backup a BlobStore is, as markers record it (no credentials: no user-info, no
    query)."""
    url = redact_url(blobs.store.url).split("?", 1)[0] if blobs.store.url else ""
    return {"store": url, "prefix": blobs.prefix}


def mark_directory(directory: Path, lineage: dict[str, str], index_id: str, clock, *,
                   fsync: bool) -> None:
    """Record ``directory`` (as it is now) as belonging to backup ``lineage``; keeps what the
    marker already vouches for in this lineage. The parent is fsynced with ``fsync``."""
    ident = dir_identity(directory)
    if ident is None:
        return
    known = marked_identities(directory, lineage)
    if ident in known:
        return
    write_marker(directory, lineage, [ident, *known[-3:]], index_id, clock, fsync=fsync)
    if fsync:
        fd = os.open(directory.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def marker_path(target: Path) -> Path:
    return target.parent / f".{target.name}.hr-backup"


def marked_identities(target: Path, lineage: dict[str, str]) -> list[list[int]]:
    """Directory identities the marker vouches for as restores of backup ``lineage``; [] when
    there is no marker, it is unreadable, a symlink, or names another backup."""
    try:
        fd = os.open(marker_path(target), os.O_RDONLY | NOFOLLOW)
    except OSError:
        return []
    try:
        raw = os.read(fd, _MAX_MARKER_BYTES + 1)
    except OSError:
        return []
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw) if len(raw) <= _MAX_MARKER_BYTES else None
    except (ValueError, RecursionError):
        return []
    if not isinstance(doc, dict) or doc.get("format") != MARKER_FORMAT:
        return []
    if doc.get("store") != lineage["store"] or doc.get("prefix") != lineage["prefix"]:
        return []
    dirs = doc.get("dirs")
    if not isinstance(dirs, list):
        return []
    return [d for d in dirs if isinstance(d, list) and len(d) == 3
            and all(type(x) is int for x in d)]


def is_marked(target: Path, lineage: dict[str, str]) -> bool:
    ident = dir_identity(target)
    return ident is not None and ident in marked_identities(target, lineage)


def write_marker(target: Path, lineage: dict[str, str], dirs: list[list[int]], index_id: str,
                 clock, *, fsync: bool) -> None:
    """Atomically (temp file + rename next to the target; the caller fsyncs the parent)."""
    doc = {"format": MARKER_FORMAT, **lineage, "index": index_id, "dirs": dirs}
    tmp = target.parent / f".{target.name}.hr-restore-marker-{new_ulid(clock)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
    try:
        os.write(fd, json.dumps(doc, separators=(",", ":")).encode())
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, marker_path(target))


def remove_path(path: Path) -> None:
    """Remove a file, a symlink (the link only) or a directory tree (links inside it are
    removed, never followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
