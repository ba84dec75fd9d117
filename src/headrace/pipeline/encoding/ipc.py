"""Arrow IPC bytes of schemas and tables: how specs and small outputs travel between the driver
and Spark tasks (pickled plain values, schemas as IPC)."""

from __future__ import annotations

import pyarrow as pa


def schema_to_bytes(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def schema_from_bytes(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def table_to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def table_from_ipc(data) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
