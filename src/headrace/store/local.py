"""LocalStore: a folder as an object store, with atomic Create and IfMatch across processes.

Protocol (why each step exists):

1. Every write goes to a temp file ``.hrtmp-<random>`` in the destination folder, is fsynced,
   then renamed over the key (rename is atomic on POSIX): readers see the old object or the new
   one, never a part. A crash leaves only a temp file, which ``list`` never shows and
   ``sweep_temp_files`` removes.
2. Conditional puts (and deletes, and overwrites, so they serialize with them) hold an exclusive
   ``fcntl.flock`` on one of 1024 striped lock files under ``.hrlocks/``. The precondition is
   checked under the lock, so Create/IfMatch are linearizable across threads *and* processes
   (obstore's LocalStore cannot do conditional update, which is why this store exists).
3. The etag is derived from the file's identity (inode, size, mtime_ns): every put renames a
   fresh inode into place, so any write changes the etag; no hashing of the data is needed.
4. After the rename the directory is fsynced, so an acknowledged put survives a power cut.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from headrace.errors import (
    AlreadyExists,
    InvalidInput,
    InvalidKey,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from headrace.store.base import (
    OVERWRITE,
    Capabilities,
    Create,
    GetResult,
    IfMatch,
    ObjectMeta,
    ObjectStore,
    PutMode,
    StoreNotFound,
    check_range,
    payload_views,
    validate_key,
    validate_prefix,
)

_TMP_PREFIX = ".hrtmp-"
_LOCK_DIR = ".hrlocks"
_LOCK_STRIPES = 1024
_NAME_MAX = 255  # bytes in one path segment on Linux/macOS file systems


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_all(fd: int, size: int) -> bytes:
    """Read ``size`` bytes. os.read allocates the bytes object once and reads straight into it
    (no zero-fill, no second copy); the loop only runs past the kernel's 2 GiB per-read limit.
    An object never changes after its rename, so its stat size is its size."""
    data = os.read(fd, size)
    if len(data) == size:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class LocalStore(ObjectStore):
    capabilities = Capabilities(conditional_put=True, listable=True, local_path=True)

    def __init__(self, root: str | os.PathLike, *, fsync: bool = True, create: bool = True):
        """``root`` is a file-system path (absolute, or relative to the working directory).
        ``create=True``: the folder (and its ``.hrlocks/``) is created if missing.
        ``create=False`` (tools that only read): the folder must exist (else StoreNotFound)
        and nothing is created in it until a conditional put or delete needs the lock folder."""
        if not isinstance(root, str | os.PathLike) or not os.fspath(root):
            raise InvalidInput(f"LocalStore root must be a non-empty path, got {root!r}")
        self.root = Path(root).resolve()
        if not create:
            if not self.root.is_dir():
                detail = "it is not a folder" if self.root.exists() else ""
                raise StoreNotFound("local store folder", str(self.root), detail)
        else:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                (self.root / _LOCK_DIR).mkdir(exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot open a local store at {str(self.root)!r}: "
                                 f"{e.strerror or e}", retryable=False) from e
        self.fsync = fsync
        self.url = self.root.as_uri()
        self._root = str(self.root)  # string paths on the hot path: pathlib costs microseconds

    # -- paths and locks ---------------------------------------------------------------------
    def _path(self, key: str) -> str:
        validate_key(key)
        if len(key) > _NAME_MAX // 4:  # only then can a segment pass the limit (UTF-8: <= 4 B/char)
            _check_segments(key)
        return f"{self._root}/{key}"

    def local_path(self, key: str) -> Path:
        return Path(self._path(key))

    @contextmanager
    def _locked(self, key: str):
        stripe = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")
        lock_path = self.root / _LOCK_DIR / f"{stripe % _LOCK_STRIPES:04d}.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # opened with create=False: the lock folder is made on use
            (self.root / _LOCK_DIR).mkdir(exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    # -- verbs ---------------------------------------------------------------------------------
    def get(self, key: str) -> GetResult:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(key) from None
        except OSError as e:
            raise self._os_error(key, e) from e
        try:
            st = os.fstat(fd)
            data = _read_all(fd, st.st_size) if stat.S_ISREG(st.st_mode) else None
        except OSError as e:
            raise self._os_error(key, e) from e
        finally:
            os.close(fd)
        if data is None:  # a folder is not an object
            raise NotFound(key)
        return GetResult(data, _etag(st))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        check_range(key, start, end)
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(key) from None
        except OSError as e:
            raise self._os_error(key, e) from e
        try:
            return os.pread(fd, end - start, start)
        except IsADirectoryError:
            raise NotFound(key) from None  # a folder is not an object (as in get and head)
        except OSError as e:
            raise self._os_error(key, e) from e
        finally:
            os.close(fd)

    def head(self, key: str) -> ObjectMeta:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(key) from None
        except OSError as e:
            raise self._os_error(key, e) from e
        if not stat.S_ISREG(st.st_mode):
            raise NotFound(key)
        return ObjectMeta(key, st.st_size, _etag(st), st.st_mtime)

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        path = self._path(key)
        parent = os.path.dirname(path)
        # a conditional put that has already lost fails before writing anything: under
        # contention this saves the temp-file write and fsync of every losing attempt. The
        # check that decides is the one under the lock below.
        self._check_precondition(key, path, mode)
        tmp = f"{parent}/{_TMP_PREFIX}{secrets.token_hex(8)}"
        renamed = False
        try:
            # write and fsync outside the lock: the lock only covers check + rename
            fd = self._create_temp(key, parent, tmp)
            try:
                for view in payload_views(data):  # a gather write: parts are not joined
                    written = 0
                    while written < len(view):
                        written += os.write(fd, view[written : written + (1 << 30)])
                # stamp the file with a fine-grained mtime: with the inode number it makes the
                # etag unique per write even where the kernel keeps coarse (jiffy) timestamps
                # and reuses a freed inode at once (an ABA that would let a stale IfMatch win)
                now = time.time_ns()
                os.utime(fd, ns=(now, now))
                if self.fsync:
                    os.fsync(fd)
                etag = _etag(os.fstat(fd))  # rename keeps inode, size and mtime
            finally:
                os.close(fd)
            with self._locked(key):
                self._check_precondition(key, path, mode)
                os.rename(tmp, path)
                renamed = True
            if self.fsync:
                _fsync_dir(parent)
            return etag
        except (StoreError, InvalidKey):
            raise
        except OSError as e:
            raise self._os_error(key, e) from e
        finally:
            if not renamed:
                _remove_quietly(tmp)  # never hides the error that got us here

    @staticmethod
    def _check_precondition(key: str, path: str, mode: PutMode) -> None:
        if isinstance(mode, Create):
            if os.path.exists(path):
                raise AlreadyExists(key)
        elif isinstance(mode, IfMatch):
            try:
                current = _etag(os.stat(path))
            except (FileNotFoundError, NotADirectoryError):
                raise PreconditionFailed(key, mode.etag) from None
            if current != mode.etag:
                raise PreconditionFailed(key, mode.etag)

    @staticmethod
    def _create_temp(key: str, parent: str, tmp: str) -> int:
        """Open a fresh temp file in the key's folder, creating the folder on first use."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return os.open(tmp, flags, 0o644)
        except (FileNotFoundError, NotADirectoryError):
            pass
        try:
            os.makedirs(parent, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise StoreError(f"cannot create folder for {key!r}: a path segment is an object",
                             key=key) from e
        return os.open(tmp, flags, 0o644)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        validate_prefix(prefix)
        if len(prefix) > _NAME_MAX // 4:
            _check_segments(prefix.rstrip("/"))
        # start the walk at the deepest folder the prefix names completely
        head, _, _ = prefix.rpartition("/")
        start = self.root / head if head else self.root
        try:
            if not start.is_dir():
                return iter(())
        except OSError as e:
            raise self._os_error(prefix, e) from e
        return iter(sorted(self._walk(start, prefix), key=lambda m: m.key))

    def _walk(self, folder: Path, prefix: str) -> Iterator[ObjectMeta]:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.startswith(".hr"):
                continue
            rel = os.path.relpath(entry.path, self.root).replace(os.sep, "/")
            if entry.is_dir(follow_symlinks=False):
                if rel.startswith(prefix) or prefix.startswith(rel + "/"):
                    yield from self._walk(Path(entry.path), prefix)
            elif entry.is_file(follow_symlinks=False) and rel.startswith(prefix):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # deleted while listing
                yield ObjectMeta(rel, st.st_size, _etag(st), st.st_mtime)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._locked(key):
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                return
            except IsADirectoryError:
                return
            except OSError as e:
                raise self._os_error(key, e) from e

    def sweep_temp_files(self) -> int:
        """Remove temp files left by crashed writers; returns how many were removed."""
        n = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(_TMP_PREFIX):
                    try:
                        os.unlink(os.path.join(dirpath, name))
                        n += 1
                    except FileNotFoundError:
                        pass
        return n

    @staticmethod
    def _os_error(key: str, e: OSError) -> StoreError | InvalidKey:
        if e.errno == errno.ENAMETOOLONG:
            return InvalidKey(key, "too long for the local file system (a path segment over "
                              f"{_NAME_MAX} bytes, or the whole path over its limit)")
        transient = e.errno in (errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT)
        return StoreError(f"local store I/O error on {key!r}: {e.strerror or e}", key=key,
                          retryable=transient)


def _check_segments(key: str) -> None:
    for seg in key.split("/"):
        if len(seg.encode()) > _NAME_MAX:
            raise InvalidKey(key, f"path segment of {len(seg.encode())} bytes; the local file "
                             f"system allows {_NAME_MAX}")


def _remove_quietly(path: str) -> None:
    """Best-effort cleanup in a ``finally``: an error here must not replace the one in flight."""
    try:
        os.unlink(path)
    except OSError:
        pass
