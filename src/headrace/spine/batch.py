"""Batch: an immutable, sorted, consolidated Z-set of (key, val, w) rows.

In memory a batch is an Arrow table with contiguous columns; on disk it is a ``HRSB`` file (see
format.py) read back through mmap with no copy, whose blocks are CRC-checked the first time a
read touches them. Every operation is vectorised over arrays: sort + consolidate with Arrow,
lookups with ``np.searchsorted`` over the key column (int64) or hash membership over the blocks
the sparse index routes to (binary/string keys).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import ChecksumMismatch, FormatError, InvalidInput
from headrace.spine import format as fmt
from headrace.spine.bloom import bloom_build, bloom_may_contain, hash_keys
from headrace.spine.catalog import check_bound_value
from headrace.zset import consolidate

DEFAULT_BLOCK_BYTES = 64 * 1024
_SPARSE_EVERY = 4096  # rows between sparse keys of an in-memory batch
_PROMOTE = {pa.string(): pa.large_string(), pa.binary(): pa.large_binary(),
            pa.int32(): pa.int64(), pa.int16(): pa.int64(), pa.int8(): pa.int64(),
            pa.float32(): pa.float64()}


def zset_schema(key_type: pa.DataType, val_type: pa.DataType) -> pa.Schema:
    return pa.schema([pa.field("key", key_type, False), pa.field("val", val_type, False),
                      pa.field("w", pa.int64(), False)])


def _normalize(table: pa.Table) -> pa.Table:
    missing = {"key", "val", "w"} - set(table.column_names)
    if missing:
        raise InvalidInput(f"a Z-set needs columns key, val, w; missing {sorted(missing)}")
    cols = []
    for name, allowed in (("key", fmt.KEY_TYPES), ("val", fmt.VAL_TYPES), ("w", (pa.int64(),))):
        col = table.column(name)
        if col.null_count:
            raise InvalidInput(f"column {name!r} has {col.null_count} nulls; Z-sets have none")
        t = _PROMOTE.get(col.type, col.type)
        if t not in allowed:
            raise InvalidInput(f"column {name!r} has type {col.type}; allowed: "
                               f"{', '.join(map(str, allowed))}")
        cols.append(col.cast(t) if t != col.type else col)
    schema = zset_schema(cols[0].type, cols[1].type)
    return pa.Table.from_arrays(cols, schema=schema)


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort + neighbour compare; numpy's hash unique is slower here)."""
    if len(x) < 2:
        return np.sort(x)
    s = np.sort(x)
    return s[np.concatenate([[True], s[1:] != s[:-1]])]


def _expand_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of arange(lo[i], hi[i]) for all i, without a Python loop."""
    counts = hi - lo
    keep = counts > 0
    lo, counts = lo[keep], counts[keep]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) + np.repeat(lo - offsets, counts)


class _BlockCheck:
    """Lazy per-block CRC verification of a file-backed batch."""

    def __init__(self, name: str | None, buf: pa.Buffer, dec: fmt.Decoded, rows: int):
        self.name = name
        self.mv = memoryview(buf)
        self.layouts = dec.layouts
        self.bounds = np.append(dec.row_start, rows).astype(np.int64)
        self.crcs = dec.block_crc
        self.ok = np.zeros(len(dec.row_start), dtype=bool)
        self.lock = threading.Lock()

    def block_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, rows, side="right") - 1

    def check(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            b = int(b)
            if self.ok[b]:
                continue
            r0, r1 = int(self.bounds[b]), int(self.bounds[b + 1])
            actual = fmt.block_crc(self.mv, self.layouts, r0, r1, self.name, b)
            if actual != int(self.crcs[b]):
                raise ChecksumMismatch(self.name, self.layouts[0].values_off + 8 * r0,
                                       f"crc32 of block {b} (rows {r0}..{r1})",
                                       expected=int(self.crcs[b]), actual=actual)
            self.ok[b] = True

    def check_ranges(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Verify every block overlapping any row range [lo, hi)."""
        keep = hi > lo
        if not keep.any():
            return
        nb = len(self.ok)
        b_lo, b_hi = self.block_of(lo[keep]), self.block_of(hi[keep] - 1)
        diff = np.bincount(b_lo, minlength=nb + 1) - np.bincount(b_hi + 1, minlength=nb + 1)
        touched = np.cumsum(diff)[:nb] > 0
        self.check(np.flatnonzero(touched & ~self.ok))

    def check_all(self) -> None:
        self.check(np.flatnonzero(~self.ok))


