"""ObstoreStore: S3 / GCS / Azure (and obstore's memory store) through obstore.

The only module in headrace that imports a storage SDK. obstore speaks the three put modes
natively (If-None-Match: * for Create, If-Match for IfMatch), which S3, GCS and Azure all honour.
Every call is bounded by the timeouts and retry limits ``open_store`` configures; a call that
runs out of time raises StoreTimeout, and a store opened without credentials whose requests fail
for want of them raises CredentialsMissing saying what to set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from headrace.errors import (
    AlreadyExists,
    CredentialsMissing,
    MissingDependency,
    NotFound,
    PreconditionFailed,
    StoreError,
    StoreTimeout,
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
    payload_bytes,
    validate_key,
    validate_prefix,
)

try:
    import obstore
    from obstore import exceptions as obx
except ImportError as e:  # pragma: no cover - obstore is a core dependency
    raise MissingDependency("obstore is required for s3://, gs:// and az:// stores "
                            "(pip install obstore)") from e

# obstore raises these for failures a retry cannot fix
_PERMANENT = (obx.PermissionDeniedError, obx.UnauthenticatedError, obx.InvalidPathError,
              obx.NotSupportedError, obx.UnknownConfigurationKeyError)
# how obstore's (debug) text shows a timeout, and a failed credential lookup (the EC2 instance
# metadata endpoint is where it looks last)
_TIMEOUT_MARKS = ("kind: Timeout", "TimedOut", "operation timed out")
_CREDENTIAL_MARKS = ("/latest/api/token", "/latest/meta-data", "169.254.169.254",
                     "credential", "Credential")
# how S3 (and S3-compatible servers), GCS and Azure say the bucket / container is missing. A
# HEAD has no body, so a HEAD on a missing bucket stays an object NotFound.
_NO_BUCKET_MARKS = ("<Code>NoSuchBucket</Code>", "The specified bucket does not exist",
                    "<Code>ContainerNotFound</Code>")


def _ts(meta) -> float:
    lm = meta.get("last_modified")
    return lm.timestamp() if lm is not None else 0.0


class ObstoreStore(ObjectStore):
    capabilities = Capabilities(conditional_put=True, listable=True, local_path=False)

    def __init__(self, inner, url: str, *, endpoint: str | None = None,
                 timeout_s: float | None = None, credentials_hint: str | None = None):
        self._s = inner
        self.url = url
        self._endpoint = endpoint or url
        self._timeout_s = timeout_s
        self._credentials_hint = credentials_hint  # set when none were given at open

    @contextmanager
    def _errors(self, key: str, mode: PutMode | None = None):
        """Translate obstore's errors (its own classes and the builtins it raises) to ours."""
        try:
            yield
        except (obx.NotFoundError, FileNotFoundError) as e:
            self._raise_if_no_bucket(e)
            if isinstance(mode, IfMatch):  # IfMatch on a missing object: precondition failed
                raise PreconditionFailed(key, mode.etag) from e
            raise NotFound(key) from e
        except (obx.AlreadyExistsError, FileExistsError) as e:
            raise AlreadyExists(key) from e
        except obx.PreconditionError as e:
            raise PreconditionFailed(key, getattr(mode, "etag", None)) from e
        except (obx.BaseError, OSError) as e:
            # never include obstore's config dump: it may carry credentials
            full = str(e)
            text = full.splitlines()[0][:200] if full else ""
            self._raise_if_no_bucket(e)
            if self._credentials_hint and any(m in full for m in _CREDENTIAL_MARKS):
                raise CredentialsMissing(
                    f"no credentials for {self.url} (needed for {key!r}): "
                    f"{self._credentials_hint}", key=key) from None
            if any(m in full for m in _TIMEOUT_MARKS):
                limit = f" within {self._timeout_s:g}s" if self._timeout_s else ""
                raise StoreTimeout(
                    f"{self._endpoint} did not answer{limit} (object {key!r}); raise "
                    "?timeout= / ?connect_timeout= in the store URL if it is just slow",
                    key=key) from None
            raise StoreError(f"{type(e).__name__} on {key!r}: {text}", key=key,
                             retryable=not isinstance(e, _PERMANENT)) from e

    def _raise_if_no_bucket(self, e: BaseException) -> None:
        """A missing bucket is StoreNotFound naming it (not an object NotFound, not a retryable
        error quoting the server's XML)."""
        full = str(e)
        if any(m in full for m in _NO_BUCKET_MARKS):
            scheme, _, bucket = self.url.partition("://")
            what = "container" if scheme in ("az", "abfs") else "bucket"
            at = f"at {self._endpoint}; " if self._endpoint != self.url else ""
            raise StoreNotFound(what, bucket, f"{at}create it first or check the store URL") \
                from None

    def get(self, key: str) -> GetResult:
        validate_key(key)
        with self._errors(key):
            res = obstore.get(self._s, key)
            return GetResult(bytes(res.bytes()), res.meta.get("e_tag") or "")

    def get_range(self, key: str, start: int, end: int) -> bytes:
        validate_key(key)
        check_range(key, start, end)
        size = None
        if end > start:
            try:
                with self._errors(key):
                    return bytes(obstore.get_range(self._s, key, start=start, end=end))
            except StoreError as e:
                if isinstance(e, NotFound | StoreNotFound):
                    raise
                size = self.head(key).size  # obstore refuses a range past the end; we clip
                if start < size:
                    raise
                return b""
        self.head(key)  # an empty range still reports a missing object
        return b""

    def head(self, key: str) -> ObjectMeta:
        validate_key(key)
        with self._errors(key):
            m = obstore.head(self._s, key)
        return ObjectMeta(m["path"], m["size"], m.get("e_tag") or "", _ts(m))

    def put(self, key: str, data, mode: PutMode = OVERWRITE) -> str:
        validate_key(key)
        if isinstance(mode, Create):
            om = "create"
        elif isinstance(mode, IfMatch):
            om = {"e_tag": mode.etag}
        else:
            om = "overwrite"
        with self._errors(key, mode):
            res = obstore.put(self._s, key, memoryview(payload_bytes(data)), mode=om,
                              use_multipart=False)
        return res.get("e_tag") or ""

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        validate_prefix(prefix)
        # obstore lists by whole path segments; list the enclosing folder and filter
        folder = prefix.rpartition("/")[0]
        out = []
        with self._errors(prefix or "/"):
            for chunk in obstore.list(self._s, folder or None, chunk_size=1000):
                for m in chunk:
                    if m["path"].startswith(prefix):
                        out.append(ObjectMeta(m["path"], m["size"], m.get("e_tag") or "", _ts(m)))
        out.sort(key=lambda m: m.key)
        return iter(out)

    def delete(self, key: str) -> None:
        validate_key(key)
        try:
            with self._errors(key):
                obstore.delete(self._s, key)
        except NotFound:
            return

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = [validate_key(k) for k in keys]
        for i in range(0, len(keys), 1000):
            try:
                with self._errors(keys[i]):
                    obstore.delete(self._s, keys[i : i + 1000])
            except NotFound:
                continue
