"""The spine batch file (``HRSB`` v1): one sorted, consolidated Z-set as Arrow IPC + checks.

Layout (little-endian; every section starts on a 64-byte boundary so mmap reads stay aligned and
Arrow never has to copy a buffer; docs/formats/spine-batch.md has the table):

    header   "HRSB" u16 version u16 flags
    schema   Arrow IPC schema message (key, val, w)
    body     ONE Arrow IPC record-batch message: contiguous columns, so a lookup is one
             searchsorted over the mmap'd key column
    index    Arrow IPC record-batch message: per block row_start, first_key, last_key, crc32
    bloom    bloom filter bits over the distinct keys (may be empty)
    footer   92 bytes, see FOOTER

A *block* is a row range whose column bytes total about ``block_bytes``; its CRC32 runs over the
column byte slices of those rows (values; for variable-width columns the offsets [r0, r1] and the
data bytes they span). Blocks are verified lazily, the first time a read touches them, so opening
a file costs only the small sections, and a flipped byte anywhere in a block fails the read that
touches it with ChecksumMismatch naming the file and block.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from headrace.codec import crc32
from headrace.errors import ChecksumMismatch, FormatError

MAGIC = b"HRSB"
VERSION = 1
HEADER = struct.Struct("<4sHH")
_I64 = struct.Struct("<q")
# rows, blocks, bloom_k, (offset, length, crc32) x {schema, index, bloom, body metadata},
# body offset repeated as the body section start, version, flags, footer crc, magic
FOOTER = struct.Struct("<QII" + "QII" * 4 + "HHI4s")
FOOTER_CRC_SPAN = FOOTER.size - 8  # crc covers every footer byte before the crc itself
ALIGN = 64
MAX_BLOCKS = 1 << 26
MAX_BLOOM_K = 32
KEY_TYPES = (pa.int64(), pa.large_binary(), pa.large_string())
VAL_TYPES = (pa.int64(), pa.float64(), pa.large_binary(), pa.large_string())


def pad_len(n: int) -> int:
    return (-n) % ALIGN


@dataclass(frozen=True)
class ColumnLayout:
    """Where one column's bytes sit inside the file buffer (byte offsets from its start)."""

    fixed: bool
    values_off: int  # fixed: values; variable: int64 offsets array
    data_off: int  # variable only: start of the data bytes
    data_len: int


@dataclass
class Decoded:
    """The parsed, header-verified parts of a batch file; blocks are checked separately."""

    schema: pa.Schema
    body: pa.RecordBatch
    row_start: np.ndarray  # uint64 [blocks]
    first_keys: pa.Array
    last_keys: pa.Array
    block_crc: np.ndarray  # uint32 [blocks]
    bloom: np.ndarray  # uint8 bits
    bloom_k: int
    layouts: list[ColumnLayout]


def index_schema(key_type: pa.DataType) -> pa.Schema:
    return pa.schema([("row_start", pa.uint64()), ("first_key", key_type),
                      ("last_key", key_type), ("crc32", pa.uint32())])


def column_layouts(rb: pa.RecordBatch, base_address: int, size: int, key: str | None,
                   ) -> list[ColumnLayout]:
    """Byte positions of each column of ``rb`` (read zero-copy from a buffer at base_address)."""
    out = []
    n = rb.num_rows
    for name, col in zip(rb.schema.names, rb.columns, strict=True):
        if col.offset != 0 or col.null_count != 0:
            raise FormatError(key, None, f"column {name!r}: nulls or offset views are not allowed")
        bufs = col.buffers()
        if pa.types.is_int64(col.type) or pa.types.is_float64(col.type):
            vals = bufs[1]
            off = _buffer_offset(vals, base_address, size, n * 8, key, name)
            out.append(ColumnLayout(True, off, 0, 0))
        else:
            offs, data = bufs[1], bufs[2]
            off = _buffer_offset(offs, base_address, size, (n + 1) * 8, key, name)
            dlen = 0 if data is None else data.size
            doff = 0 if not dlen else _buffer_offset(data, base_address, size, dlen, key, name)
            out.append(ColumnLayout(False, off, doff, dlen))
    return out


def _buffer_offset(b: pa.Buffer | None, base: int, size: int, need: int, key, name) -> int:
    if need == 0:
        return 0
    if b is None or b.size < need:
        raise FormatError(key, None, f"column {name!r}: buffer shorter than {need} bytes")
    off = b.address - base
    if off < 0 or off + need > size:
        raise FormatError(key, None, f"column {name!r}: buffer outside the file")
    return off


