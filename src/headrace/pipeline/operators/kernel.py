"""The interfaces of operator kernels and of the state they run on (DBSP's incremental operator).

A kernel is plain data + Arrow work: it takes, per input, the micro-batch's delta (the input's
columns plus ``W``, a signed int64 weight), reads and updates its state through ``StateSpine``
objects (one per state side, for the bucket being processed), and returns the output delta
(its output columns plus ``W``). Kernels know nothing of Spark or of where state lives, so the
conformance tests run them directly against an in-memory state and a batch oracle.

What a kernel can do beyond ``Kernel`` it declares by subclassing a capability protocol, and
the engine asks with ``isinstance``: ``RoutesKeys`` (name the state keys of a delta before
applying it: one call for all of a task's buckets), ``Expires`` (event time: drop the keys a
watermark closed), ``Rebucketable`` (say where its state keys hold the bucket columns: the
state can be re-bucketed). States likewise: ``ReplacingState`` (store a key's complete rows as
they are), ``ScanningState`` (read keys by range), ``KeyDeletingState`` (drop keys),
``RangeDeletingState`` (drop a key range unread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import FormatError
from headrace.pipeline.encoding.rowkeys import RowCodec

# a state row: key and val are opaque, binary-safe encodings (see encoding/rowkeys.py); w is the
# weight
ZSET_SCHEMA = pa.schema([("key", pa.binary()), ("val", pa.binary()), ("w", pa.int64())])


# ---- state ---------------------------------------------------------------------------------
class StateSpine(Protocol):
    """One bucket's Z-set of (key, val, w) rows: what every state offers a kernel."""

    def lookup_many(self, keys: pa.Array) -> pa.Table:
        """Rows (key, val, w) whose key is in ``keys`` (any order, repeats allowed),
        consolidated (equal (key, val) summed), zero weights dropped. ZSET_SCHEMA."""
        ...

    def insert_updates(self, updates: pa.Table) -> None:
        """Add a Z-set delta (key, val, w) (ZSET_SCHEMA); it is visible to later lookups."""
        ...


@runtime_checkable
class ReplacingState(Protocol):
    """A state that stores a key's complete new rows as they are (the reservoir's: one
    replacing row per key, no consolidation of old against new)."""

    def replace_rows(self, keys: pa.Array, rows: pa.Table) -> None:
        """The complete rows of ``keys`` are now ``rows`` (consolidated, keys of ``keys``
        only)."""
        ...


@runtime_checkable
class ScanningState(StateSpine, Protocol):
    """A state whose keys can be read by range: what event-time kernels need."""

    def scan(self, lo: bytes | None = None, hi: bytes | None = None) -> Iterator[pa.Table]:
        """The keys in [lo, hi) (default: all) in key order, as consolidated ZSET_SCHEMA
        tables."""
        ...


@runtime_checkable
class KeyDeletingState(Protocol):
    """A state that drops keys whatever their rows."""

    def delete_keys(self, keys: pa.Array) -> None:
        """Drop every row of ``keys`` (all values, whatever their weights)."""
        ...


@runtime_checkable
class RangeDeletingState(Protocol):
    """A state that drops a key range without reading it (the reservoir's deleted ranges)."""

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        """Drop every row whose key lies in [lo, hi) (rows inserted after it stay)."""
        ...


def replace_rows(state: StateSpine, keys: pa.Array, old: pa.Table, new: pa.Table) -> None:
    """The complete rows of ``keys`` (distinct, each looked up in ``state``: ``old`` holds
    what ``lookup_many`` returned for them) become ``new`` (consolidated, keys of ``keys``
    only). A ``ReplacingState`` stores that as it is; any other gets the same change as the
    retraction of ``old`` plus ``new``."""
    if isinstance(state, ReplacingState):
        state.replace_rows(keys, new)
    else:
        state.insert_updates(replaced_by(old, new))


def replaced_by(current: pa.Table, new: pa.Table) -> pa.Table:
    """The Z-set change that turns rows ``current`` into ``new`` (both ZSET_SCHEMA): the
    retraction of the one plus the other."""
    return pa.concat_tables([current.set_column(2, "w", pc.negate(current.column("w"))), new])


def scanning(state: StateSpine) -> ScanningState:
    """``state`` as a ScanningState (event-time kernels run only on states that scan)."""
    if not isinstance(state, ScanningState):
        raise TypeError(f"a {type(state).__name__} cannot scan keys by range: event-time "
                        "state needs one that can")
    return state


def delete_below(state: StateSpine, bound: bytes, start: bytes = b"") -> None:
    """Delete every key of ``state`` in [start, bound): a deleted range, which drops the pages
    inside it unread, where the state keeps ranges; else the keys are scanned and deleted."""
    if isinstance(state, RangeDeletingState):
        state.delete_range(start, bound)
        return
    if not isinstance(state, KeyDeletingState):
        raise TypeError(f"a {type(state).__name__} can delete neither a key range nor keys")
    found = [_as_array(t["key"]) for t in scanning(state).scan(start, bound)]
    if found:
        state.delete_keys(pa.concat_arrays(found))


def _as_array(col) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


# ---- kernels -------------------------------------------------------------------------------
class Kernel(Protocol):
    """An incremental operator over weighted changes."""

    #: the output columns (Arrow types), without the weight
    output_schema: pa.Schema
    #: number of state spines per bucket (0 for a stateless kernel)
    state_sides: int

    def bucket_columns(self, input_index: int) -> list[str]:
        """Columns of input ``input_index`` whose values route a row to its bucket: rows with
        equal values must meet the same state. Empty = one global group (bucket 0)."""
        ...

    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
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
        ...


@runtime_checkable
class RoutesKeys(Protocol):
    """A kernel that names, before ``apply``, the state keys each delta row touches: the task
    then runs it once over all of its buckets (state/task.py routes each key to its bucket)."""

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """(state side, the key each row of that side's delta touches) pairs, in the order of
        the deltas' rows; a null key touches no state."""
        ...


@runtime_checkable
class Expires(Protocol):
    """A kernel with event-time state: keys a watermark closed are dropped (and, in append
    mode, emitted once, final)."""

    def expire(self, states: Sequence[StateSpine], below: bytes, emit: bool) -> pa.Table:
        """Drop the state keys that sort below ``below`` (an encoded time bound); with
        ``emit``, return their final output rows."""
        ...


#: where a state key holds its bucket columns: a byte offset, or a function of the keys'
#: (data, starts, ends) giving one offset per key
KeyOffset = int | Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
KeyLayout = tuple[RowCodec | None, KeyOffset]


@runtime_checkable
class Rebucketable(Protocol):
    """A kernel that says where its state keys hold the bucket columns, so the state can be
    re-bucketed (driver/rescale.py)."""

    def key_layout(self, side: int) -> KeyLayout:
        """(RowCodec of the bucket columns, or None for one global bucket; their offset in each
        state key of side ``side``), as ``route_keys``/``apply`` build the keys."""
        ...


def tagged_offsets(offsets: dict[int, int], what: str) -> Callable[
        [np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """A KeyOffset by the key's first byte (its section tag): ``offsets`` {tag: offset}."""
    table = np.full(256, -1, np.int64)
    for tag, off in offsets.items():
        table[tag] = off

    def at(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        if np.any(ends <= starts):
            raise FormatError(None, None, f"{what} state: an empty state key")
        off = table[data[starts]]
        if np.any(off < 0):
            i = int(np.argmax(off < 0))
            raise FormatError(None, 0, f"{what} state key {i}: unknown section tag "
                                       f"{int(data[starts[i]])}")
        return off

    return at
