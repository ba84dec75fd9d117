"""RowCodec: columns <-> one string per row, vectorised, exact.

Spine keys and values are single columns; operators key by several columns and keep whole rows
as state. RowCodec joins the columns' text forms with a unit separator (0x1F) in one Arrow
kernel call and splits them back the same way. Casting int64/float64/bool/string to text and
back is exact in Arrow (floats use the shortest round-trip form), so a decoded row equals the
encoded one. Nulls are encoded as a lone NUL character. A string that itself contains 0x1F or
is a lone NUL would be ambiguous, so it is refused with InvalidInput.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput

SEP = "\x1f"
NULL = "\x00"
SUPPORTED = (pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_())


class RowCodec:
    def __init__(self, schema: pa.Schema, columns: list[str]):
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise InvalidInput(f"unknown columns {missing}; have {schema.names}")
        if not columns:
            raise InvalidInput("a row codec needs at least one column")
        self.columns = list(columns)
        self.types = [schema.field(c).type for c in columns]
        for c, t in zip(self.columns, self.types, strict=True):
            if t not in SUPPORTED:
                raise InvalidInput(f"column {c!r} has type {t}; operators support {SUPPORTED}")
        self.schema = pa.schema([pa.field(c, t) for c, t in zip(self.columns, self.types,
                                                                  strict=True)])

    def encode(self, table: pa.Table) -> pa.Array:
        parts = []
        for c, t in zip(self.columns, self.types, strict=True):
            col = table.column(c)
            if t == pa.string():
                bad = pc.any(pc.or_(pc.match_substring(col, SEP), pc.equal(col, NULL))).as_py()
                if bad:
                    raise InvalidInput(f"column {c!r} holds a value with the reserved "
                                       "character 0x1F or a lone NUL")
                parts.append(col)
            else:
                parts.append(pc.cast(col, pa.string()))
        if len(parts) == 1:
            return pc.fill_null(parts[0], NULL).combine_chunks()
        joined = pc.binary_join_element_wise(*parts, SEP, null_handling="replace",
                                             null_replacement=NULL)
        return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined

    def decode(self, encoded: pa.Array | pa.ChunkedArray) -> pa.Table:
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        if encoded.type != pa.string():
            encoded = pc.cast(encoded, pa.string())
        n = len(encoded)
        k = len(self.columns)
        if k == 1:
            fields = [encoded]
        else:
            flat = pc.list_flatten(pc.split_pattern(encoded, SEP))
            if len(flat) != n * k:
                raise InvalidInput(f"encoded rows do not all have {k} fields")
            idx = pa.array(range(n), pa.int64())
            fields = [pc.take(flat, pc.add(pc.multiply(idx, k), j)) for j in range(k)]
        cols = []
        for f, t in zip(fields, self.types, strict=True):
            is_null = pc.equal(f, NULL)
            f = pc.if_else(is_null, pa.scalar(None, pa.string()), f)
            cols.append(f if t == pa.string() else pc.cast(f, t))
        return pa.Table.from_arrays(cols, schema=self.schema)
