"""The checkpoint catalog (``HRCK``) and the per-spine manifest (``HRSM``) byte formats.

Catalog ``checkpoints.headrace`` (docs/formats/spine-catalog.md): the list of checkpoints, oldest
first; replacing it atomically is the commit point of a checkpoint.

    "HRCK" u16 version u16 flags u32 count
    count x { 16-byte uuid, i64 step, u64 created_ms, u16 len + fingerprint (utf-8),
              u16 len + identifier (utf-8) }
    u32 crc32 of every byte before it

Manifest ``<uuid>/spine-<name>.dat``: one spine's batch list and metadata.

    "HRSM" u16 version u16 flags u32 json length u32 crc32(json) + JSON object
    {"name", "key_type", "val_type", "batches": [file names], "lower_bound": null|{type: value}}
"""

from __future__ import annotations

import json
import math
import re
import struct
import uuid
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.codec import ByteReader, check_bound, crc32
from headrace.codec.jsonsafe import field as json_field
from headrace.codec.jsonsafe import loads_bounded
from headrace.errors import ChecksumMismatch, FormatError, InvalidInput

CATALOG_MAGIC = b"HRCK"
MANIFEST_MAGIC = b"HRSM"
VERSION = 1
MAX_CHECKPOINTS = 100_000
MAX_TEXT = 1024
MAX_MANIFEST = 64 << 20
MAX_MANIFEST_DEPTH = 8  # the manifest's JSON is 3 levels deep; more is not a manifest
BATCH_NAME = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}\.batch$")
SPINE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
TYPE_NAMES = {"int64": pa.int64(), "float64": pa.float64(), "large_string": pa.large_string(),
              "large_binary": pa.large_binary()}
_HEAD = struct.Struct("<4sHHI")
_ENTRY = struct.Struct("<16sqQ")


def type_name(t: pa.DataType) -> str:
    for name, ty in TYPE_NAMES.items():
        if ty == t:
            return name
    raise InvalidInput(f"type {t} cannot be stored in a spine")


def check_spine_name(name: str) -> str:
    if not isinstance(name, str) or not SPINE_NAME.match(name):
        raise InvalidInput(f"spine name {name!r}: use 1-100 of [A-Za-z0-9_.-], not starting "
                           "with '.' or '-'")
    return name


@dataclass(frozen=True)
class CheckpointInfo:
    id: str  # uuid hex, 32 characters
    step: int
    fingerprint: str
    created_ms: int
    identifier: str = ""


@dataclass
class SpineManifest:
    name: str
    key_type: str
    val_type: str
    batches: list[str] = field(default_factory=list)
    lower_bound: object = None


def encode_catalog(entries: list[CheckpointInfo]) -> bytes:
    out = bytearray(_HEAD.pack(CATALOG_MAGIC, VERSION, 0, len(entries)))
    for e in entries:
        out += _ENTRY.pack(uuid.UUID(hex=e.id).bytes, e.step, e.created_ms)
        for text in (e.fingerprint, e.identifier):
            raw = text.encode()
            if len(raw) > MAX_TEXT:
                raise InvalidInput(f"fingerprint/identifier longer than {MAX_TEXT} bytes")
            out += struct.pack("<H", len(raw)) + raw
    out += struct.pack("<I", crc32(out))
    return bytes(out)


def decode_catalog(data: bytes, key: str = "checkpoints.headrace") -> list[CheckpointInfo]:
    if len(data) < _HEAD.size + 4:
        raise FormatError(key, 0, f"catalog of {len(data)} bytes is too short")
    body, (stored,) = memoryview(data)[:-4], struct.unpack_from("<I", data, len(data) - 4)
    actual = crc32(body)
    if actual != stored:
        raise ChecksumMismatch(key, len(data) - 4, "crc32 of catalog", expected=stored,
                               actual=actual)
    r = ByteReader(body, key)
    magic = bytes(r.take(4, "magic"))
    if magic != CATALOG_MAGIC:
        raise FormatError(key, 0, f"bad magic {magic!r}")
    version = r.u16("version")
    if version != VERSION:
        raise FormatError(key, 4, f"unsupported catalog version {version}")
    r.u16("flags")
    count = check_bound(r.u32("count"), min(MAX_CHECKPOINTS, r.remaining() // 28), key=key,
                        offset=8, what="checkpoint count")
    out = []
    for _ in range(count):
        at = r.pos
        raw_id = bytes(r.take(16, "checkpoint uuid"))
        step = r.i64("step")
        created = r.u64("created_ms")
        texts = []
        for what in ("fingerprint", "identifier"):
            n = check_bound(r.u16(f"{what} length"), MAX_TEXT, key=key, offset=r.pos,
                            what=f"{what} length")
            try:
                texts.append(bytes(r.take(n, what)).decode())
            except UnicodeDecodeError as e:
                raise FormatError(key, at, f"{what} is not utf-8") from e
        out.append(CheckpointInfo(uuid.UUID(bytes=raw_id).hex, step, texts[0], created, texts[1]))
    if r.remaining():
        raise FormatError(key, r.pos, f"{r.remaining()} trailing bytes in catalog")
    return out


def _bound_to_json(v):
    if v is None:
        return None
    if isinstance(v, bool):
        raise InvalidInput("a bool lower bound is not a key")
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, str):
        return {"str": v}
    if isinstance(v, bytes | bytearray):
        return {"hex": bytes(v).hex()}
    raise InvalidInput(f"lower bound {v!r:.80} of type {type(v).__name__} cannot be stored")


