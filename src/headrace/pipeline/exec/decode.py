"""Queue entries -> typed rows per table, with every bad entry caught, never coerced.

An entry is a JSON object ``{"table": T, "w": ±n, <the table's columns>}`` (``w`` defaults to
1), or a columnar entry (columnar.py: an Arrow record batch of one table's rows) that the queue
source has already turned into typed rows — their table's struct column ``{PREFIX}c{i}`` is set
and ``entry`` is NULL, and no parse runs. A JSON entry is *bad* when it is larger than
``max_entry_bytes``, not a JSON object, names no known table (a missing ``table`` field names
none), lacks one of its table's columns (unless the table reads missing fields as NULL:
``missing_fields="null"``; an explicit ``null`` is NULL either way), holds a value of the wrong
type (Spark's ``from_json`` with the table's own schema flags it: the value is never turned into
NULL silently), or has a weight that is 0 or not an integer; a columnar entry is bad when it
does not decode (it then reaches the decoder as a plain entry). Good rows flow to the operators.
Every entry also passes :func:`entries_task`, as a row of nulls unless it is bad (so the task
counts the batch's entries without a Spark aggregate, which would cost a stage), and the task
names why each bad one was refused (a Python look at each bad entry: they are the exception, not
the bulk) and either reports them (``on_bad_entry="fail"``: the batch stops before anything is
committed, the error names queue sequence, entry index, table and field) or writes them to the
pipeline's dead-letter shard (``"dead_letter"``: raw entry, reason, position; counted in the
batch metrics).
"""

from __future__ import annotations

import json
import pickle
from functools import reduce

import numpy as np
import pyarrow as pa

from headrace.pipeline.encoding import columnar
from headrace.pipeline.encoding.ipc import schema_from_bytes, table_to_ipc
from headrace.pipeline.encoding.types import spark_ddl
from headrace.pipeline.exec.control import CONTROL_SCHEMA, control_rows
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.plan.nodes import SourceTable

CORRUPT = f"{PREFIX}corrupt"
UNION = f"{PREFIX}union"
MAX_ENTRY_BYTES = 1 << 20
DEAD_LETTER_SCHEMA = pa.schema([("queue", pa.string()), ("sequence", pa.int64()),
                                ("index", pa.int32()), ("table", pa.string()),
                                ("field", pa.string()), ("reason", pa.string()),
                                ("entry", pa.binary())])
ENTRY_COLUMNS = ("queue", "sequence", "index", "entry")  # a micro-batch's input rows
ENTRY_DDL = "queue string, sequence long, index int, entry binary"
EXAMPLES = 5  # bad entries described in full per task (fail mode)
_PERMISSIVE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
# the strings Spark's JSON parser reads as a float or double (allowNonNumericNumbers)
_NON_NUMERIC = {"NaN", "Infinity", "+Infinity", "-Infinity", "+INF", "-INF"}


