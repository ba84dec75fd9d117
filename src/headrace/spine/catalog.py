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
import re
import struct
import uuid
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.codec import ByteReader, check_bound, crc32
from headrace.errors import ChecksumMismatch, FormatError, InvalidInput

CATALOG_MAGIC = b"HRCK"
MANIFEST_MAGIC = b"HRSM"
VERSION = 1
MAX_CHECKPOINTS = 100_000
MAX_TEXT = 1024
MAX_MANIFEST = 64 << 20
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
    if isinstance(v, float):
        return {"float": v}
    if isinstance(v, str):
        return {"str": v}
    if isinstance(v, bytes | bytearray):
        return {"hex": bytes(v).hex()}
    raise InvalidInput(f"lower bound {v!r} of type {type(v).__name__} cannot be stored")


def _bound_from_json(v, key: str):
    if v is None:
        return None
    if not isinstance(v, dict) or len(v) != 1:
        raise FormatError(key, None, f"lower_bound {v!r} malformed")
    (kind, val), = v.items()
    try:
        if kind == "int" and isinstance(val, int):
            return val
        if kind == "float" and isinstance(val, int | float):
            return float(val)
        if kind == "str" and isinstance(val, str):
            return val
        if kind == "hex" and isinstance(val, str):
            return bytes.fromhex(val)
    except ValueError as e:
        raise FormatError(key, None, f"lower_bound {v!r} malformed") from e
    raise FormatError(key, None, f"lower_bound {v!r} malformed")


def encode_manifest(m: SpineManifest) -> bytes:
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
    try:
        obj = json.loads(bytes(body))
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(key, 16, f"manifest is not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise FormatError(key, 16, "manifest is not a JSON object")
    name, kt, vt, batches = (obj.get(f) for f in ("name", "key_type", "val_type", "batches"))
    try:
        check_spine_name(name)
    except InvalidInput as e:
        raise FormatError(key, 16, str(e)) from e
    if kt not in TYPE_NAMES or kt == "float64" or vt not in TYPE_NAMES:
        raise FormatError(key, 16, f"unsupported key/val types {kt!r}/{vt!r}")
    if not isinstance(batches, list) or not all(isinstance(b, str) and BATCH_NAME.match(b)
                                                for b in batches):
        raise FormatError(key, 16, "batches must be a list of '<ULID>.batch' names")
    return SpineManifest(name, kt, vt, batches, _bound_from_json(obj.get("lower_bound"), key))
