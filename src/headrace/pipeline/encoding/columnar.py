"""Columnar queue entries: many rows of one table in one entry, as Arrow, decoded without a parse.

Why: a JSON entry is one row, parsed by Spark's JSON reader — about 6 µs per row on this
machine, most of a steady micro-batch's first stage, where Spark's own pipelines scan Parquet.
A columnar entry carries a whole Arrow record batch of one table: the queue source hands its
columns to Spark as they are (docs/formats/columnar-entry.md).

Layout: ``MAGIC`` (4 bytes, ``HRC1``: no JSON text starts with it) then an Arrow IPC stream —
a schema message whose metadata names the table (``headrace.table``), exactly one record batch,
the end-of-stream marker, which must be the entry's last 8 bytes. The schema is the table's
columns in order, with the declared types, optionally followed by ``__hr_w`` (int64, no nulls,
never 0: each row's Z-set weight; absent = every row weighs 1). IPC body compression is
refused: the batch file around the entries is compressed already, and a compressed body
declares its own decompressed size, which a hostile entry could make anything.

Decoding trusts nothing: the stream must parse, the schema must equal the table's (names and
types), the batch must pass Arrow's full validation (offsets in bounds, UTF-8, decimal
precision); every failure is a :class:`ColumnarEntryError` naming the table and field where one
is known. The decoded columns are zero-copy slices of the entry's bytes.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.encoding.types import parse_schema, spark_type
from headrace.pipeline.errors import ColumnarEntryError
from headrace.pipeline.names import W

MAGIC = b"HRC1"
TABLE_KEY = b"headrace.table"
ENTRY_BYTES = 4 << 20  # target size of one encoded entry (rows are split across entries)
MAX_ENTRY_BYTES = 64 << 20  # the largest columnar entry a reader accepts
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # IPC end-of-stream: continuation, length 0
_RECORD_BATCH = 3  # flatbuffer MessageHeader union tag of a RecordBatch (Message.fbs)


def encode(table: str, data: pa.Table | pa.RecordBatch, schema: str | pa.Schema | None = None,
           weights=None, entry_bytes: int = ENTRY_BYTES) -> list[bytes]:
    """``data``'s rows as columnar entries of ``table`` (split so that each entry holds about
    ``entry_bytes``). ``schema``: the table's declared schema, as given to ``read_queue`` (DDL
    or Arrow) — ``data`` is cast to it (a cast that would lose values raises); ``weights``: an
    int64 array of the rows' weights (None: 1)."""
    return [e for e, _ in encode_counted(table, data, schema, weights, entry_bytes)]