def block_crc(mv: memoryview, layouts: list[ColumnLayout], r0: int, r1: int,
              key: str | None, block: int) -> int:
    """CRC32 over the bytes of rows [r0, r1) of every column (bounds-checked before reading)."""
    c = 0
    for lay in layouts:
        if lay.fixed:
            c = crc32(mv[lay.values_off + 8 * r0: lay.values_off + 8 * r1], c)
            continue
        (d0,) = _I64.unpack_from(mv, lay.values_off + 8 * r0)
        (d1,) = _I64.unpack_from(mv, lay.values_off + 8 * r1)
        if not 0 <= d0 <= d1 <= lay.data_len:
            raise ChecksumMismatch(key, lay.values_off + 8 * r0,
                                   f"block {block}: offsets [{d0}, {d1}) outside the data")
        c = crc32(mv[lay.values_off + 8 * r0: lay.values_off + 8 * (r1 + 1)], c)
        c = crc32(mv[lay.data_off + d0: lay.data_off + d1], c)
    return c


def choose_blocks(rb: pa.RecordBatch, block_bytes: int) -> np.ndarray:
    """Row starts of blocks of about ``block_bytes`` each (vectorised over rows)."""
    n = rb.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    per_row = np.zeros(n, dtype=np.int64)
    for col in rb.columns:
        if pa.types.is_int64(col.type) or pa.types.is_float64(col.type):
            per_row += 8
        else:
            offs = np.frombuffer(col.buffers()[1], dtype="<i8", count=n + 1, offset=8 * col.offset)
            per_row += 8 + np.diff(offs)
    cum = np.cumsum(per_row)
    # a new block starts at the first row whose cumulative size crosses the next multiple
    bucket = (cum - per_row) // max(block_bytes, 1)
    starts = np.flatnonzero(np.diff(bucket, prepend=-1) != 0)
    return starts.astype(np.uint64)


def encode(rb: pa.RecordBatch, bloom: np.ndarray, bloom_k: int, block_bytes: int,
           flags: int = 0) -> list:
    """The file as a list of buffers (write them in order, or join them for bytes)."""
    schema_msg = rb.schema.serialize()
    body_msg = rb.serialize()
    body = pa.ipc.read_record_batch(body_msg, rb.schema)  # zero-copy view to find the buffers
    layouts = column_layouts(body, body_msg.address, body_msg.size, None)
    starts = choose_blocks(body, block_bytes)
    n = rb.num_rows
    bounds = np.append(starts, np.uint64(n)).astype(np.int64)
    mv = memoryview(body_msg)
    crcs = np.array([block_crc(mv, layouts, int(bounds[i]), int(bounds[i + 1]), None, i)
                     for i in range(len(starts))], dtype=np.uint32)
    keys = rb.column(0)
    last_rows = (bounds[1:] - 1).astype(np.int64)
    index = pa.record_batch(
        [pa.array(starts, pa.uint64()), keys.take(pa.array(starts.astype(np.int64))),
         keys.take(pa.array(last_rows)), pa.array(crcs, pa.uint32())],
        schema=index_schema(rb.schema.field("key").type))
    index_msg = index.serialize()
    meta_len = _message_metadata_len(mv, None, 0)

    parts: list = []
    pos = 0

    def add(buf) -> int:
        nonlocal pos
        start = pos
        parts.append(buf)
        pos += len(buf) if not isinstance(buf, pa.Buffer) else buf.size
        pad = pad_len(pos)
        if pad:
            parts.append(b"\0" * pad)
            pos += pad
        return start

    add(HEADER.pack(MAGIC, VERSION, flags))
    schema_off = add(schema_msg)
    body_off = add(body_msg)
    index_off = add(index_msg)
    bloom_bytes = bloom.tobytes()
    bloom_off = add(bloom_bytes)
    head = FOOTER.pack(
        n, len(starts), bloom_k,
        schema_off, schema_msg.size, crc32(schema_msg),
        index_off, index_msg.size, crc32(index_msg),
        bloom_off, len(bloom_bytes), crc32(bloom_bytes),
        body_off, meta_len, crc32(mv[:meta_len]),
        VERSION, flags, 0, MAGIC)
    footer = head[:FOOTER_CRC_SPAN] + struct.pack("<I", crc32(head[:FOOTER_CRC_SPAN])) + MAGIC
    parts.append(footer)
    return parts


def _message_metadata_len(mv: memoryview, key: str | None, at: int) -> int:
    """Bytes of an IPC message before its body: continuation, length, flatbuffer."""
    if len(mv) < 8:
        raise FormatError(key, at, "IPC message shorter than its 8-byte prefix")
    cont, length = struct.unpack_from("<Ii", mv, 0)
    if cont != 0xFFFFFFFF or length < 0 or 8 + length > len(mv):
        raise FormatError(key, at, "bad IPC message prefix")
    return 8 + length


def _section(mv: memoryview, off: int, length: int, crc: int, limit: int, key: str | None,
             what: str) -> memoryview:
    if off < HEADER.size or length < 0 or off + length > limit:
        raise FormatError(key, off, f"{what} section [{off}, {off + length}) outside the file")
    sec = mv[off: off + length]
    actual = crc32(sec)
    if actual != crc:
        raise ChecksumMismatch(key, off, f"crc32 of {what}", expected=crc, actual=actual)
    return sec


