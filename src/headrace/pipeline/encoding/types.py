"""Arrow and Spark SQL types: which types the pipeline carries, and how they are written.

Schemas come from the user as DDL text (``"a long, b decimal(10,2)"``) or Arrow, and go to Spark
as DDL; a Spark expression's result type comes back as Arrow. Every check happens when the
pipeline is defined, so a type the pipeline cannot carry never reaches a micro-batch.
"""

from __future__ import annotations

import re

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline.names import PREFIX, W

TIMESTAMP = pa.timestamp("us", tz="UTC")  # Spark's timestamp: UTC microseconds
_DDL_TYPES = {"long": pa.int64(), "bigint": pa.int64(), "int": pa.int32(),
              "integer": pa.int32(), "double": pa.float64(), "float": pa.float32(),
              "string": pa.string(), "boolean": pa.bool_(), "binary": pa.binary(),
              "timestamp": TIMESTAMP, "date": pa.date32()}
_DECIMAL = re.compile(r"^decimal\((\d+)\s*,\s*(\d+)\)$")


def check_names(names: list[str], where: str) -> None:
    """User column names: any name works except the engine's reserved prefix."""
    for n in names:
        if n.startswith(PREFIX):
            raise InvalidInput(f"{where}: column {n!r} uses the reserved prefix {PREFIX!r}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidInput(f"{where}: duplicate column names {dup}")


def _ddl_type(text: str, where: str) -> pa.DataType:
    t = text.lower().replace(" ", "")
    if t in _DDL_TYPES:
        return _DDL_TYPES[t]
    m = _DECIMAL.match(t)
    if m and 1 <= int(m.group(1)) <= 38 and int(m.group(2)) <= int(m.group(1)):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    raise InvalidInput(f"{where}: type {text!r} is not one of {sorted(_DDL_TYPES)} or "
                       "decimal(p,s) with p <= 38")


def parse_schema(spec: str | pa.Schema, where: str = "schema") -> pa.Schema:
    """'a long, b decimal(10,2)' or an Arrow schema -> Arrow schema of the supported types."""
    if isinstance(spec, pa.Schema):
        schema = spec
        for f in schema:
            spark_type(f.type, f"{where} column {f.name!r}")
    else:
        fields = []
        for part in re.split(r",(?![^()]*\))", spec):  # commas outside decimal(p,s)
            bits = part.split(None, 1)
            if len(bits) != 2:
                raise InvalidInput(f"{where}: bad column spec {part.strip()!r}: want 'name type'")
            fields.append(pa.field(bits[0].strip("`"), _ddl_type(bits[1], where)))
        schema = pa.schema(fields)
    check_names(schema.names, where)
    return schema


def spark_type(t: pa.DataType, where: str = "column") -> str:
    """The Spark SQL type name of an Arrow type the pipeline carries."""
    if t == pa.int64():
        return "bigint"
    if t == pa.int32():
        return "int"
    if t == pa.float64():
        return "double"
    if t == pa.float32():
        return "float"
    if t in (pa.string(), pa.large_string()):
        return "string"
    if t == pa.bool_():
        return "boolean"
    if t in (pa.binary(), pa.large_binary()):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if t == pa.date32():
        return "date"
    if pa.types.is_decimal128(t):
        return f"decimal({t.precision},{t.scale})"
    raise InvalidInput(f"{where}: type {t} is not carried by the pipeline (long, int, double, "
                       "float, string, boolean, binary, timestamp, date, decimal(p,s))")


def spark_ddl(schema: pa.Schema) -> str:
    return ", ".join(f"`{f.name}` {spark_type(f.type, f'column {f.name!r}')}" for f in schema)


def arrow_schema(struct, where: str) -> pa.Schema:
    """A Spark StructType (an expression's result) -> the Arrow schema the pipeline carries."""
    from pyspark.sql import types as T

    simple = {T.LongType: pa.int64(), T.IntegerType: pa.int32(), T.DoubleType: pa.float64(),
              T.FloatType: pa.float32(), T.StringType: pa.string(), T.BooleanType: pa.bool_(),
              T.BinaryType: pa.binary(), T.TimestampType: TIMESTAMP, T.DateType: pa.date32()}
    fields = []
    for f in struct.fields:
        t = simple.get(type(f.dataType))
        if t is None and isinstance(f.dataType, T.DecimalType):
            t = pa.decimal128(f.dataType.precision, f.dataType.scale)
        if t is None:
            raise InvalidInput(f"{where}: column {f.name!r} would be {f.dataType.simpleString()}"
                               ", a type the pipeline does not carry; cast it (long, int, "
                               "double, float, string, boolean, binary, timestamp, date, "
                               "decimal)")
        fields.append(pa.field(f.name, t))
    schema = pa.schema(fields)
    check_names(schema.names, where)
    return schema


def weighted_ddl(schema: pa.Schema) -> str:
    """The DDL of a frame's columns plus the weight (for analysing steps on no rows)."""
    return (spark_ddl(schema) + ", " if len(schema) else "") + f"`{W}` bigint"
