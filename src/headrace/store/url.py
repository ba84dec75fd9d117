"""open_store(url): the backend is chosen by URL scheme.

    /some/path, file:///some/path     LocalStore (the default)
    memory://name                     MemoryStore (process-local; same name → same store)
    s3://bucket/prefix?endpoint=http://127.0.0.1:5000&region=us-east-1
    gs://bucket/prefix, az://container/prefix   (obstore; credentials from the environment)

Query parameters are passed to obstore as config (``endpoint``, ``region``, ``allow_http``,
``access_key_id`` ...). ``allow_http`` is turned on automatically for loopback endpoints.
"""

from __future__ import annotations

import threading
from urllib.parse import parse_qsl, unquote, urlsplit

from headrace.errors import MissingDependency
from headrace.store.base import ObjectStore
from headrace.store.local import LocalStore
from headrace.store.memory import MemoryStore
from headrace.store.prefixed import PrefixedStore

_memory_stores: dict[str, MemoryStore] = {}
_memory_lock = threading.Lock()

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def open_store(url: str | ObjectStore) -> ObjectStore:
    """Open the store a URL names (or return an ObjectStore passed in as is)."""
    if isinstance(url, ObjectStore):
        return url
    if not isinstance(url, str) or not url:
        raise ValueError(f"store url must be a non-empty string, got {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parts.path) if scheme == "file" else url
        return LocalStore(path)
    if scheme == "memory":
        name = (parts.netloc + parts.path).strip("/")
        with _memory_lock:
            return _memory_stores.setdefault(name, MemoryStore(name))
    if scheme in ("s3", "gs", "az", "abfs"):
        return _open_obstore(scheme, parts, url)
    raise ValueError(f"unsupported store url scheme {scheme!r} in {url!r} "
                     "(use a path, file://, memory://, s3://, gs:// or az://)")


def _open_obstore(scheme: str, parts, url: str) -> ObjectStore:
    try:
        from obstore.store import AzureStore, GCSStore, S3Store
    except ImportError as e:  # pragma: no cover
        raise MissingDependency(f"{scheme}:// needs obstore (pip install obstore)") from e
    from headrace.store.remote import ObstoreStore

    bucket = parts.netloc
    if not bucket:
        raise ValueError(f"{url!r} names no bucket")
    config = {k: v for k, v in parse_qsl(parts.query)}
    prefix = parts.path.strip("/")
    client_options = {}
    endpoint = config.get("endpoint", "")
    if endpoint.startswith("http://"):
        host = urlsplit(endpoint).hostname or ""
        if host in _LOOPBACK or config.pop("allow_http", "").lower() == "true":
            client_options["allow_http"] = True
    config.pop("allow_http", None)
    if scheme == "s3":
        config.setdefault("region", "us-east-1")
        inner = S3Store(bucket, config=config, client_options=client_options or None)
    elif scheme == "gs":
        inner = GCSStore(bucket, config=config or None, client_options=client_options or None)
    else:
        inner = AzureStore(bucket, config=config or None, client_options=client_options or None)
    safe_url = f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}"
    store: ObjectStore = ObstoreStore(inner, safe_url)
    return PrefixedStore(store, prefix) if prefix else store
