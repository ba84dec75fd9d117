"""Binary-safe row encoding: N Arrow columns <-> one ``binary`` value per row, vectorised.

State keys and values are single binary columns; operators key by several columns and keep whole
rows. Every value of a supported type round-trips exactly and no byte is reserved, so strings
holding NUL or 0x1F work like any other.

Layout of one row: for each column in order, a flag byte (0 = NULL, 1 = value), then the body:

- fixed-width types (ints, floats, bool, date, time, timestamp, duration, decimal): the value's
  bytes big-endian, sign bit flipped for signed ints and decimals, floats bit-flipped the usual
  way (negative: all bits; positive: the sign bit) so that ``memcmp`` order is value order; a
  NULL writes the same number of zero bytes;
- strings and binaries: a 4-byte big-endian length, then the bytes (NULL: length 0).

So encodings of equal rows are equal bytes, fixed-width columns sort as their values, and a
prefix made of fixed-width columns (a window start, say) sorts as those columns do.

With ``normalize=True`` float columns are first normalised as Spark does for grouping and join
keys: ``-0.0`` becomes ``0.0`` and every NaN the one canonical NaN, so ``0.0``/``-0.0`` are one
key and NaN keys are equal. ``encode_sortable`` is the single-column variant without a length
prefix, whose ``memcmp`` order is Spark's order (min/max state).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import FormatError, InvalidInput

_MAX_BINARY = 2**31 - 1


def _fixed_width(t: pa.DataType) -> int | None:
    """Bytes per value of a supported fixed-width type, None for variable width."""
    if pa.types.is_boolean(t):
        return 1
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)
            or pa.types.is_decimal(t)):
        if pa.types.is_floating(t) and t == pa.float16():
            return None
        return t.bit_width // 8
    return None


def _is_var(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def check_type(t: pa.DataType, where: str) -> None:
    """Refuse a column type the codec cannot encode exactly, naming the column."""
    if _fixed_width(t) is None and not _is_var(t):
        raise InvalidInput(f"{where} has type {t}, which operator state cannot hold; supported: "
                           "integers, float32/64, bool, string, binary, date, time, timestamp, "
                           "duration, decimal")


def _int_kind(t: pa.DataType) -> str:
    """numpy kind of the stored integer: 'i' signed, 'u' unsigned, 'f' float, 'd' decimal."""
    if pa.types.is_floating(t):
        return "f"
    if pa.types.is_decimal(t):
        return "d"
    if pa.types.is_unsigned_integer(t) or pa.types.is_boolean(t):
        return "u"
    return "i"  # signed ints, dates, times, timestamps, durations


def _valid_mask(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def normalize_floats(arr: pa.Array) -> pa.Array:
    """Spark's key normalisation: -0.0 -> 0.0 and every NaN -> one NaN (NULLs kept)."""
    if not pa.types.is_floating(arr.type):
        return arr
    v = np.array(arr.fill_null(0).to_numpy(zero_copy_only=False), copy=True)
    v[v == 0] = 0.0
    v[np.isnan(v)] = np.nan
    return pa.array(v, type=arr.type, mask=~_valid_mask(arr))


def _fixed_body(arr: pa.Array, normalize: bool) -> np.ndarray:
    """(n, width) uint8: order-preserving big-endian bodies, zero bytes for NULLs."""
    t = arr.type
    n = len(arr)
    width = _fixed_width(t)
    valid = _valid_mask(arr)
    if pa.types.is_boolean(t):
        body = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), np.uint8)
        return body.reshape(n, 1)
    data = arr.buffers()[1]
    raw = np.frombuffer(data, dtype=np.uint8, count=(arr.offset + n) * width)
    raw = raw[arr.offset * width:].reshape(n, width)
    kind = _int_kind(t)
    if kind == "d":
        body = raw[:, ::-1].copy()  # little-endian two's complement -> big-endian
        body[:, 0] ^= 0x80
    else:
        ubits = np.dtype(f"<u{width}")
        bits = raw.copy().view(ubits).reshape(n)
        sign = ubits.type(1) << ubits.type(8 * width - 1)
        if kind == "f":
            if normalize:
                f = bits.view(np.dtype(f"<f{width}"))
                f = np.where(f == 0, np.zeros(1, f.dtype), f)
                f = np.where(np.isnan(f), np.full(1, np.nan, f.dtype), f)
                bits = f.view(ubits)
            neg = (bits & sign) != 0
            bits = np.where(neg, ~bits, bits | sign)
        elif kind == "i":
            bits = bits ^ sign
        body = bits.astype(np.dtype(f">u{width}")).view(np.uint8).reshape(n, width)
    body = np.ascontiguousarray(body)
    body[~valid] = 0
    return body