class Decoder:
    """The Spark expressions that split a micro-batch's entries into tables, built once per
    pipeline: building them costs hundreds of Python<->JVM calls, and Columns are unresolved
    expressions that apply to every batch's DataFrame alike.

    ``parse`` runs one projection over the entries — each entry's JSON is parsed once (twice for
    a table with a column another table declares with another type), into the struct of its
    own table (``when``: the other tables' structs stay NULL) — and its result is what the job
    persists; ``split`` then only filters and selects that persisted data."""

    def __init__(self, sources: list[SourceTable], max_entry_bytes: int = MAX_ENTRY_BYTES):
        from pyspark.sql import functions as F

        self.sources = list(sources)
        # per source table i, the struct column its columnar entries arrive in
        self.columns = columnar.struct_columns(
            [(f"{PREFIX}c{i}", n.table, n.schema) for i, n in enumerate(self.sources)])
        self.entry_columns = [*ENTRY_COLUMNS, *self.columns.names]
        # the (queue, table)s whose entries may omit columns (read as NULL)
        self.missing_null = frozenset((n.queue, n.table) for n in self.sources
                                      if n.missing_fields == "null")
        text = F.col("entry").cast("string")
        fits = F.length(F.col("entry")) <= F.lit(max_entry_bytes)
        shared = _union_columns(self.sources)
        # one parse per entry: the envelope, the corrupt marker and the columns of the tables
        # that can share it (UNION, computed in a projection of its own so Spark evaluates it
        # once). A name two tables declare with different types is no column of it (one JSON
        # field cannot be parsed as two types): their entries are parsed again as their own
        # table, named by the union's table field. So are
        # entries the union refuses (a value of the wrong type in *any* table's column, or no
        # JSON object), named by their table field as Spark's JSON parser reads it (a second
        # parser, e.g. get_json_object's, would refuse entries from_json accepts: NaN, ...)
        u = F.col(f"`{UNION}`")
        ok = u.isNotNull() & u[CORRUPT].isNull()
        self._union = F.when(fits, F.from_json(text, _union_ddl(shared), _PERMISSIVE)
                             ).alias(UNION)
        tag = F.when(ok, u["table"]).otherwise(
            F.from_json(text, "`table` string")["table"])
        self._parsed = [F.col(c) for c in ENTRY_COLUMNS]
        plain = F.col("entry").isNotNull()  # a JSON entry (or one that did not decode)
        # the entry's field names (explicit nulls included), only read where a table that reads
        # a missing field as bad has a NULL column: json_object_keys skips the values (cheap)
        # but its parser refuses what from_json accepts (NaN, ...); then from_json lists them
        keys = F.coalesce(F.json_object_keys(text),
                          F.map_keys(F.from_json(text, "map<string,string>")))
        self._split = []
        self._raw = []  # per source: (its struct column, keep, weight) — for ``tagged``
        for i, node in enumerate(self.sources):
            ddl = spark_ddl(node.schema) + f", `table` string, `w` long, `{CORRUPT}` string"
            own = F.from_json(text, ddl, _PERMISSIVE)
            named = tag == F.lit(node.table)
            if all(shared.get(c) == t for c, t in zip(node.schema.names, node.schema.types,
                                                       strict=True)):
                # the table's columns out of the one parse; its own parse where refused
                own = F.when(ok, F.struct(*[u[c].alias(c) for c in node.schema.names],
                                          u["table"].alias("table"), u["w"].alias("w"),
                                          F.lit(None).cast("string").alias(CORRUPT))
                             ).otherwise(own)
            mine = fits & (F.col("queue") == F.lit(node.queue)) & named
            r = f"{PREFIX}r{i}"
            c = F.col(f"`{self.columns.names[i]}`")  # the rows of a columnar entry: no parse
            decoded = F.struct(*[c[n].alias(n) for n in node.schema.names],
                               F.lit(node.table).alias("table"), c[W].alias("w"),
                               F.lit(None).cast("string").alias(CORRUPT))
            self._parsed.append(F.when(c.isNotNull(), decoded).when(mine, own).alias(r))
            # a NULL column is either an explicit null (fine) or a missing field (bad unless
            # the table reads missing fields as NULL): only then are the entry's keys listed
            cols = [F.col(f"`{r}`.`{c}`") for c in node.schema.names]
            complete = reduce(lambda a, b: a & b, [c.isNotNull() for c in cols])
            present = F.lit(True) if node.missing_fields == "null" else F.when(
                complete | ~plain, F.lit(True)).otherwise(reduce(
                    lambda a, b: a & b,
                    [F.array_contains(keys, F.lit(c)) for c in node.schema.names]))
            weight = F.coalesce(F.col(f"`{r}`.w"), F.lit(1))
            keep = F.coalesce(F.col(f"`{r}`").isNotNull() & F.col(f"`{r}`.`{CORRUPT}`").isNull()
                              & (weight != F.lit(0)) & present, F.lit(False))
            self._raw.append((r, keep, weight))
            self._split.append((keep, [F.col(f"`{r}`.`{c}`").alias(c) for c in node.schema.names]
                                + [weight.cast("long").alias(W)]))
        # every entry no table keeps is bad (too big, no or unknown table, refused by its
        # table's parse): nothing is dropped without a trace
        self._bad = ~reduce(lambda a, b: a | b, [k for k, _ in self._split]) \
            if self._split else F.lit(True)
        # what entries_task sees of each entry: its columns if it is bad, else nulls
        self._checked = [F.when(self._bad, F.col(c)).alias(c) for c in ENTRY_COLUMNS]

    def entries_ddl(self) -> str:
        """The DDL of an entries DataFrame: ENTRY_COLUMNS then the struct columns."""
        return ENTRY_DDL + (", " + columnar.columns_ddl(self.columns) if len(self.columns)
                            else "")

    def queue_columns(self, queue: str) -> pa.Schema:
        """The struct columns of the tables read from ``queue`` (the queue source's option)."""
        return pa.schema([f for f, n in zip(self.columns, self.sources, strict=True)
                          if n.queue == queue])

    def parse(self, entries_df):
        """The entries with each one's table struct: persist this, then ``split`` it. Struct
        columns ``entries_df`` lacks (entries given as JSON only) are NULL."""
        from pyspark.sql import functions as F

        have = set(entries_df.columns)
        missing = {f.name: F.lit(None).cast(columnar.struct_ddl(f)) for f in self.columns
                   if f.name not in have}
        if missing:
            entries_df = entries_df.withColumns(missing)
        entries_df = entries_df.select(*self.entry_columns, self._union)
        return entries_df.select(*self._parsed)

    def tagged(self, parsed_df, reads: list[SourceTable], side: str, sequence: str, bad: str):
        """Every entry as one row (the static plan, driver/static_plan.py): ``side`` = the index in ``reads``
        of the table that keeps it (NULL: none of them); ``sequence``: its queue sequence;
        ``bad`` + each of ENTRY_COLUMNS: the entry if it is bad, else NULL; then the columns of
        the tables read (a name several tables have is one column) and W."""
        from pyspark.sql import functions as F

        mine = [self._raw[self.sources.index(t)] for t in reads]
        which = F.coalesce(*[F.when(keep, F.lit(i)) for i, (_, keep, _) in enumerate(mine)])
        names: list[str] = []
        for t in reads:
            names += [c for c in t.schema.names if c not in names]

        def value(c: str):
            parts = [F.when(keep, F.col(f"`{r}`.`{c}`"))
                     for t, (r, keep, _) in zip(reads, mine, strict=True) if c in t.schema.names]
            return (parts[0] if len(parts) == 1 else F.coalesce(*parts)).alias(c)

        weight = F.coalesce(*[F.when(keep, w) for _, keep, w in mine]).cast("long")
        return parsed_df.select(which.alias(side), F.col("sequence").alias(sequence),
                                *[F.when(self._bad, F.col(c)).alias(bad + c)
                                  for c in ENTRY_COLUMNS],
                                *[value(c) for c in names], weight.alias(W))

    def split(self, parsed_df):
        """(frames: {source name: DataFrame of its columns + W}, checked: a row per entry for
        :func:`entries_task`, ENTRY_COLUMNS of a bad entry, nulls for a good one)."""
        frames = {node.name: parsed_df.filter(keep).select(*cols)
                  for node, (keep, cols) in zip(self.sources, self._split, strict=True)}
        return frames, parsed_df.select(*self._checked)

    def located(self, parsed_df) -> dict:
        """``split``'s frames with each row's entry (ENTRY_COLUMNS) after W: what traces a
        row back to its entry (negative.py), off the hot path."""
        from pyspark.sql import functions as F

        return {node.name: parsed_df.filter(keep).select(*cols, *map(F.col, ENTRY_COLUMNS))
                for node, (keep, cols) in zip(self.sources, self._split, strict=True)}


