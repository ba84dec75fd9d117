"""The ObjectStore contract: few verbs, explicit put modes, etags.

Every byte headrace persists goes through an ObjectStore. Implementations: LocalStore (a
folder, the default), MemoryStore, ObstoreStore (S3/GCS/Azure via obstore), and the wrappers
CountingStore and FaultyStore. ``headrace.testing.store_conformance.StoreTests`` is the contract
as tests; every implementation's test module subclasses it.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from headrace.errors import InvalidInput, InvalidKey, StoreError


class StoreNotFound(StoreError, FileNotFoundError):
    """The store itself does not exist: an S3/GCS bucket or Azure container, or the folder of a
    local store opened with ``create=False``. Never retryable.

    Deliberately not a :class:`~headrace.errors.NotFound`: code that reads a missing *object*
    as "nothing yet" (an empty queue, no checkpoint) must not read a missing bucket that way."""

    def __init__(self, what: str, name: str, detail: str = ""):
        msg = f"{what} {name!r} does not exist" + (f" ({detail})" if detail else "")
        super().__init__(msg, retryable=False)
        self.what = what
        self.name = name

    def __str__(self) -> str:  # FileNotFoundError would otherwise format errno/filename
        return self.args[0]


@dataclass(frozen=True)
class Overwrite:
    """Write unconditionally."""


@dataclass(frozen=True)
class Create:
    """Write only if no object exists at the key; otherwise raise AlreadyExists."""


@dataclass(frozen=True)
class IfMatch:
    """Write only if the object's current etag equals ``etag``; otherwise PreconditionFailed."""

    etag: str


PutMode = Overwrite | Create | IfMatch
OVERWRITE = Overwrite()
CREATE = Create()


@dataclass(frozen=True)
class ObjectMeta:
    key: str
    size: int
    etag: str
    last_modified: float  # seconds since the epoch


@dataclass(frozen=True)
class GetResult:
    data: bytes
    etag: str


@dataclass(frozen=True)
class Capabilities:
    """What a store can do; callers choose strategies (e.g. bundling the registry) from these."""

    conditional_put: bool = True
    listable: bool = True
    local_path: bool = False  # keys map to files a process can mmap


#: What ``put`` writes: one bytes-like object, or a list/tuple of them written as their
#: concatenation. The sequence form is a gather write: a data file's small header and its large
#: page area go out without first being joined into one buffer (a 64 MiB copy per file).
Payload = bytes | bytearray | memoryview | list | tuple


def payload_views(data: Payload) -> list[memoryview]:
    """The parts of a payload as flat byte views (no copy)."""
    if isinstance(data, list | tuple):
        return [memoryview(p).cast("B") for p in data]
    return [memoryview(data).cast("B")]


def payload_size(data: Payload) -> int:
    if isinstance(data, list | tuple):
        return sum(memoryview(p).nbytes for p in data)
    return memoryview(data).nbytes


def payload_bytes(data: Payload):
    """One contiguous bytes-like object (joins, i.e. copies, only a multi-part payload)."""
    if isinstance(data, list | tuple):
        return data[0] if len(data) == 1 else b"".join(data)
    return data


_BAD_CHARS = re.compile(r"[\x00-\x1f\\]")
_RESERVED_PREFIX = ".hr"  # temp files and lock files of the local store live under these names


def validate_key(key: object) -> str:
    """Return ``key`` if it is a safe relative object key, else raise InvalidKey."""
    if not isinstance(key, str):
        raise InvalidKey(key, "keys are str")
    if not key:
        raise InvalidKey(key, "empty key")
    if key.startswith("/"):
        raise InvalidKey(key, "absolute keys are refused")
    if _BAD_CHARS.search(key):
        raise InvalidKey(key, "control characters, NUL or backslash")
    for seg in key.split("/"):
        if seg == "":
            raise InvalidKey(key, "empty path segment")
        if seg in (".", ".."):
            raise InvalidKey(key, f"path segment {seg!r} is refused")
        if seg.startswith(_RESERVED_PREFIX):
            raise InvalidKey(key, f"segments starting with {_RESERVED_PREFIX!r} are reserved")
    if len(key.encode()) > 1024:
        raise InvalidKey(key, "longer than 1024 bytes")
    return key


def validate_prefix(prefix: str) -> str:
    """A list prefix: empty, or a key (optionally ending in '/')."""
    if prefix == "":
        return prefix
    validate_key(prefix.rstrip("/") if prefix.endswith("/") else prefix)
    return prefix


class ObjectStore(abc.ABC):
    """The contract every store implements. Keys are validated by every implementation."""

    capabilities: Capabilities = Capabilities()
    url: str = ""

    @abc.abstractmethod
    def get(self, key: str) -> GetResult: ...

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object; a range past the end is clipped to the object."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectMeta: ...

    @abc.abstractmethod
    def put(self, key: str, data: Payload, mode: PutMode = OVERWRITE) -> str:
        """Write the whole object (``data``, or the concatenation of a list/tuple of parts);
        returns its new etag."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix``, in lexicographic key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error."""

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.delete(key)

    def exists(self, key: str) -> bool:
        from headrace.errors import NotFound

        try:
            self.head(key)
            return True
        except NotFound:
            return False

    def local_path(self, key: str):  # pragma: no cover - only LocalStore overrides
        """A filesystem path for ``key`` when ``capabilities.local_path``; else None."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release resources; the default holds none."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_range(key: str, start: int, end: int) -> None:
    if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int) \
            or not isinstance(end, int) or start < 0 or end < start:
        raise InvalidInput(f"bad range [{start!r}, {end!r}) for {key!r}: need 0 <= start <= end")