def _fixed_array(body: np.ndarray, valid: np.ndarray, t: pa.DataType) -> pa.Array:
    """Inverse of _fixed_body."""
    n, width = body.shape
    nulls = int(n - valid.sum())
    bitmap = pa.array(valid, pa.bool_()).buffers()[1] if nulls else None
    if pa.types.is_boolean(t):
        values = pa.array(body[:, 0] != 0, pa.bool_()).buffers()[1]
        return pa.Array.from_buffers(t, n, [bitmap, values], null_count=nulls)
    kind = _int_kind(t)
    if kind == "d":
        b = body.copy()
        b[:, 0] ^= 0x80
        le = np.ascontiguousarray(b[:, ::-1])
    else:
        ubits = np.dtype(f"<u{width}")
        bits = np.ascontiguousarray(body).view(np.dtype(f">u{width}")).reshape(n).astype(ubits)
        sign = ubits.type(1) << ubits.type(8 * width - 1)
        if kind == "f":
            positive = (bits & sign) != 0
            bits = np.where(positive, bits ^ sign, ~bits)
        elif kind == "i":
            bits = bits ^ sign
        le = bits.view(np.uint8)
    return pa.Array.from_buffers(t, n, [bitmap, pa.py_buffer(le.tobytes())], null_count=nulls)


def _var_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths, data) of a string/binary array; NULL rows have length 0."""
    n = len(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32,
                         count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    data = (np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None
            else np.zeros(0, np.uint8))
    lengths = np.diff(offs)
    lengths[~_valid_mask(arr)] = 0
    return offs[:-1], lengths, data


def _gather_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices starts[i] .. starts[i]+lengths[i]-1, concatenated over i (no Python loop)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.cumsum(lengths) - lengths
    within = np.arange(total, dtype=np.int64) - np.repeat(first, lengths)
    return np.repeat(starts, lengths) + within


def _as_array(col) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _binary_parts(encoded) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row starts, row ends, data) of a binary array of encodings."""
    arr = _as_array(encoded)
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise InvalidInput(f"encoded rows must be binary, got {arr.type}")
    if arr.null_count:
        raise FormatError(None, None, "an encoded row is NULL")
    starts, lengths, data = _var_parts(arr)
    return starts, starts + lengths, data


_SAME = {(pa.large_string(), pa.string()), (pa.string(), pa.large_string()),
         (pa.large_binary(), pa.binary()), (pa.binary(), pa.large_binary())}


def _conform(arr: pa.Array, f: pa.Field) -> pa.Array:
    """The column as the codec's type: large/small string and binary offsets are the same
    values (Arrow batches from Spark may use either); any other difference is refused."""
    if arr.type == f.type:
        return arr
    if (arr.type, f.type) in _SAME:
        return _as_array(pc.cast(arr, f.type))
    raise InvalidInput(f"column {f.name!r} is {arr.type}, expected {f.type}")


def _fixed_binary(matrix: np.ndarray) -> pa.Array:
    """An (n, k) byte matrix as a binary array of n values of k bytes (one copy)."""
    n, k = matrix.shape
    offsets = np.arange(n + 1, dtype=np.int64) * k
    return _make_binary(offsets, np.ascontiguousarray(matrix).reshape(-1))


def _make_binary(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    if offsets[-1] > _MAX_BINARY:
        raise InvalidInput(f"encoded batch is {offsets[-1]} bytes; split it below 2 GiB")
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets.astype(np.int32).tobytes()),
                                  pa.py_buffer(data.tobytes())])