def widen(piece: pa.RecordBatch, columns: pa.Schema) -> pa.RecordBatch:
    """Entries with ENTRY_COLUMNS and the struct columns of their own queue's tables ->
    ENTRY_COLUMNS then every struct column of ``columns`` (the other tables' NULL)."""
    n = piece.num_rows
    names = piece.schema.names
    return pa.RecordBatch.from_arrays(
        [piece.column(c) for c in ENTRY_COLUMNS]
        + [piece.column(f.name) if f.name in names else pa.nulls(n, f.type) for f in columns],
        schema=pa.schema([*[piece.schema.field(c) for c in ENTRY_COLUMNS],
                          *[pa.field(f.name, f.type) for f in columns]]))


def _union_columns(sources: list[SourceTable]) -> dict[str, pa.DataType]:
    """The columns of the one parse of an entry: those of every table whose every column is a
    name that all tables declaring it type alike, and that no other name (nor the envelope's)
    equals but for case (Spark's parser could not tell those apart). Any other table is parsed
    as itself, and its columns stay out: they would only make the one parse refuse more
    entries and convert values no table takes from it."""
    types: dict[str, set] = {}
    for node in sources:
        for f in node.schema:
            types.setdefault(f.name, set()).add(f.type)
    folded: dict[str, int] = {}
    for n in [*types, "table", "w", CORRUPT]:
        folded[n.lower()] = folded.get(n.lower(), 0) + 1
    shared = {n: next(iter(ts)) for n, ts in types.items()
              if len(ts) == 1 and folded[n.lower()] == 1}
    return {c: t for node in sources if all(c in shared for c in node.schema.names)
            for c, t in zip(node.schema.names, node.schema.types, strict=True)}


