"""open_store(url): the backend is chosen by URL scheme.

    /some/path, file:///some/path     LocalStore (the default)
    memory://name                     MemoryStore (process-local; same name → same store)
    s3://bucket/prefix?endpoint=http://127.0.0.1:5000&region=us-east-1
    gs://bucket/prefix, az://container/prefix   (obstore; credentials from the environment)

Query parameters are passed to obstore as config (``endpoint``, ``region``, ``allow_http``,
``access_key_id`` ...). ``allow_http`` is turned on automatically for loopback endpoints.
headrace's own parameters bound every remote call (docs/store.md "Timeouts and retries"):
``timeout`` (per request, default 10s), ``connect_timeout`` (default 5s), ``max_retries``
(default 3) and ``retry_timeout`` (the window in which retries may start, default = timeout).
"""

from __future__ import annotations

import os
import re
import threading
from datetime import timedelta
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
_PUBLIC_PARAMS = frozenset({"endpoint", "region", "allow_http", "timeout", "connect_timeout",
                            "max_retries", "retry_timeout"})
#: headrace's bounds on remote calls: (default, largest accepted)
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_MAX_RETRIES = 3
_MAX_DURATION_S = 3600.0
_MAX_RETRIES_LIMIT = 20
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")
# where obstore looks for S3 credentials besides the URL (AWS_PROFILE is not read by it)
_S3_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE",
                      "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                      "AWS_CONTAINER_CREDENTIALS_FULL_URI")
_S3_CREDENTIAL_PARAMS = ("access_key_id", "aws_access_key_id", "token", "session_token",
                         "aws_session_token", "aws_token")
S3_CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary "
    "credentials) in the environment, or access_key_id= and secret_access_key= in the store "
    "URL's query, or skip_signature=true for a public bucket; on EC2, attach an instance "
    "profile")


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
    # '*' stays as is: the mask must read as a mask, not as %2A%2A%2A
    return f"{out}?{urlencode(query, safe='/:*')}" if query else out


def open_store(url: str | ObjectStore, *, create: bool = True) -> ObjectStore:
    """Open the store a URL names (or return an ObjectStore passed in as is).

    ``create=False`` opens a local folder without creating it or anything in it (a missing
    folder is StoreNotFound); remote stores never create their bucket either way."""
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
        return LocalStore(path, create=create)
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
    # the URL's path starts with the '/' that ends the bucket; what follows is a relative
    # prefix (PrefixedStore refuses a second leading '/', e.g. s3://bucket//abs)
    prefix = parts.path[1:] if parts.path.startswith("/") else parts.path
    limits = _call_limits(config, url)
    client_options: dict = {"timeout": limits["timeout"],
                            "connect_timeout": limits["connect_timeout"]}
    retry_config = {"max_retries": limits["max_retries"],
                    "retry_timeout": limits["retry_timeout"]}
    endpoint = config.get("endpoint", "")
    if endpoint.startswith("http://"):
        host = urlsplit(endpoint).hostname or ""
        if host in _LOOPBACK or config.pop("allow_http", "").lower() == "true":
            client_options["allow_http"] = True
    config.pop("allow_http", None)
    credentials_hint = None
    if scheme == "s3" and not _s3_credentials_given(config):
        credentials_hint = S3_CREDENTIALS_HINT
    try:
        if scheme == "s3":
            config.setdefault("region", "us-east-1")
            inner = S3Store(bucket, config=config, client_options=client_options,
                            retry_config=retry_config)
        elif scheme == "gs":
            inner = GCSStore(bucket, config=config or None, client_options=client_options,
                             retry_config=retry_config)
        else:
            inner = AzureStore(bucket, config=config or None, client_options=client_options,
                               retry_config=retry_config)
    except Exception as e:  # noqa: BLE001 - obstore's config errors, re-raised as ours
        # first line only and no chained cause: obstore's debug dump may hold the config
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise InvalidInput(f"cannot open {redact_url(url)!r}: {first}") from None
    # no query string: it may hold credentials. PrefixedStore appends the prefix.
    store: ObjectStore = ObstoreStore(
        inner, f"{scheme}://{bucket}", endpoint=redact_url(endpoint) if endpoint else None,
        timeout_s=limits["timeout"].total_seconds(), credentials_hint=credentials_hint)
    return PrefixedStore(store, prefix) if prefix else store


def parse_duration(text: str, name: str, url: str) -> timedelta:
    """``5s``, ``500ms``, ``2m`` or plain seconds; InvalidInput naming the parameter."""
    m = _DURATION.match(text)
    if not m:
        raise InvalidInput(f"{name}={text!r:.40} in {redact_url(url)!r}: use a duration such as "
                           "5s, 500ms or 2m")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]
    if not 0 < value <= _MAX_DURATION_S:
        raise InvalidInput(f"{name}={text!r:.40} in {redact_url(url)!r}: must be more than 0 "
                           f"and at most {_MAX_DURATION_S:.0f}s")
    return timedelta(seconds=value)


def _call_limits(config: dict, url: str) -> dict:
    """Pop headrace's own parameters from ``config``: timeouts and the retry bound."""
    timeout = parse_duration(config.pop("timeout", f"{DEFAULT_TIMEOUT_S}s"), "timeout", url)
    connect = parse_duration(config.pop("connect_timeout", f"{DEFAULT_CONNECT_TIMEOUT_S}s"),
                             "connect_timeout", url)
    retry_window = parse_duration(config.pop("retry_timeout", f"{timeout.total_seconds()}s"),
                                  "retry_timeout", url)
    raw = config.pop("max_retries", str(DEFAULT_MAX_RETRIES))
    if not raw.isdigit() or int(raw) > _MAX_RETRIES_LIMIT:
        raise InvalidInput(f"max_retries={raw!r:.40} in {redact_url(url)!r}: use an integer "
                           f"from 0 to {_MAX_RETRIES_LIMIT}")
    return {"timeout": timeout, "connect_timeout": connect,
            "retry_timeout": retry_window, "max_retries": int(raw)}


def _s3_credentials_given(config: dict) -> bool:
    """Whether credentials are named anywhere obstore reads them, other than instance metadata."""
    lowered = {k.lower(): v for k, v in config.items()}
    if any(lowered.get(k) for k in _S3_CREDENTIAL_PARAMS):
        return True
    if lowered.get("skip_signature", "").lower() == "true" \
            or os.environ.get("AWS_SKIP_SIGNATURE", "").lower() == "true":
        return True
    return any(os.environ.get(k) for k in _S3_CREDENTIAL_ENV)