class RowCodec:
    """Encode ``columns`` of a schema into one binary value per row, and back."""

    def __init__(self, schema: pa.Schema, columns: Sequence[str] | None = None, *,
                 normalize: bool = False):
        columns = list(schema.names if columns is None else columns)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise InvalidInput(f"unknown columns {missing}; have {schema.names}")
        self.columns = columns
        self.normalize = normalize
        self.schema = pa.schema([schema.field(c) for c in columns])
        for f in self.schema:
            check_type(f.type, f"column {f.name!r}")

    def encode(self, table: pa.Table | pa.RecordBatch) -> pa.Array:
        """One binary value per row of ``table`` (only this codec's columns are read)."""
        n = table.num_rows
        pieces: list[pa.Array] = []  # fixed-width blocks and variable-width data, in order
        block: list[np.ndarray] = []  # (n, k) byte matrices of the current fixed block
        total = 0
        for f in self.schema:
            arr = _conform(_as_array(table.column(f.name)), f)
            valid = _valid_mask(arr).astype(np.uint8).reshape(n, 1)
            if _fixed_width(f.type) is not None:
                block += [valid, _fixed_body(arr, self.normalize)]
                total += n * (1 + _fixed_width(f.type))
                continue
            _, lengths, _ = _var_parts(arr)
            block += [valid, lengths.astype(">u4").view(np.uint8).reshape(n, 4)]
            pieces.append(_fixed_binary(np.hstack(block)))
            block = []
            total += int(lengths.sum()) + 5 * n
            if total > _MAX_BINARY:
                raise InvalidInput(f"encoded batch is over {_MAX_BINARY} bytes; split it")
            pieces.append(_as_array(pc.cast(arr, pa.binary()).fill_null(b"")))
        if block or not pieces:
            pieces.append(_fixed_binary(np.hstack(block) if block
                                        else np.zeros((n, 0), np.uint8)))
        if len(pieces) == 1:
            return pieces[0]
        return _as_array(pc.binary_join_element_wise(*pieces, pa.scalar(b"", pa.binary())))

    def decode(self, encoded: pa.Array | pa.ChunkedArray) -> pa.Table:
        """The columns back from their encodings; a malformed encoding raises FormatError."""
        row_start, row_end, data = _binary_parts(encoded)
        n = len(row_start)
        cur = row_start.copy()
        cols = []
        for f in self.schema:
            _need(cur, 1, row_end, f.name, "flag")
            flags = data[cur]
            if n and flags.max(initial=0) > 1:
                bad = int(np.argmax(flags > 1))
                raise FormatError(None, int(cur[bad] - row_start[bad]),
                                  f"row {bad}: column {f.name!r} has NULL flag {flags[bad]}")
            valid = flags == 1
            cur = cur + 1
            w = _fixed_width(f.type)
            if w is not None:
                _need(cur, w, row_end, f.name, "value")
                body = data[cur[:, None] + np.arange(w)] if n else np.zeros((0, w), np.uint8)
                cols.append(_fixed_array(body, valid, f.type))
                cur = cur + w
            else:
                _need(cur, 4, row_end, f.name, "length")
                lb = data[cur[:, None] + np.arange(4)] if n else np.zeros((0, 4), np.uint8)
                lengths = np.ascontiguousarray(lb).view(">u4").reshape(n).astype(np.int64)
                cur = cur + 4
                _need(cur, lengths, row_end, f.name, "bytes")
                cols.append(_var_array(f.type, valid, data, cur, lengths))
                cur = cur + lengths
        if np.any(cur != row_end):
            bad = int(np.argmax(cur != row_end))
            raise FormatError(None, int(cur[bad] - row_start[bad]),
                              f"row {bad}: {int(row_end[bad] - cur[bad])} trailing bytes")
        return pa.Table.from_arrays(cols, schema=self.schema)


def _need(cur: np.ndarray, size, row_end: np.ndarray, name: str, what: str) -> None:
    short = cur + size > row_end
    if np.any(short):
        bad = int(np.argmax(short))
        raise FormatError(None, None, f"row {bad}: encoding ends inside column {name!r} ({what})")


def _var_array(t: pa.DataType, valid: np.ndarray, data: np.ndarray, starts: np.ndarray,
               lengths: np.ndarray) -> pa.Array:
    n = len(starts)
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    offs = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offs[1:])
    if not large and offs[-1] > _MAX_BINARY:
        raise InvalidInput(f"decoded column is {offs[-1]} bytes; split the batch")
    body = data[_gather_ranges(starts, lengths)]
    nulls = int(n - valid.sum())
    bitmap = pa.array(valid, pa.bool_()).buffers()[1] if nulls else None
    arr = pa.Array.from_buffers(t, n, [bitmap, pa.py_buffer(
        offs.astype(np.int64 if large else np.int32).tobytes()), pa.py_buffer(body.tobytes())],
        null_count=nulls)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid as e:
            raise FormatError(None, None, f"a decoded string is not UTF-8: {e}") from e
    return arr