def _union_ddl(columns: dict[str, pa.DataType]) -> str:
    """The DDL of the one parse: ``columns`` then the envelope and the corrupt marker."""
    head = spark_ddl(pa.schema(list(columns.items()))) + ", " if columns else ""
    return head + f"`table` string, `w` long, `{CORRUPT}` string"


def describe(entry: bytes, tables: dict[str, pa.Schema], max_entry_bytes: int,
             missing_null: frozenset = frozenset()) -> tuple:
    """(table, field, reason) of one bad entry: why the decoder refused it. ``missing_null``:
    the tables that read a missing field as NULL."""
    if entry[: len(columnar.MAGIC)] == columnar.MAGIC:
        try:
            table, _ = columnar.decode(entry, tables)
        except columnar.ColumnarEntryError as e:
            return e.table, e.field, e.reason
        return table, None, "columnar entry refused"
    if len(entry) > max_entry_bytes:
        return None, None, f"entry of {len(entry)} bytes is larger than {max_entry_bytes}"
    try:
        obj = json.loads(entry)
    except (ValueError, RecursionError) as e:
        return None, None, f"not JSON: {str(e)[:120]}"
    if not isinstance(obj, dict):
        return None, None, f"not a JSON object but a {type(obj).__name__}"
    table = obj.get("table")
    if not isinstance(table, str) or table not in tables:
        return (table if isinstance(table, str) else None, "table",
                f"unknown table {table!r}; the pipeline reads {sorted(tables)}")
    w = obj.get("w", 1)
    if isinstance(w, bool) or not isinstance(w, int) or w == 0 or not -2**63 <= w < 2**63:
        return table, "w", f"weight {w!r} is not a non-zero 64-bit integer"
    for f in tables[table]:
        if f.name not in obj:
            if table in missing_null:
                continue
            return table, f.name, f"missing column {f.name!r} ({f.type})"
        if not _fits(obj[f.name], f.type):
            return table, f.name, f"value {str(obj[f.name])[:60]!r} is not of type {f.type}"
    return table, None, "refused by Spark's JSON parser"


