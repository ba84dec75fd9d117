"""Shard state: what one consensus version holds, and its byte encoding.

Every version is the *whole* state (a rollup): a cold open — which a Spark sink commit does every
micro-batch — is a head lookup plus one GET, never a replay of diffs. The state stays small
because compaction bounds the parts list. Layout: docs/formats/persist-state.md.

    magic "HRPS" | u16 version (2; 1 is still read) | u16 flags (0) | u32 body length | JSON body
    | u32 crc32
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from headrace.codec import U16, U32, ByteReader, check_bound, crc32
from headrace.errors import FormatError
from headrace.persist.consensus import MAX_SEQNO
from headrace.store import validate_key

MAGIC = b"HRPS"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: no writers, parts without floor
WRITER_ID = re.compile(r"^w-[A-Za-z0-9]{1,60}$")
HEADER = 12
MAX_BODY = 64 << 20
MAX_TIME = (1 << 64) - 1


@dataclass(frozen=True)
class PartMeta:
    """One write-once Parquet blob holding updates with times in [lower, upper)."""

    key: str
    lower: int
    upper: int
    rows: int
    size: int
    crc32: int
    time_override: int | None = None  # every row's time (parts a Spark task wrote untimed)
    floor: int = 0  # compaction advanced times below this to it (0: times are as written)
    # The data columns' schema (base64 IPC) as uploaded: checked against the shard's at link
    # time, never stored in the state (the shard holds one schema for all its parts).
    schema: str | None = field(default=None, compare=False, repr=False)

    def at_time(self, time: int) -> PartMeta:
        """This (untimed) part with every row at ``time``: what a Spark sink commit links."""
        return replace(self, lower=time, upper=time + 1, time_override=time)

    @property
    def writer_id(self) -> str | None:
        """The writer the part was uploaded under (its key's directory), None for old keys."""
        head, _, name = self.key.rpartition("/parts/")
        writer, slash, _ = name.partition("/")
        return writer if slash and head and WRITER_ID.match(writer) else None


@dataclass(frozen=True)
class WriterLease:
    """A registered writer: parts uploaded under its id are never swept while it is here.

    Dropped on any state change once ``now > heartbeat_ms + lease_ms``; a dropped writer can
    never link again (ids are single-use), which is what lets the sweep delete its parts.
    """

    writer_id: str
    heartbeat_ms: int
    lease_ms: int

    def expired(self, now_ms: int) -> bool:
        return now_ms > self.heartbeat_ms + self.lease_ms


@dataclass(frozen=True)
class LeasedReader:
    reader_id: str
    since: int
    heartbeat_ms: int
    lease_ms: int

    def expired(self, now_ms: int) -> bool:
        return now_ms > self.heartbeat_ms + self.lease_ms


@dataclass(frozen=True)
class CriticalReader:
    reader_id: str
    since: int
    token: str


@dataclass(frozen=True)
class ShardState:
    shard: str
    seqno: int = 0  # consensus seqno this state was read at (0 = no version yet); not encoded
    since: int = 0
    upper: int | None = 0  # None: the empty frontier, the shard is finished
    parts: tuple[PartMeta, ...] = ()
    leased: tuple[LeasedReader, ...] = ()
    critical: tuple[CriticalReader, ...] = ()
    writers: tuple[WriterLease, ...] = ()
    schema: str | None = None  # base64 Arrow IPC schema of the data columns, fixed by 1st write
    op_id: str = ""  # unique per version: makes every version's bytes distinct
    written_ms: int = 0

    def with_readers(self, leased=None, critical=None) -> ShardState:
        """Replace reader sets and recompute since = max(since, min over readers)."""
        leased = self.leased if leased is None else tuple(leased)
        critical = self.critical if critical is None else tuple(critical)
        sinces = [r.since for r in leased] + [r.since for r in critical]
        since = max(self.since, min(sinces)) if sinces else self.since
        return replace(self, leased=leased, critical=critical, since=since)

    def writer(self, writer_id: str) -> WriterLease | None:
        for w in self.writers:
            if w.writer_id == writer_id:
                return w
        return None

    def reader(self, reader_id: str) -> LeasedReader | CriticalReader | None:
        for r in (*self.leased, *self.critical):
            if r.reader_id == reader_id:
                return r
        return None


def encode_state(state: ShardState) -> bytes:
    body = json.dumps({
        "shard": state.shard, "since": state.since, "upper": state.upper,
        "parts": [[p.key, p.lower, p.upper, p.rows, p.size, p.crc32, p.time_override, p.floor]
                  for p in state.parts],
        "leased": [[r.reader_id, r.since, r.heartbeat_ms, r.lease_ms] for r in state.leased],
        "writers": [[w.writer_id, w.heartbeat_ms, w.lease_ms] for w in state.writers],
        "critical": [[r.reader_id, r.since, r.token] for r in state.critical],
        "schema": state.schema, "op_id": state.op_id, "written_ms": state.written_ms,
    }, separators=(",", ":"), sort_keys=True).encode()
    head = MAGIC + U16.pack(FORMAT_VERSION) + U16.pack(0) + U32.pack(len(body))
    return head + body + U32.pack(crc32(head + body))


def decode_state(data: bytes, *, key: str | None = None, seqno: int = 0) -> ShardState:
    """Parse and validate one state version; any defect is a FormatError naming key and offset."""
    r = ByteReader(data, key)
    if bytes(r.take(4, "magic")) != MAGIC:
        raise FormatError(key, 0, "bad magic, expected HRPS")
    version = r.u16("format version")
    if version not in READABLE_VERSIONS:
        raise FormatError(key, 4, f"unsupported state format version {version}")
    if r.u16("flags") != 0:
        raise FormatError(key, 6, "unknown flags")
    n = check_bound(r.u32("body length"), min(MAX_BODY, r.remaining() - 4), key=key, offset=8,
                    what="body length")
    body = r.take(n, "body")
    (stored,) = U32.unpack_from(r.take(4, "crc32"))
    if r.remaining():
        raise FormatError(key, r.pos, f"{r.remaining()} trailing bytes")
    if crc32(memoryview(data)[: HEADER + n]) != stored:
        raise FormatError(key, HEADER + n, "state crc32 mismatch")
    try:
        obj = json.loads(bytes(body))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(key, HEADER, f"state body is not JSON: {e}") from None
    except RecursionError:  # hostile nesting: the parser gives up before the stack does
        raise FormatError(key, HEADER, "state body is nested too deeply") from None
    return _state_from_json(obj, key, seqno, version)


class _V:
    """Field validation that turns every surprise into a FormatError with the field's path."""

    def __init__(self, key: str | None):
        self.key = key

    def fail(self, path: str, what: str):
        raise FormatError(self.key, HEADER, f"field {path}: {what}")

    def int_(self, v, path: str, lo: int = 0, hi: int = MAX_TIME) -> int:
        if type(v) is not int or not lo <= v <= hi:
            self.fail(path, f"expected an integer in [{lo}, {hi}], got {v!r:.60}")
        return v

    def opt_int(self, v, path: str) -> int | None:
        return None if v is None else self.int_(v, path)

    def str_(self, v, path: str, max_len: int = 4096) -> str:
        if not isinstance(v, str) or len(v) > max_len:
            self.fail(path, f"expected a string of at most {max_len} chars")
        return v

    def list_(self, v, path: str, width: int | None = None) -> list:
        if not isinstance(v, list) or (width is not None and len(v) != width):
            self.fail(path, f"expected a list{'' if width is None else f' of {width}'}")
        return v


def _state_from_json(obj, key: str | None, seqno: int, version: int) -> ShardState:
    v = _V(key)
    if not isinstance(obj, dict):
        v.fail("$", "expected an object")
    expected = {"shard", "since", "upper", "parts", "leased", "critical", "schema", "op_id",
                "written_ms"} | ({"writers"} if version >= 2 else set())
    if set(obj) != expected:
        v.fail("$", f"keys {sorted(obj)} != {sorted(expected)}")
    parts = []
    width = 8 if version >= 2 else 7
    for i, p in enumerate(v.list_(obj["parts"], "parts")):
        p = v.list_(p, f"parts[{i}]", width)
        pkey = v.str_(p[0], f"parts[{i}].key", 1024)
        try:
            validate_key(pkey)
        except ValueError as e:
            v.fail(f"parts[{i}].key", str(e))
        lower, upper = v.int_(p[1], f"parts[{i}].lower"), v.int_(p[2], f"parts[{i}].upper")
        if upper < lower:
            v.fail(f"parts[{i}]", f"upper {upper} < lower {lower}")
        parts.append(PartMeta(pkey, lower, upper, v.int_(p[3], f"parts[{i}].rows"),
                              v.int_(p[4], f"parts[{i}].size"),
                              v.int_(p[5], f"parts[{i}].crc32", 0, 0xFFFFFFFF),
                              v.opt_int(p[6], f"parts[{i}].time_override"),
                              v.int_(p[7], f"parts[{i}].floor") if width == 8 else 0))
    leased = []
    for i, x in enumerate(v.list_(obj["leased"], "leased")):
        x = v.list_(x, f"leased[{i}]", 4)
        leased.append(LeasedReader(v.str_(x[0], f"leased[{i}].id", 200),
                                   v.int_(x[1], f"leased[{i}].since"),
                                   v.int_(x[2], f"leased[{i}].heartbeat_ms"),
                                   v.int_(x[3], f"leased[{i}].lease_ms")))
    critical = []
    for i, x in enumerate(v.list_(obj["critical"], "critical")):
        x = v.list_(x, f"critical[{i}]", 3)
        critical.append(CriticalReader(v.str_(x[0], f"critical[{i}].id", 200),
                                       v.int_(x[1], f"critical[{i}].since"),
                                       v.str_(x[2], f"critical[{i}].token")))
    writers = []
    for i, x in enumerate(v.list_(obj.get("writers", []), "writers")):
        x = v.list_(x, f"writers[{i}]", 3)
        wid = v.str_(x[0], f"writers[{i}].id", 64)
        if not WRITER_ID.match(wid):
            v.fail(f"writers[{i}].id", f"{wid!r} is not a writer id")
        writers.append(WriterLease(wid, v.int_(x[1], f"writers[{i}].heartbeat_ms"),
                                   v.int_(x[2], f"writers[{i}].lease_ms")))
    schema = obj["schema"]
    if schema is not None:
        v.str_(schema, "schema", 1 << 20)
    return ShardState(
        shard=v.str_(obj["shard"], "shard", 200), seqno=v.int_(seqno, "seqno", 0, MAX_SEQNO),
        since=v.int_(obj["since"], "since"), upper=v.opt_int(obj["upper"], "upper"),
        parts=tuple(parts), leased=tuple(leased), critical=tuple(critical),
        writers=tuple(writers), schema=schema,
        op_id=v.str_(obj["op_id"], "op_id", 64),
        written_ms=v.int_(obj["written_ms"], "written_ms"))
