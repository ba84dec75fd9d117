"""Compare a query's streamed result (a consolidated shard) with Spark's batch result, as
multisets of rows, vectorised (a full-size q0 result has ~9M rows: no Python per row).

Rows are put in one canonical form before sorting: a shard's ``diff`` expands each row into
that many copies (``time`` is dropped), timestamps become int64 microseconds since the epoch
(UTC), integers int64, and doubles are rounded to 40 mantissa bits (~12 significant digits):
Spark's double ``avg``/``sum`` depend on the order of additions, headrace's are exact, so the
last bits may differ while the results are the same.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SHARD_COLUMNS = ("time", "diff")
_MANTISSA_BITS = 40


def _canonical_column(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if pa.types.is_timestamp(t):
        return col.cast(pa.timestamp(t.unit)).cast(pa.timestamp("us")).cast(pa.int64())
    if pa.types.is_integer(t):
        return col.cast(pa.int64())
    if pa.types.is_floating(t):
        x = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        finite = np.isfinite(x)
        m, e = np.frexp(np.where(finite, x, 0.0))
        r = np.ldexp(np.round(m * 2.0**_MANTISSA_BITS) / 2.0**_MANTISSA_BITS, e)
        r = np.where(finite, r, x) + 0.0  # + 0.0 turns -0.0 into 0.0, as a SQL = would
        return pa.array(r, mask=col.is_null().to_numpy(zero_copy_only=False))
    if pa.types.is_large_string(t):
        return col.cast(pa.string())
    return col


def canonical(table: pa.Table, columns: list[str]) -> pa.Table:
    """``table``'s rows (expanded by ``diff`` when it has one) in canonical form, sorted."""
    if "diff" in table.column_names:
        diff = table["diff"].to_numpy()
        if (diff <= 0).any():
            bad = int(np.argmax(diff <= 0))
            raise ValueError(f"row {bad} of the result has multiplicity {int(diff[bad])}: "
                             f"{table.slice(bad, 1).to_pylist()}")
        table = table.take(pa.array(np.repeat(np.arange(table.num_rows), diff)))
    out = pa.table({c: _canonical_column(table[c]) for c in columns})
    if out.num_rows == 0:
        return out
    return out.sort_by([(c, "ascending") for c in columns])


def results_equal(streamed: pa.Table, batch: pa.Table) -> tuple[bool, str]:
    """(equal, explanation): same column names in the same order, same rows as multisets."""
    have = [c for c in streamed.column_names if c not in _SHARD_COLUMNS]
    want = list(batch.column_names)
    if have != want:
        return False, f"columns differ: streamed {have}, batch {want}"
    try:
        a = canonical(streamed, want)
    except ValueError as e:
        return False, str(e)
    b = canonical(batch, want)
    if a.num_rows != b.num_rows:
        return False, (f"{a.num_rows} streamed rows vs {b.num_rows} batch rows; "
                       f"{_first_difference(a, b)}")
    if a.schema != b.schema:
        return False, f"types differ: streamed {a.schema}, batch {b.schema}"
    if a.equals(b):
        return True, f"{a.num_rows} rows equal"
    return False, f"{a.num_rows} rows each; {_first_difference(a, b)}"


def _first_difference(a: pa.Table, b: pa.Table) -> str:
    n = min(a.num_rows, b.num_rows)
    same = np.ones(n, dtype=bool)
    for c in a.column_names:
        x, y = a[c].slice(0, n), b[c].slice(0, n)
        eq = pc.fill_null(pc.equal(x, y), False)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same &= pc.or_(eq, both_null).to_numpy(zero_copy_only=False)
    if same.all():
        return f"the first {n} sorted rows agree"
    i = int(np.argmin(same))
    return (f"first difference at sorted row {i}: streamed {a.slice(i, 1).to_pylist()}, "
            f"batch {b.slice(i, 1).to_pylist()}")