def _fits(v, t: pa.DataType) -> bool:
    if v is None:
        return True
    if pa.types.is_integer(t):
        bits = t.bit_width
        return (isinstance(v, int) and not isinstance(v, bool)
                and -2**(bits - 1) <= v < 2**(bits - 1))
    if pa.types.is_floating(t):
        return (isinstance(v, int | float) and not isinstance(v, bool)) or v in _NON_NUMERIC
    if pa.types.is_boolean(t):
        return isinstance(v, bool)
    return True  # strings: Spark keeps any JSON value's text


def bad_summary(rows: pa.Table, schemas: dict[str, dict[str, pa.Schema]],
                max_entry_bytes: int, missing_null: frozenset = frozenset()
                ) -> tuple[dict, list[tuple]]:
    """({"count", "examples"}, (table, field, reason) per row) of bad entries ``rows``
    (ENTRY_COLUMNS); ``schemas``: queue -> table -> schema; ``missing_null``: the (queue,
    table)s that read a missing field as NULL."""
    entries, queues = rows["entry"].to_pylist(), rows["queue"].to_pylist()
    described = [describe(e, schemas.get(q, {}), max_entry_bytes,
                          frozenset(t for qq, t in missing_null if qq == q))
                 for e, q in zip(entries, queues, strict=True)]
    seqs, idx = rows["sequence"].to_pylist(), rows["index"].to_pylist()
    summary = {"count": rows.num_rows, "examples": [
        {"queue": q, "sequence": s, "index": i, "table": d[0], "field": d[1], "reason": d[2]}
        for q, s, i, d in list(zip(queues, seqs, idx, described, strict=True))[:EXAMPLES]]}
    return summary, described


def entries_task(tables: dict[str, bytes], max_entry_bytes: int, dead_letter: str | None,
                 writer_id: str | None, url: str, persist_root: str, time: int,
                 inline_max: int, missing_null: frozenset = frozenset()):
    """mapInArrow function over a partition of :meth:`Decoder.split`'s checked rows: yields
    (KIND, PAYLOAD) control rows — ("rows", entries in the partition), ("bad", summary) and,
    with a dead-letter shard, its part ("part"/"out", like an output)."""
    schemas: dict[str, dict[str, pa.Schema]] = {}  # queue -> table -> schema
    for (queue, table), b in tables.items():
        schemas.setdefault(queue, {})[table] = schema_from_bytes(b)

    def fn(batches):
        schema = pa.schema([("queue", pa.string()), ("sequence", pa.int64()),
                            ("index", pa.int32()), ("entry", pa.binary())])
        # Spark may mark a column non-nullable in some batches: same types, so cast
        rows = pa.Table.from_batches([b.cast(schema) for b in batches], schema=schema)
        count = ("rows", str(rows.num_rows).encode())
        rows = rows.filter(rows["sequence"].is_valid())  # the bad entries
        if rows.num_rows == 0:
            yield control_rows([count], CONTROL_SCHEMA)
            return
        summary, described = bad_summary(rows, schemas, max_entry_bytes, missing_null)
        control = [count, ("bad", pickle.dumps(summary))]
        if dead_letter is not None:
            n = rows.num_rows
            part = pa.table({
                "queue": rows["queue"], "sequence": rows["sequence"], "index": rows["index"],
                "table": pa.array([d[0] for d in described], pa.string()),
                "field": pa.array([d[1] for d in described], pa.string()),
                "reason": pa.array([d[2] for d in described], pa.string()),
                "entry": rows["entry"],
                "time": pa.array(np.full(n, time, np.uint64)),
                "diff": pa.array(np.ones(n, np.int64))})
            if part.nbytes <= inline_max:
                control.append(("out", pickle.dumps((dead_letter, table_to_ipc(part)))))
            else:
                from headrace.pipeline.exec.outputs import upload_task_part  # on first use

                meta = upload_task_part(url, dead_letter, writer_id, part, persist_root)
                control.append(("part", pickle.dumps((dead_letter, meta))))
        yield control_rows(control, CONTROL_SCHEMA)

    return fn