def decode(buf: pa.Buffer, key: str | None) -> Decoded:
    """Check header, footer and small sections; return zero-copy views over ``buf``."""
    mv = memoryview(buf)
    size = len(mv)
    if size < HEADER.size + FOOTER.size:
        raise FormatError(key, 0, f"file of {size} bytes is shorter than header + footer")
    magic, version, _flags = HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise FormatError(key, 0, f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FormatError(key, 4, f"unsupported batch format version {version}")
    foot_at = size - FOOTER.size
    f = FOOTER.unpack_from(mv, foot_at)
    if f[-1] != MAGIC:
        raise FormatError(key, size - 4, "bad footer magic")
    actual = crc32(mv[foot_at: foot_at + FOOTER_CRC_SPAN])
    if actual != f[-2]:
        raise ChecksumMismatch(key, foot_at, "crc32 of footer", expected=f[-2], actual=actual)
    (rows, nblocks, bloom_k, s_off, s_len, s_crc, i_off, i_len, i_crc, b_off, b_len, b_crc,
     body_off, meta_len, meta_crc, fversion, _ff, _fc, _m) = f
    if fversion != VERSION:
        raise FormatError(key, foot_at, f"unsupported footer version {fversion}")
    if nblocks > MAX_BLOCKS or nblocks > max(rows, 0) or (rows > 0 and nblocks == 0):
        raise FormatError(key, foot_at + 8, f"block count {nblocks} invalid for {rows} rows")
    if bloom_k > MAX_BLOOM_K:
        raise FormatError(key, foot_at + 12, f"bloom hash count {bloom_k} > {MAX_BLOOM_K}")
    schema_mv = _section(mv, s_off, s_len, s_crc, foot_at, key, "schema")
    index_mv = _section(mv, i_off, i_len, i_crc, foot_at, key, "index")
    bloom_mv = _section(mv, b_off, b_len, b_crc, foot_at, key, "bloom filter")
    if body_off < HEADER.size or body_off >= i_off or i_off > foot_at:
        raise FormatError(key, foot_at + 64, f"body offset {body_off} out of order")
    body_mv = mv[body_off: i_off]
    if _message_metadata_len(body_mv, key, body_off) != meta_len:
        raise FormatError(key, body_off, "body metadata length disagrees with the footer")
    _section(mv, body_off, meta_len, meta_crc, i_off, key, "body metadata")
    if (bloom_k and b_len < 8) or (b_len & (b_len - 1)):  # a power of two >= 8 bytes, or 0
        raise FormatError(key, b_off, f"bloom filter of {b_len} bytes with k={bloom_k}")
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(schema_mv))
        _check_schema(schema, key, s_off)
        body = pa.ipc.read_record_batch(buf.slice(body_off, i_off - body_off), schema)
        index = pa.ipc.read_record_batch(pa.py_buffer(index_mv),
                                         index_schema(schema.field("key").type))
    except (pa.ArrowException, ValueError, TypeError, IndexError) as e:
        if isinstance(e, FormatError):
            raise
        raise FormatError(key, body_off, f"Arrow IPC does not decode: {e}") from e
    if body.num_rows != rows:
        raise FormatError(key, body_off, f"body has {body.num_rows} rows, footer says {rows}")
    if index.num_rows != nblocks:
        raise FormatError(key, i_off, f"index has {index.num_rows} blocks, footer {nblocks}")
    try:
        index.validate(full=True)
    except pa.ArrowException as e:
        raise FormatError(key, i_off, f"index does not validate: {e}") from e
    row_start = index.column(0).to_numpy()
    if nblocks and (row_start[0] != 0 or np.any(np.diff(row_start.astype(np.int64)) <= 0)
                    or int(row_start[-1]) >= rows):
        raise FormatError(key, i_off, "block row starts are not strictly increasing from 0")
    layouts = column_layouts(body, buf.address, buf.size, key)
    return Decoded(schema, body, row_start.astype(np.int64), index.column(1), index.column(2),
                   index.column(3).to_numpy(), np.frombuffer(bloom_mv, dtype=np.uint8),
                   bloom_k, layouts)


def _check_schema(schema: pa.Schema, key: str | None, at: int) -> None:
    if schema.names != ["key", "val", "w"]:
        raise FormatError(key, at, f"columns {schema.names}, expected ['key', 'val', 'w']")
    if schema.field("key").type not in KEY_TYPES:
        raise FormatError(key, at, f"key type {schema.field('key').type} is not supported")
    if schema.field("val").type not in VAL_TYPES:
        raise FormatError(key, at, f"val type {schema.field('val').type} is not supported")
    if schema.field("w").type != pa.int64():
        raise FormatError(key, at, "w must be int64")