def encode_sortable(arr: pa.Array | pa.ChunkedArray, *, normalize_nan: bool = True) -> pa.Array:
    """One column -> binary whose ``memcmp`` order is Spark's value order (NULL first).

    No length prefix (one column), so strings and binaries compare by their bytes as Spark does.
    Every NaN maps to one NaN, which sorts above +inf as in Spark; -0.0 stays below 0.0.
    """
    arr = _as_array(arr)
    check_type(arr.type, "a min/max column")
    n = len(arr)
    valid = _valid_mask(arr)
    w = _fixed_width(arr.type)
    if w is not None:
        if normalize_nan and pa.types.is_floating(arr.type):
            v = arr.fill_null(0).to_numpy(zero_copy_only=False)
            if np.isnan(v).any():
                v = np.where(np.isnan(v), np.full(1, np.nan, v.dtype), v)
                arr = pa.array(v, type=arr.type, mask=~valid)
        body = _fixed_body(arr, normalize=False)
        out = np.concatenate([valid.astype(np.uint8).reshape(n, 1), body], axis=1)
        offsets = np.arange(n + 1, dtype=np.int64) * (1 + w)
        return _make_binary(offsets, out.reshape(-1))
    starts, lengths, data = _var_parts(arr)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths + 1, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)
    out[offsets[:-1]] = valid
    out[_gather_ranges(offsets[:-1] + 1, lengths)] = data[_gather_ranges(starts, lengths)]
    return _make_binary(offsets, out)


def decode_sortable(encoded: pa.Array | pa.ChunkedArray, t: pa.DataType) -> pa.Array:
    """Inverse of :func:`encode_sortable` for a column of type ``t`` (a NULL encoding, as an
    absent min, decodes to NULL)."""
    encoded = _as_array(encoded)
    if encoded.null_count:
        check_type(t, "a min/max column")
        null_value = b"\x00" * (1 + (_fixed_width(t) or 0))
        encoded = _as_array(pc.fill_null(encoded, pa.scalar(null_value, encoded.type)))
    row_start, row_end, data = _binary_parts(encoded)
    n = len(row_start)
    lengths = row_end - row_start
    if np.any(lengths < 1):
        raise FormatError(None, 0, "an encoded value is empty (no NULL flag)")
    flags = data[row_start]
    if n and flags.max(initial=0) > 1:
        raise FormatError(None, 0, f"NULL flag {int(flags.max())} is not 0 or 1")
    valid = flags == 1
    w = _fixed_width(t)
    if w is not None:
        if np.any(lengths != 1 + w):
            raise FormatError(None, 1, f"an encoded {t} value is not {w} bytes")
        body = data[(row_start + 1)[:, None] + np.arange(w)] if n else np.zeros((0, w), np.uint8)
        return _fixed_array(body, valid, t)
    return _var_array(t, valid, data, row_start + 1, lengths - 1)


def concat_binary(*arrays: pa.Array | pa.ChunkedArray | bytes) -> pa.Array:
    """Row-wise concatenation of binary arrays (and constant byte prefixes)."""
    parts = [pa.scalar(a, pa.binary()) if isinstance(a, bytes)
             else pc.cast(_as_array(a), pa.binary()) for a in arrays]
    out = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))
    return _as_array(out)


def decode_columns_at(codec: RowCodec, offset, keys: pa.Array) -> pa.Table:
    """The columns of ``codec`` encoded inside each key of ``keys`` at byte ``offset`` (a number,
    or a function of (data, starts, ends) giving one per key), decoded: the bucket columns of
    a state key (operators.kernel.Rebucketable). A key too short for them is a FormatError."""
    starts, ends, data = _binary_parts(keys)
    off = offset(data, starts, ends) if callable(offset) else offset
    lo = starts + (off if isinstance(off, np.ndarray) else np.int64(off))
    cur = lo.copy()
    for f in codec.schema:  # the encoding's end: flag byte, then fixed or 4-byte length + data
        w = _fixed_width(f.type)
        _check_inside(cur + 1 + (4 if w is None else w), ends, starts, f.name)
        if w is None:
            lb = data[(cur + 1)[:, None] + np.arange(4)]
            cur = cur + 5 + np.ascontiguousarray(lb).view(">u4").reshape(len(cur)).astype(
                np.int64)
            _check_inside(cur, ends, starts, f.name)
        else:
            cur = cur + 1 + w
    lengths = cur - lo
    offsets = np.zeros(len(lo) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    sliced = _make_binary(offsets, data[_gather_ranges(lo, lengths)])
    return codec.decode(sliced)


def _check_inside(end: np.ndarray, ends: np.ndarray, starts: np.ndarray, name: str) -> None:
    short = end > ends
    if np.any(short):
        i = int(np.argmax(short))
        raise FormatError(None, int(ends[i] - starts[i]), f"state key {i} ends inside bucket "
                                                          f"column {name!r}")