def encode_counted(table: str, data: pa.Table | pa.RecordBatch,
                   schema: str | pa.Schema | None = None, weights=None,
                   entry_bytes: int = ENTRY_BYTES) -> list[tuple[bytes, int]]:
    """:func:`encode`, each entry with its row count."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(schema, str):
        schema = parse_schema(schema, f"columnar entries of {table!r}")
    if schema is not None:
        missing = [f.name for f in schema if f.name not in data.column_names]
        if missing:
            raise InvalidInput(f"columnar entries of {table!r}: no column {missing[0]!r}")
        extra = [n for n in data.column_names if n not in schema.names]
        if extra:  # never dropped silently: a misspelt name would lose a column's values
            raise InvalidInput(f"columnar entries of {table!r}: column {extra[0]!r} is not "
                               f"one of the table's {schema.names}")
        data = data.select(schema.names).cast(pa.schema([pa.field(f.name, f.type)
                                                         for f in schema]))
    if weights is not None:
        w = pa.array(weights, pa.int64()) if not isinstance(weights, pa.ChunkedArray) \
            else weights.cast(pa.int64())
        if len(w) != data.num_rows:
            raise InvalidInput(f"columnar entries of {table!r}: {len(w)} weights for "
                               f"{data.num_rows} rows")
        if w.null_count or pc.any(pc.equal(w, 0)).as_py():
            raise InvalidInput(f"columnar entries of {table!r}: a weight is null or 0")
        data = data.append_column(W, w)
    data = data.replace_schema_metadata({TABLE_KEY: table.encode()})
    if data.num_rows == 0:
        return []
    per_row = max(1, data.nbytes // data.num_rows)
    step = max(1, entry_bytes // per_row)
    out = []
    for lo in range(0, data.num_rows, step):
        sink = pa.BufferOutputStream()
        sink.write(MAGIC)
        chunk = data.slice(lo, step).combine_chunks()
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write_table(chunk, max_chunksize=chunk.num_rows)
        out.append((sink.getvalue().to_pybytes(), chunk.num_rows))
    return out


def is_columnar(entries: pa.Array) -> np.ndarray:
    """Which of ``entries`` (binary) are columnar (vectorised: a look at 4 bytes each)."""
    if len(entries) == 0:
        return np.zeros(0, dtype=bool)
    head = pc.binary_slice(entries, 0, len(MAGIC))
    return pc.fill_null(pc.equal(head, pa.scalar(MAGIC, pa.binary())), False) \
        .to_numpy(zero_copy_only=False)


def decode(entry: bytes | pa.Buffer, tables: dict[str, pa.Schema],
           max_bytes: int = MAX_ENTRY_BYTES) -> tuple[str, pa.RecordBatch]:
    """(table, rows): the entry's rows with the table's columns then W (int64; 1 where the
    entry carries no weights). ``tables``: name -> declared schema of every table the reader
    knows. Raises :class:`ColumnarEntryError`."""
    buf = pa.py_buffer(entry)
    if buf.size > max_bytes:
        raise ColumnarEntryError(f"entry of {buf.size} bytes is larger than {max_bytes}")
    if buf.size < len(MAGIC) or buf[: len(MAGIC)].to_pybytes() != MAGIC:
        raise ColumnarEntryError(f"does not start with {MAGIC!r}")
    if buf.size < len(MAGIC) + len(_EOS) or buf[buf.size - len(_EOS):].to_pybytes() != _EOS:
        raise ColumnarEntryError("does not end with Arrow's end-of-stream marker (truncated?)")
    try:  # the messages between the magic and the end-of-stream marker
        reader = pa.ipc.MessageReader.open_stream(
            pa.BufferReader(buf[len(MAGIC): buf.size - len(_EOS)]))
        first = reader.read_next_message()
        if first.type != "schema":  # checked first: pyarrow reads any message as a schema,
            raise ValueError(f"a {first.type} message")  # and crashes on some (fuzzed)
        schema = pa.ipc.read_schema(first)
        schema.names  # noqa: B018 - names that are not UTF-8 raise here, not later
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds on hostile bytes
        raise ColumnarEntryError(f"no Arrow schema message: {_short(e)}") from None
    table = (schema.metadata or {}).get(TABLE_KEY, b"").decode("utf-8", "replace")
    if table not in tables:
        raise ColumnarEntryError(f"unknown table {table!r}; the reader knows {sorted(tables)}",
                                 table or None, "table")
    expected = tables[table]
    _check_schema(schema, expected, table)
    try:
        message = reader.read_next_message()
    except Exception as e:  # noqa: BLE001
        raise ColumnarEntryError(f"no record batch message: {_short(e)}", table) from None
    if message.type != "record batch":
        raise ColumnarEntryError(f"a {message.type} message where the record batch belongs",
                                 table)
    if _compressed(message.metadata):
        raise ColumnarEntryError("the record batch is IPC-compressed (refused: the batch file "
                                 "is compressed already)", table)
    try:
        rb = pa.ipc.read_record_batch(message, schema)
        rb.validate(full=True)
    except Exception as e:  # noqa: BLE001
        raise ColumnarEntryError(f"record batch does not validate: {_short(e)}", table) \
            from None
    try:
        extra = reader.read_next_message()
    except StopIteration:
        extra = None
    except Exception as e:  # noqa: BLE001
        raise ColumnarEntryError(f"bytes after the record batch: {_short(e)}", table) from None
    if extra is not None:
        raise ColumnarEntryError(f"a second message ({extra.type}) after the record batch: "
                                 "an entry holds exactly one", table)
    if W in rb.schema.names:
        w = rb.column(W)
        if w.null_count:
            raise ColumnarEntryError("a row's weight is null", table, W)
        if len(w) and not pc.all(pc.not_equal(w, 0)).as_py():
            raise ColumnarEntryError("a row's weight is 0", table, W)
    else:
        rb = rb.append_column(W, pa.array(np.ones(rb.num_rows, dtype=np.int64)))
    return table, rb


def _check_schema(schema: pa.Schema, expected: pa.Schema, table: str) -> None:
    names = schema.names
    want = expected.names + ([W] if W in names else [])
    if names != want:
        extra = [n for n in names if n not in want]
        missing = [n for n in want if n not in names]
        field = (missing or extra or [None])[0]
        what = (f"missing column {field!r}" if missing else
                f"column {field!r} the table does not declare" if extra else
                f"columns in the order {names}, the table's is {want}")
        raise ColumnarEntryError(what, table, field)
    for f in schema:
        t = expected.field(f.name).type if f.name != W else pa.int64()
        if f.type != t:
            raise ColumnarEntryError(f"column of type {f.type}, declared {t}", table, f.name)


def _compressed(meta: pa.Buffer) -> bool:
    """Whether a record batch message's flatbuffer metadata has a ``compression`` field
    (Message.header -> RecordBatch field 3). Bounds-checked: malformed metadata counts as
    compressed, so the caller refuses it."""
    b = meta.to_pybytes()

    def u32(at: int) -> int:
        if at < 0 or at + 4 > len(b):
            raise IndexError(at)
        return struct.unpack_from("<I", b, at)[0]

    def field(table: int, i: int) -> int:  # absolute position of field i, 0 when absent
        vt = table - struct.unpack_from("<i", b, table)[0]
        if vt < 0 or vt + 4 > len(b):
            raise IndexError(vt)
        size = struct.unpack_from("<H", b, vt)[0]
        if 4 + 2 * i + 2 > size or vt + 4 + 2 * i + 2 > len(b):
            return 0
        off = struct.unpack_from("<H", b, vt + 4 + 2 * i)[0]
        return table + off if off else 0

    try:
        msg = u32(0)
        u32(msg)
        kind = field(msg, 1)
        header = field(msg, 2)
        if not kind or not header or kind >= len(b) or b[kind] != _RECORD_BATCH:
            return True
        rb = header + u32(header)
        u32(rb)
        return field(rb, 3) != 0
    except (IndexError, struct.error):
        return True


def _short(e: Exception) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


# -- the queue source's side: columnar entries become typed rows as the batch is read ----------

def struct_columns(tables: list[tuple[str, str, pa.Schema]]) -> pa.Schema:
    """The source's extra columns: per (column name, table, declared schema) a struct of the
    table's columns then W, its metadata naming the table."""
    return pa.schema([pa.field(col, pa.struct([pa.field(f.name, f.type) for f in schema]
                                              + [pa.field(W, pa.int64())]),
                               metadata={TABLE_KEY: table.encode()})
                      for col, table, schema in tables])