#: the lower-bound encoding each key type stores (float64 is not a key type)
BOUND_KIND = {"int64": "int", "large_string": "str", "large_binary": "hex"}


def _bound_from_json(v, key: str, key_type: str):
    """The lower bound of a manifest, checked against the spine's key type."""
    if v is None:
        return None
    if not isinstance(v, dict) or len(v) != 1:
        raise FormatError(key, 16, f"field 'lower_bound' must be null or a one-member object, "
                          f"got {v!r:.80}")
    (kind, val), = v.items()
    want = BOUND_KIND[key_type]
    if kind == "float" and want == "int" and isinstance(val, int | float) \
            and not isinstance(val, bool) and math.isfinite(val) and abs(val) < 2**63:
        return math.ceil(val)  # older files: keys >= 2.5 are exactly keys >= 3
    if kind != want:
        raise FormatError(key, 16, f"field 'lower_bound' is {kind!r:.20} but keys of type "
                          f"{key_type} need {want!r}")
    if kind == "int" and isinstance(val, int) and not isinstance(val, bool) \
            and -2**63 <= val < 2**63:
        return val
    if kind == "str" and isinstance(val, str):
        return val
    if kind == "hex" and isinstance(val, str):
        try:
            return bytes.fromhex(val)
        except ValueError:
            pass
    raise FormatError(key, 16, f"field 'lower_bound' {v!r:.80} is not a valid {key_type} key")


def check_bound_value(bound, key_type: pa.DataType, where: str) -> object:
    """A lower bound a caller passes for keys of ``key_type``; InvalidInput when it cannot be
    one (a str bound on int64 keys would fail deep inside Arrow's compare kernels)."""
    if bound is None:
        return None
    if pa.types.is_int64(key_type):
        ok = isinstance(bound, int) and not isinstance(bound, bool) and -2**63 <= bound < 2**63
    elif pa.types.is_large_string(key_type):
        ok = isinstance(bound, str)
    elif pa.types.is_large_binary(key_type):
        ok = isinstance(bound, bytes | bytearray)
        bound = bytes(bound) if ok else bound
    else:
        ok = False
    if not ok:
        raise InvalidInput(f"{where}: lower bound {bound!r:.80} of type {type(bound).__name__} "
                           f"cannot bound keys of type {key_type}")
    return bound


def encode_manifest(m: SpineManifest) -> bytes:
    if m.key_type not in BOUND_KIND:
        raise InvalidInput(f"spine {m.name!r}: key type {m.key_type!r} cannot be stored")
    check_bound_value(m.lower_bound, TYPE_NAMES[m.key_type], f"spine {m.name!r}")
    body = json.dumps({"name": m.name, "key_type": m.key_type, "val_type": m.val_type,
                       "batches": list(m.batches),
                       "lower_bound": _bound_to_json(m.lower_bound)},
                      sort_keys=True, separators=(",", ":")).encode()
    return _HEAD.pack(MANIFEST_MAGIC, VERSION, 0, len(body)) + struct.pack("<I", crc32(body)) \
        + body


def decode_manifest(data: bytes, key: str) -> SpineManifest:
    r = ByteReader(data, key)
    magic = bytes(r.take(4, "magic"))
    if magic != MANIFEST_MAGIC:
        raise FormatError(key, 0, f"bad magic {magic!r}")
    if (version := r.u16("version")) != VERSION:
        raise FormatError(key, 4, f"unsupported manifest version {version}")
    r.u16("flags")
    n = check_bound(r.u32("json length"), min(MAX_MANIFEST, r.remaining() - 4), key=key,
                    offset=8, what="manifest length")
    stored = r.u32("crc32")
    body = r.take(n, "manifest json")
    if r.remaining():
        raise FormatError(key, r.pos, "trailing bytes after manifest")
    if (actual := crc32(body)) != stored:
        raise ChecksumMismatch(key, 12, "crc32 of manifest", expected=stored, actual=actual)
    obj = loads_bounded(body, key, max_depth=MAX_MANIFEST_DEPTH, max_bytes=MAX_MANIFEST,
                        offset=16)
    name = json_field(obj, "name", str, key, offset=16)
    kt = json_field(obj, "key_type", str, key, offset=16)
    vt = json_field(obj, "val_type", str, key, offset=16)
    batches = json_field(obj, "batches", list, key, offset=16)
    bound = json_field(obj, "lower_bound", (dict, type(None)), key, default=None, offset=16)
    try:
        check_spine_name(name)
    except InvalidInput as e:
        raise FormatError(key, 16, f"field 'name': {e}") from e
    if kt not in BOUND_KIND:
        raise FormatError(key, 16, f"field 'key_type' {kt!r:.40} is not one of "
                          f"{sorted(BOUND_KIND)}")
    if vt not in TYPE_NAMES:
        raise FormatError(key, 16, f"field 'val_type' {vt!r:.40} is not one of "
                          f"{sorted(TYPE_NAMES)}")
    if not all(isinstance(b, str) and BATCH_NAME.match(b) for b in batches):
        raise FormatError(key, 16, "field 'batches' must be a list of '<ULID>.batch' names")
    return SpineManifest(name, kt, vt, batches, _bound_from_json(bound, key, kt))
