"""DirDiff: what changed in a local directory since the previous snapshot (Samza's DirDiff).

Immutable files (SST / batch files, by glob pattern) are the same file when name and size match
(and content hash, for small files or when asked): they are retained, their blobs reused. Any
other file is retained when its size and mtime are unchanged and its content hash matches;
otherwise it is uploaded. Files and subdirectories that disappeared
are listed as removed, so that cleanup can delete their blobs once the new snapshot is committed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from headrace.backup.config import BackupConfig
from headrace.backup.digest import local_file_digests
from headrace.backup.index import DirIndex, FileIndex, validate_name
from headrace.errors import FormatError, InvalidInput


@dataclass(frozen=True)
class LocalFile:
    name: str
    path: str  # absolute path on this host
    rel: str  # path relative to the backed-up root, '/'-separated
    size: int
    mtime_ms: int
    ctime_ms: int
    mode: int


@dataclass
class DirDiff:
    dir_name: str
    files_added: list[LocalFile] = field(default_factory=list)
    files_retained: list[FileIndex] = field(default_factory=list)
    files_removed: list[FileIndex] = field(default_factory=list)
    sub_dirs_added: list[DirDiff] = field(default_factory=list)
    sub_dirs_retained: list[DirDiff] = field(default_factory=list)
    sub_dirs_removed: list[DirIndex] = field(default_factory=list)

    def added_files(self) -> Iterator[LocalFile]:
        yield from self.files_added
        for d in self.sub_dirs_added + self.sub_dirs_retained:
            yield from d.added_files()

    def retained_files(self) -> Iterator[FileIndex]:
        yield from self.files_retained
        for d in self.sub_dirs_added + self.sub_dirs_retained:
            yield from d.retained_files()


def _scan(path: str, rel: str) -> tuple[dict[str, LocalFile], dict[str, str]]:
    files: dict[str, LocalFile] = {}
    dirs: dict[str, str] = {}
    try:
        with os.scandir(path) as it:
            entries = [(e, e.stat(follow_symlinks=False)) for e in it]
    except OSError as e:
        raise InvalidInput(f"cannot scan {path!r} for backup: {e.strerror or e}") from e
    for e, st in entries:
        erel = rel + e.name
        try:
            validate_name(e.name, key=None, what="file name")
        except FormatError:
            raise InvalidInput(f"{erel!r} in {path!r}: names with control characters or "
                               f"backslashes cannot be backed up") from None
        if stat.S_ISLNK(st.st_mode):
            raise InvalidInput(f"{erel!r} in {path!r} is a symlink: backups copy files only")
        if stat.S_ISDIR(st.st_mode):
            dirs[e.name] = e.path
        elif stat.S_ISREG(st.st_mode):
            files[e.name] = LocalFile(e.name, e.path, erel, st.st_size, st.st_mtime_ns // 1_000_000,
                                      st.st_ctime_ns // 1_000_000, stat.S_IMODE(st.st_mode))
        else:
            raise InvalidInput(f"{erel!r} in {path!r} is not a regular file or directory")
    return files, dirs


def _with_local_attribs(prev: FileIndex, local: LocalFile) -> FileIndex:
    """A retained file's entry: its bytes are the previous snapshot's, its mode and times are
    what the file has now (a chmod alone must reach the next restore)."""
    if (prev.mode, prev.mtime_ms, prev.ctime_ms) == (local.mode, local.mtime_ms, local.ctime_ms):
        return prev
    return dataclasses.replace(prev, mode=local.mode, mtime_ms=local.mtime_ms,
                               ctime_ms=local.ctime_ms)


def _strip_removed(d: DirIndex) -> DirIndex:
    """A directory as it was present (older removal lists do not travel into a new index)."""
    return DirIndex(d.dir_name, d.files_present, (), tuple(_strip_removed(s)
                                                           for s in d.sub_dirs_present), ())


class DirDiffer:
    def __init__(self, config: BackupConfig):
        self.config = config

    def is_immutable(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.config.immutable_patterns)

    def _retain(self, local: LocalFile, prev: FileIndex) -> FileIndex | None:
        """The previous snapshot's entry, with ``local``'s mode and times, if ``local`` is still
        that file (its blobs are reused, nothing is sent), else None.

        Immutable files (by glob) match by name + size; small ones (and all with
        verify_immutable_crc) are also read and must have the same content hash and crc32
        (crc32 alone cannot tell apart files that end with their own crc32). Any other file
        matches when size and mtime are unchanged and it is read and has the same content hash
        and crc32 (a rewrite within the mtime's millisecond is caught by the hash). An entry of
        a schemaVersion 1 index has no content hash: an immutable file is read once to fill it
        in (after the same checks); another file is uploaded again."""
        if local.size != prev.size:
            return None
        if self.is_immutable(local.name):
            check = self.config.verify_immutable_crc or local.size <= self.config.crc_compare_below
        elif local.mtime_ms == prev.mtime_ms and prev.content_hash is not None:
            check = True
        else:
            return None
        if not check and prev.content_hash is not None:
            return _with_local_attribs(prev, local)
        try:
            value, digest = local_file_digests(local.path,
                                               ((b.offset, b.size) for b in prev.blobs))
        except OSError as e:
            raise InvalidInput(f"cannot read {local.rel!r} for backup: "
                               f"{e.strerror or e}") from e
        if check and (value != prev.crc32 or prev.content_hash not in (None, digest)):
            return None
        return _with_local_attribs(dataclasses.replace(prev, content_hash=digest), local)

    def diff(self, path: str, prev: DirIndex | None, name: str = "", rel: str = "") -> DirDiff:
        """Diff the local directory ``path`` against ``prev`` (None: everything is new)."""
        files, dirs = _scan(path, rel)
        out = DirDiff(name)
        prev_files = {f.file_name: f for f in prev.files_present} if prev else {}
        prev_dirs = {d.dir_name: d for d in prev.sub_dirs_present} if prev else {}
        for fname in sorted(files):
            local = files[fname]
            old = prev_files.pop(fname, None)
            kept = self._retain(local, old) if old is not None else None
            if kept is not None:
                out.files_retained.append(kept)
            else:
                out.files_added.append(local)
                if old is not None:
                    out.files_removed.append(old)
        out.files_removed.extend(prev_files[n] for n in sorted(prev_files))
        for dname in sorted(dirs):
            old_dir = prev_dirs.pop(dname, None)
            sub = self.diff(dirs[dname], old_dir, dname, rel + dname + "/")
            (out.sub_dirs_retained if old_dir is not None else out.sub_dirs_added).append(sub)
        out.sub_dirs_removed.extend(_strip_removed(prev_dirs[n]) for n in sorted(prev_dirs))
        return out


def build_dir_index(diff: DirDiff, uploaded: dict[str, FileIndex]) -> DirIndex:
    """The new snapshot's DirIndex: retained + uploaded files, and what the diff removed."""
    present = sorted([*diff.files_retained, *(uploaded[f.rel] for f in diff.files_added)],
                     key=lambda f: f.file_name)
    subs = sorted((build_dir_index(d, uploaded) for d in diff.sub_dirs_added +
                   diff.sub_dirs_retained), key=lambda d: d.dir_name)
    return DirIndex(diff.dir_name, tuple(present), tuple(diff.files_removed), tuple(subs),
                    tuple(diff.sub_dirs_removed))
