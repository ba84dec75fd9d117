"""The one interface every operator kernel implements (DBSP's incremental operator).

A kernel is plain data + Arrow work: it takes, per input, the micro-batch's delta (the input's
columns plus ``W``, a signed int64 weight), reads and updates its state through ``StateSpine``
objects (one per state side, for the bucket being processed), and returns the output delta
(its output columns plus ``W``). Kernels know nothing of Spark or of where state lives, so the
conformance tests run them directly against an in-memory state and a batch oracle.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError

# a state row: key and val are opaque, binary-safe encodings (see pipeline.keys); w is the weight
ZSET_SCHEMA = pa.schema([("key", pa.binary()), ("val", pa.binary()), ("w", pa.int64())])


class ArithmeticOverflow(HeadraceError, ArithmeticError):
    """A result does not fit its type (a long ``sum`` past int64), as Spark's ANSI mode raises.

    Raised before the kernel writes any state, so the batch can fail without losing anything."""


class NegativeMultiplicity(HeadraceError, ValueError):
    """The batch would leave a multiplicity in the kernel's state below zero — a retraction of
    a row that was never inserted, which Spark SQL cannot express. Raised before the kernel
    writes any state (like ArithmeticOverflow), so the task can leave its state unwritten.

    ``keys``: every offending key, encoded as the kernel's input rows are bucketed (its
    ``bucket_columns``, normalised: ``keys.RowCodec(schema, columns, normalize=True)``), so
    the driver can find the entries of the batch that carry it (pipeline/negative.py);
    ``what``: the first one, in words."""

    def __init__(self, what: str, keys: list[bytes]):
        super().__init__(what)
        self.what = what
        self.keys = list(dict.fromkeys(keys))


class StateSpine(Protocol):
    """One bucket's Z-set of (key, val, w) rows."""

    def lookup_many(self, keys: pa.Array) -> pa.Table:
        """Rows (key, val, w) whose key is in ``keys`` (any order, repeats allowed),
        consolidated (equal (key, val) summed), zero weights dropped. ZSET_SCHEMA."""

    def insert_updates(self, updates: pa.Table) -> None:
        """Add a Z-set delta (key, val, w) (ZSET_SCHEMA); it is visible to later lookups."""


def replace_rows(state: StateSpine, keys: pa.Array, old: pa.Table, new: pa.Table) -> None:
    """The complete rows of ``keys`` (distinct, each looked up in ``state``: ``old`` holds
    what ``lookup_many`` returned for them) become ``new`` (consolidated, keys of ``keys``
    only). A state that can store that as it is (``replace_rows``: the reservoir's, one
    replacing row per key, no consolidation of old against new) does; any other gets the
    same change as the retraction of ``old`` plus ``new``."""
    replace = getattr(state, "replace_rows", None)
    if replace is not None:
        replace(keys, new)
    else:
        state.insert_updates(replaced_by(old, new))


def replaced_by(current: pa.Table, new: pa.Table) -> pa.Table:
    """The Z-set change that turns rows ``current`` into ``new`` (both ZSET_SCHEMA): the
    retraction of the one plus the other."""
    return pa.concat_tables([current.set_column(2, "w", pc.negate(current.column("w"))), new])


class Kernel(Protocol):
    """An incremental operator over weighted changes."""

    #: the output columns (Arrow types), without the weight
    output_schema: pa.Schema
    #: number of state spines per bucket (0 for a stateless kernel)
    state_sides: int

    def bucket_columns(self, input_index: int) -> list[str]:
        """Columns of input ``input_index`` whose values route a row to its bucket: rows with
        equal values must meet the same state. Empty = one global group (bucket 0)."""

    def apply(self, deltas: list[pa.Table], states: list[StateSpine]) -> pa.Table:
        """One bucket's step: deltas (one per input; input columns + W) and states (one per
        state side) in, the output delta (output columns + W) out. Must be exact under any
        split of the input into micro-batches (the result at every time equals the batch
        result over the net input so far).

        A kernel that has output over empty input (a global aggregate: one row of count 0)
        emits it on its first apply, so the runner applies such a kernel (``bucket_columns``
        empty: bucket 0) on the first batch even when its deltas are empty. Raises
        ArithmeticOverflow (state untouched) where Spark's ANSI mode raises, and
        NegativeMultiplicity (state untouched) where the batch would leave a multiplicity
        below zero."""
