"""Z-sets: Arrow tables of rows with a signed integer weight; the one consolidation every layer
uses (spine batches, persist updates, the pipeline's kernels and state).

To consolidate is to sum the weights of equal rows and drop the rows whose sum is 0: two
tables that consolidate to the same rows hold the same Z-set, whatever their order or split.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def consolidate(table: pa.Table, weight: str = "w", *, by: list[str] | None = None,
                sort: bool = False) -> pa.Table:
    """``table`` with the weights of equal rows summed and zero sums dropped; rows are equal
    when every column but ``weight`` is (or, with ``by``, those columns; the others are
    dropped, the result is ``by`` then ``weight``).

    ``sort``: the rows come out sorted by the other columns, one chunk per column, the same
    bytes whatever the input order (what a stored batch needs: a retried task writes what the
    first attempt wrote); the weights are summed in sorted order. Otherwise Arrow's hash
    grouping, rows in order of first appearance. With no column besides the weight, the result
    is one row of the total (none when it is 0)."""
    keys = [c for c in table.column_names if c != weight] if by is None else list(by)
    if not keys:
        total = pc.sum(table.column(weight)).as_py() or 0
        return pa.table({weight: pa.array([total] if total else [], pa.int64())})
    if sort:
        return _sorted(table if by is None else table.select([*keys, weight]), keys, weight)
    if table.num_rows == 0:
        return table if by is None else table.select([*keys, weight])
    g = table.group_by(keys, use_threads=False).aggregate([(weight, "sum")])
    g = g.rename_columns([weight if c == f"{weight}_sum" else c for c in g.column_names])
    g = g.filter(pc.not_equal(g[weight], 0))
    return g.select(table.column_names if by is None else [*keys, weight])


def _sorted(table: pa.Table, keys: list[str], weight: str) -> pa.Table:
    """Sort by ``keys``, sum the weights of equal neighbours (reduceat), drop zeros."""
    n = table.num_rows
    if n == 0:
        return table.combine_chunks()
    order = pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys])
    t = table.take(order).combine_chunks()
    w = t.column(weight).chunk(0).to_numpy()
    if n > 1:
        same = None
        for k in keys:
            col = t.column(k).chunk(0)
            eq = pc.equal(col.slice(1), col.slice(0, n - 1))
            if col.null_count:  # two nulls are equal rows here, as Arrow's grouping has them
                eq = pc.or_(pc.fill_null(eq, False),
                            pc.and_(col.slice(1).is_null(), col.slice(0, n - 1).is_null()))
            same = eq if same is None else pc.and_(same, eq)
        new = np.concatenate([[True], ~same.to_numpy(zero_copy_only=False)])
    else:
        new = np.ones(1, dtype=bool)
    starts = np.flatnonzero(new)
    if len(starts) == n:
        sums, rows = w, None
    else:
        sums, rows = np.add.reduceat(w, starts), starts
    keep = sums != 0
    if rows is None and keep.all():
        return t
    rows = np.arange(n)[keep] if rows is None else rows[keep]
    picked = t.select(keys).take(pa.array(rows))
    columns = {k: picked.column(k) for k in keys}
    columns[weight] = pa.array(sums[keep])
    return pa.Table.from_arrays([columns[c] for c in t.column_names],
                                schema=t.schema).combine_chunks()