def columns_option(columns: pa.Schema) -> str:
    """``columns`` as a data source option value (base64 of its Arrow IPC form)."""
    import base64

    return base64.b64encode(columns.serialize().to_pybytes()).decode("ascii")


def parse_columns_option(value: str) -> pa.Schema:
    import base64

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value.encode("ascii"))))


def columns_ddl(columns: pa.Schema) -> str:
    """Spark DDL of the struct columns (the source's schema beyond its entry columns)."""
    return ", ".join(f"`{f.name}` {struct_ddl(f)}" for f in columns)


def struct_ddl(column: pa.Field) -> str:
    """The Spark type of one struct column."""
    return "struct<" + ", ".join(f"`{c.name}`: {spark_type(c.type)}" for c in column.type) + ">"


def explode(rb: pa.RecordBatch, columns: pa.Schema) -> list[pa.RecordBatch]:
    """The entries ``rb`` (a column ``entry``) with ``columns`` appended: each columnar entry
    of a table in ``columns`` replaced by its rows (``entry`` NULL, the table's struct set);
    every other entry — JSON, or a columnar entry that does not decode — kept as it is, its
    structs NULL, for the decoder to parse or to report."""
    flags = is_columnar(rb.column("entry"))
    if not flags.any():
        return [_with_structs(rb, columns, rb.num_rows)]
    tables = {f.metadata[TABLE_KEY].decode(): (i, pa.schema(list(f.type)[:-1]))
              for i, f in enumerate(columns)}
    schemas = {t: s for t, (_, s) in tables.items()}
    entries = rb.column("entry")
    out, start = [], 0
    for i in np.flatnonzero(flags).tolist():
        try:
            table, rows = decode(entries[i].as_buffer(), schemas)
        except ColumnarEntryError:
            continue  # kept as a plain entry: the decoder reports it as bad
        if i > start:
            out.append(_with_structs(rb.slice(start, i - start), columns, i - start))
        start = i + 1
        n = rows.num_rows
        if n == 0:
            continue
        # the entry's other columns repeated per row; its bytes not (they are the rows now)
        base = pa.RecordBatch.from_arrays(
            [pa.nulls(n, f.type) if f.name == "entry" else pa.repeat(rb.column(j)[i], n)
             for j, f in enumerate(rb.schema)], schema=rb.schema)
        k = tables[table][0]
        struct = pa.StructArray.from_arrays(
            [rows.column(j) for j in range(rows.num_columns)], fields=list(columns[k].type))
        out.append(_with_structs(base, columns, n, (k, struct)))
    if start < rb.num_rows:
        out.append(_with_structs(rb.slice(start), columns, rb.num_rows - start))
    return out


def _with_structs(rb: pa.RecordBatch, columns: pa.Schema, n: int,
                  filled: tuple[int, pa.Array] | None = None) -> pa.RecordBatch:
    arrays = list(rb.columns)
    for k, f in enumerate(columns):
        arrays.append(filled[1] if filled is not None and filled[0] == k
                      else pa.nulls(n, f.type))
    fields = list(rb.schema) + [pa.field(f.name, f.type) for f in columns]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