class Batch:
    """An immutable Z-set batch. Build with from_arrow / merge / from_bytes / open_file."""

    __slots__ = ("table", "name", "_check", "bloom", "bloom_k", "_keys_np", "_sparse", "_sparse_obj",
                 "__weakref__")

    def __init__(self, table: pa.Table, *, name: str | None = None,
                 check: _BlockCheck | None = None, bloom: np.ndarray | None = None,
                 bloom_k: int = 0, sparse: tuple[np.ndarray, pa.Array, pa.Array] | None = None):
        self.table = table  # trusted: sorted, consolidated, one chunk per column
        self.name = name
        self._check = check
        self.bloom = bloom if bloom is not None else np.zeros(0, dtype=np.uint8)
        self.bloom_k = bloom_k
        self._keys_np: np.ndarray | None = None
        self._sparse = sparse
        self._sparse_obj: np.ndarray | None = None

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_arrow(cls, data) -> Batch:
        """Sort and consolidate a Table, RecordBatch or iterable of RecordBatches (vectorised)."""
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        elif not isinstance(data, pa.Table):
            data = list(data)
            if not data:
                raise InvalidInput("from_arrow needs at least one record batch to know the types")
            data = pa.Table.from_batches(data)
        return cls(consolidate(_normalize(data), sort=True))

    @classmethod
    def from_pydict(cls, key, val, w, key_type=None, val_type=None) -> Batch:
        return cls.from_arrow(pa.table({"key": pa.array(key, key_type),
                                        "val": pa.array(val, val_type),
                                        "w": pa.array(w, pa.int64())}))

    @classmethod
    def empty(cls, key_type: pa.DataType, val_type: pa.DataType) -> Batch:
        return cls(_normalize(zset_schema(key_type, val_type).empty_table()).combine_chunks())

    @classmethod
    def merge(cls, batches: list[Batch], lower_bound=None) -> Batch:
        """One batch with the summed contents of ``batches``, dropping keys below lower_bound."""
        if not batches:
            raise InvalidInput("merge needs at least one batch")
        _same_schema(batches)
        tables = [b.to_table() for b in batches]
        merged = pa.concat_tables(tables)
        if lower_bound is not None:
            # a bound Arrow cannot compare with the keys is the caller's error, not Arrow's
            lower_bound = check_bound_value(lower_bound, merged.schema.field("key").type,
                                            "Batch.merge")
            merged = merged.filter(pc.greater_equal(merged.column("key"), lower_bound))
        return cls(consolidate(merged, sort=True))

    # ---- serialization ------------------------------------------------------------------
    def encode(self, block_bytes: int = DEFAULT_BLOCK_BYTES) -> list:
        """The HRSB file as a list of buffers (see format.py)."""
        self.verify()
        rb = self.table.combine_chunks().to_batches()
        rb = rb[0] if rb else pa.RecordBatch.from_pylist([], schema=self.table.schema)
        if len(self.bloom) or self.bloom_k:
            bits, k = self.bloom, self.bloom_k
        else:
            bits, k = bloom_build(hash_keys(self._distinct_keys()))
        return fmt.encode(rb, bits, k, block_bytes)

    def to_bytes(self, block_bytes: int = DEFAULT_BLOCK_BYTES) -> bytes:
        return b"".join(bytes(p) if isinstance(p, pa.Buffer) else p
                        for p in self.encode(block_bytes))

    @classmethod
    def from_bytes(cls, buf, name: str | None = None) -> Batch:
        """Decode bytes zero-copy; every block CRC and the Arrow data are checked now."""
        pbuf = buf if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)
        batch = cls._from_buffer(pbuf, name)
        batch.verify()
        try:
            batch.table.validate(full=True)
        except pa.ArrowException as e:
            raise FormatError(name, None, f"batch data does not validate: {e}") from e
        return batch

    @classmethod
    def open_file(cls, path: str | Path, name: str | None = None) -> Batch:
        """Map a batch file; small sections are checked now, blocks on first touch."""
        mm = pa.memory_map(str(path), "r")
        return cls._from_buffer(mm.read_buffer(), name or Path(path).name)

    @classmethod
    def _from_buffer(cls, pbuf: pa.Buffer, name: str | None) -> Batch:
        dec = fmt.decode(pbuf, name)
        table = pa.Table.from_batches([dec.body])
        check = _BlockCheck(name, pbuf, dec, dec.body.num_rows)
        return cls(table, name=name, check=check, bloom=dec.bloom, bloom_k=dec.bloom_k,
                   sparse=(dec.row_start, dec.first_keys, dec.last_keys))

    # ---- properties ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema

    @property
    def key_type(self) -> pa.DataType:
        return self.table.schema.field("key").type

    @property
    def val_type(self) -> pa.DataType:
        return self.table.schema.field("val").type

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    @property
    def persistent(self) -> bool:
        return self._check is not None

    def key_bounds(self):
        """(first key, last key) as Python values, or None when empty."""
        if not len(self):
            return None
        if self._check is not None and self._sparse is not None:  # from the verified index
            return self._sparse[1][0].as_py(), self._sparse[2][-1].as_py()
        col = self.table.column("key")
        return col[0].as_py(), col[-1].as_py()

    def __repr__(self) -> str:
        where = f" file={self.name}" if self.name else ""
        return f"Batch(rows={len(self)}, key={self.key_type}, val={self.val_type}{where})"

    # ---- reads --------------------------------------------------------------------------
    def verify(self) -> None:
        """Check every block CRC (a no-op for a batch built in memory)."""
        if self._check is not None:
            self._check.check_all()

    def to_table(self) -> pa.Table:
        self.verify()
        return self.table

    def _key_array(self) -> pa.Array:
        return self.table.column("key").chunk(0) if self.table.column("key").num_chunks \
            else pa.array([], self.key_type)

    def _int_keys(self) -> np.ndarray:
        if self._keys_np is None:
            self._keys_np = self._key_array().to_numpy()
        return self._keys_np

    def _distinct_keys(self) -> pa.Array:
        keys = self._key_array()
        n = len(keys)
        if n <= 1:
            return keys
        if pa.types.is_int64(keys.type):
            k = keys.to_numpy()  # already sorted: distinct = differs from its predecessor
            return pa.array(k[np.concatenate([[True], k[1:] != k[:-1]])])
        diff = pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        return keys.filter(pa.array(np.concatenate([[True], diff])))

    def _sparse_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(row starts, first keys as an object array) used to route binary-key searches."""
        if self._sparse is None:
            rows = np.arange(0, len(self), _SPARSE_EVERY, dtype=np.int64)
            keys = self._key_array().take(pa.array(rows))
            self._sparse = (rows, keys, keys)
        if self._sparse_obj is None:
            self._sparse_obj = self._sparse[1].to_numpy(zero_copy_only=False)
        return self._sparse[0], self._sparse_obj

    def _bounds(self) -> np.ndarray:
        rows, _ = self._sparse_index()
        return np.append(rows, len(self)).astype(np.int64)

    def _verify_ranges(self, lo: np.ndarray, hi: np.ndarray) -> None:
        if self._check is not None:
            self._check.check_ranges(lo, hi)

    def position(self, key, side: str = "left") -> int:
        """searchsorted for one key: the first row whose key is >= (left) or > (right) it."""
        n = len(self)
        if n == 0:
            return 0
        if pa.types.is_int64(self.key_type):
            return int(np.searchsorted(self._int_keys(), np.int64(key), side=side))
        rows, first = self._sparse_index()
        bounds = self._bounds()
        b = max(0, int(np.searchsorted(first, key, side=side)) - 1)
        r0, r1 = int(bounds[b]), int(bounds[b + 1])
        self._verify_ranges(np.array([r0]), np.array([r1]))
        vals = self._key_array().slice(r0, r1 - r0).to_numpy(zero_copy_only=False)
        p = int(np.searchsorted(vals, key, side=side))
        return r0 + p

    def range(self, lo=None, hi=None) -> pa.Table:
        """Rows with lo <= key < hi (None = unbounded)."""
        r0 = 0 if lo is None else self.position(lo, "left")
        r1 = len(self) if hi is None else self.position(hi, "left")
        if r1 <= r0:
            return self.table.slice(0, 0)
        self._verify_ranges(np.array([r0]), np.array([r1]))
        return self.table.slice(r0, r1 - r0)

    def cursor(self, lo=None, hi=None, chunk_rows: int = 65536):
        """A Cursor over this batch alone (seek / key / values / next_key)."""
        from headrace.spine.cursor import batch_cursor

        return batch_cursor(self, lo, hi, chunk_rows)

    def lookup_many(self, keys: pa.Array | pa.ChunkedArray, *,
                    hashes: np.ndarray | None = None, probe_sorted: bool = False) -> pa.Table:
        """All rows whose key is in ``keys`` (no Python loop per key).

        ``hashes`` (hash_keys of ``keys``) lets the Bloom filter drop absent keys first;
        ``probe_sorted`` says int64 keys are already sorted and distinct.
        """
        n = len(self)
        if n == 0 or len(keys) == 0:
            return self.table.slice(0, 0)
        keys = _as_key_array(keys, self.key_type)
        if self.bloom_k and hashes is not None:
            keys = keys.filter(pa.array(bloom_may_contain(self.bloom, self.bloom_k, hashes)))
            if len(keys) == 0:
                return self.table.slice(0, 0)
        if pa.types.is_int64(self.key_type):
            probe = keys.to_numpy()
            if not probe_sorted:
                probe = sorted_unique(probe)
            col = self._int_keys()
            lo = np.searchsorted(col, probe, side="left")
            hi = np.searchsorted(col, probe, side="right")
            self._verify_ranges(lo, hi)
            rows = _expand_ranges(lo, hi)
            return self.table.take(pa.array(rows))
        return self._lookup_binary(keys)

    def _lookup_binary(self, keys: pa.Array) -> pa.Table:
        probe = pc.unique(keys)
        obj = np.sort(probe.to_numpy(zero_copy_only=False))
        rows, first = self._sparse_index()
        bounds = self._bounds()
        nb = len(rows)
        b_lo = np.maximum(np.searchsorted(first, obj, side="left") - 1, 0)
        b_hi = np.searchsorted(first, obj, side="right") - 1
        keep = b_hi >= 0
        b_lo, b_hi = b_lo[keep], b_hi[keep]
        if not len(b_lo):
            return self.table.slice(0, 0)
        diff = np.bincount(b_lo, minlength=nb + 1) - np.bincount(b_hi + 1, minlength=nb + 1)
        touched = np.flatnonzero(np.cumsum(diff)[:nb] > 0)
        # contiguous runs of touched blocks become row ranges
        run_start = touched[np.concatenate([[True], np.diff(touched) != 1])]
        run_end = touched[np.concatenate([np.diff(touched) != 1, [True]])]
        lo, hi = bounds[run_start], bounds[run_end + 1]
        self._verify_ranges(lo, hi)
        candidates = _expand_ranges(lo, hi)
        cand_keys = self._key_array().take(pa.array(candidates))
        mask = pc.is_in(cand_keys, value_set=probe).to_numpy(zero_copy_only=False)
        return self.table.take(pa.array(candidates[mask]))


def _as_key_array(keys, key_type: pa.DataType) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    elif not isinstance(keys, pa.Array):
        keys = pa.array(keys)
    if keys.null_count:
        keys = keys.drop_null()
    if keys.type != key_type:
        try:
            keys = keys.cast(key_type)
        except pa.ArrowException as e:
            raise InvalidInput(f"lookup keys of type {keys.type} do not match {key_type}") from e
    return keys


def _same_schema(batches: list[Batch]) -> None:
    s0 = batches[0].schema
    for b in batches[1:]:
        if not b.schema.equals(s0):
            raise InvalidInput(f"batch schemas differ: {s0} vs {b.schema}")
