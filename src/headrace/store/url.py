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
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from headrace.errors import InvalidInput, MissingDependency
from headrace.store.base import ObjectStore
from headrace.store.local import LocalStore
from headrace.store.memory import MemoryStore
from headrace.store.prefixed import PrefixedStore

_memory_stores: dict[str, MemoryStore] = {}
_memory_lock = threading.Lock()

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
# query parameters that are safe to show; every other value may be a credential
_PUBLIC_PARAMS = frozenset({"endpoint", "region", "allow_http"})


def redact_url(url: str) -> str:
    """``url`` as it may appear in a message or log: no user-info, secret parameters masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    query = [(k, v if k.lower() in _PUBLIC_PARAMS else "***") for k, v in
             parse_qsl(parts.query, keep_blank_values=True)]
    out = f"{parts.scheme}://{host}{parts.path}" if parts.scheme else parts.path
    return f"{out}?{urlencode(query, safe='/:')}" if query else out


def open_store(url: str | ObjectStore) -> ObjectStore:
    """Open the store a URL names (or return an ObjectStore passed in as is)."""
    if isinstance(url, ObjectStore):
        return url
    if not isinstance(url, str) or not url:
        raise InvalidInput("store url must be a non-empty string, got "
                           f"{'an empty string' if url == '' else type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise InvalidInput(f"malformed store url {redact_url(url)!r}") from None
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
    raise InvalidInput(f"unsupported store url scheme {scheme!r} in {redact_url(url)!r} "
                     "(use a path, file://, memory://, s3://, gs:// or az://)")


def _open_obstore(scheme: str, parts, url: str) -> ObjectStore:
    try:
        from obstore.store import AzureStore, GCSStore, S3Store
    except ImportError as e:  # pragma: no cover
        raise MissingDependency(f"{scheme}:// needs obstore (pip install obstore)") from e
    from headrace.store.remote import ObstoreStore

    if "@" in parts.netloc:
        raise InvalidInput(f"{redact_url(url)!r}: credentials in the URL's user-info are refused; "
                         "pass them as query parameters or through the environment")
    bucket = parts.netloc
    if not bucket:
        raise InvalidInput(f"{redact_url(url)!r} names no bucket")
    config = {k: v for k, v in parse_qsl(parts.query)}
    prefix = parts.path.strip("/")
    client_options = {}
    endpoint = config.get("endpoint", "")
    if endpoint.startswith("http://"):
        host = urlsplit(endpoint).hostname or ""
        if host in _LOOPBACK or config.pop("allow_http", "").lower() == "true":
            client_options["allow_http"] = True
    config.pop("allow_http", None)
    try:
        if scheme == "s3":
            config.setdefault("region", "us-east-1")
            inner = S3Store(bucket, config=config, client_options=client_options or None)
        elif scheme == "gs":
            inner = GCSStore(bucket, config=config or None, client_options=client_options or None)
        else:
            inner = AzureStore(bucket, config=config or None,
                               client_options=client_options or None)
    except Exception as e:  # noqa: BLE001 - obstore's config errors, re-raised as ours
        # first line only and no chained cause: obstore's debug dump may hold the config
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise InvalidInput(f"cannot open {redact_url(url)!r}: {first}") from None
    # no query string: it may hold credentials. PrefixedStore appends the prefix.
    store: ObjectStore = ObstoreStore(inner, f"{scheme}://{bucket}")
    return PrefixedStore(store, prefix) if prefix else store
