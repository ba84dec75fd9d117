"""Interval joins: an inner equi-join whose pairs must also be close in event time — a pair
(l, r) is output when the keys are equal and ``r.rt BETWEEN l.lt + lower AND l.lt + upper``.

State, one spine per side: key = the *time slot* of the row's time (8 bytes, order-preserving:
big-endian, sign bit flipped), then the equi-key encoding; val = the exact row; w. Slots are
``width = max(upper - lower, 1 µs)`` wide, so the partners of a row lie in at most two slots of
the other side: a delta row probes those two keys (``lookup_many``) and the pairs found are
kept where the times fit. Because the slot leads the key, the rows that can no longer match a
non-late row (watermarks on both time columns, ``expiry_bounds``) are a key prefix of each
bucket: ``expire`` deletes them with one range scan per side. A row with a NULL key or time
never matches (SQL), so it is never stored.

Matched rows change by dL x R + L x dR + dL x dR, as in ``join.JoinKernel``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline import keys
from headrace.pipeline.operators.base import StateSpine
from headrace.pipeline.operators.join import JoinKernel, _check_products, _delete_below
from headrace.pipeline.operators.zset import as_array, consolidate, consolidate_rows, weights, zset

MAX_BOUND_US = 1 << 60  # far beyond any timestamp span: sums of times and bounds never wrap


def slot_width(lower_us: int, upper_us: int) -> int:
    return max(upper_us - lower_us, 1)


def slot_bytes(slots: np.ndarray) -> pa.Array:
    """int64 slots -> 8-byte keys whose byte order is the slots' order."""
    flipped = (np.asarray(slots, np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
    n = len(flipped)
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), n,
                                                 [None, pa.py_buffer(flipped.tobytes())])
    return fixed.cast(pa.binary())


def expiry_bounds(interval: dict, offsets_us: Sequence[int], watermark_us: int) -> bytes:
    """The ``expire`` bound of an interval join at a watermark: left slot key + right slot
    key (8 bytes each); every row in a slot below its side's key can no longer match.

    A right row is late once rt + offset_r <= watermark, so a left row has no partner left to
    come once lt + upper <= watermark - offset_r; symmetrically a right row once
    rt - lower <= watermark - offset_l. A slot goes when all its times are that old."""
    lower, upper = interval["lower_us"], interval["upper_us"]
    width = slot_width(lower, upper)
    left_last = watermark_us - offsets_us[1] - upper  # a left row with lt <= this is done
    right_last = watermark_us - offsets_us[0] + lower
    slots = np.array([(left_last + 1) // width, (right_last + 1) // width], np.int64)
    return b"".join(slot_bytes(slots).to_pylist())


def _micros(col) -> np.ndarray:
    """A timestamp column as int64 µs (NULLs as 0: callers mask them)."""
    arr = as_array(col)
    arr = pc.cast(arr, pa.timestamp("us", tz=arr.type.tz))
    return np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
                      np.int64)


class IntervalJoinKernel(JoinKernel):
    def __init__(self, left: pa.Schema, right: pa.Schema, how: str = "inner", *,
                 interval: dict, on: Sequence[str] | None = None,
                 left_on: Sequence[str] | None = None, right_on: Sequence[str] | None = None):
        super().__init__(left, right, how, on=on, left_on=left_on, right_on=right_on)
        if self.how != "inner":
            raise InvalidInput(f"an interval join is an inner join (how={how!r} given): outer "
                               "padding of a time-bounded join is not built; join 'inner', or "
                               "use an equi-join without time_columns/within")
        self.lt, self.rt = interval["left"], interval["right"]
        self.lower, self.upper = int(interval["lower_us"]), int(interval["upper_us"])
        for side, schema, c in (("left", left, self.lt), ("right", right, self.rt)):
            if c not in schema.names:
                raise InvalidInput(f"interval join: time column {c!r} is not a {side} column "
                                   f"{schema.names}")
            if not pa.types.is_timestamp(schema.field(c).type):
                raise InvalidInput(f"interval join: {side} time column {c!r} is "
                                   f"{schema.field(c).type}, not a timestamp")
        if self.lower > self.upper:
            raise InvalidInput(f"interval join: within=(lower, upper) needs lower <= upper, got "
                               f"{self.lower} µs > {self.upper} µs")
        if max(abs(self.lower), abs(self.upper)) > MAX_BOUND_US:
            raise InvalidInput("interval join: a bound of within=(...) is longer than 36,000 "
                               "years")
        self.width = slot_width(self.lower, self.upper)

    # ---- keys ---------------------------------------------------------------------------
    def _usable(self, delta: pa.Table, side: int) -> np.ndarray:
        """Rows that can match: no NULL in a key column nor in the time column."""
        on = self.left_on if side == 0 else self.right_on
        ok = np.ones(delta.num_rows, bool)
        for c in [*on, self.lt if side == 0 else self.rt]:
            ok &= np.asarray(as_array(delta[c]).is_valid().to_numpy(zero_copy_only=False))
        return ok

    def _probe_slots(self, t: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
        """The first and last slot of the other side that a row at time ``t`` can match."""
        if side == 0:  # partners: rt in [t + lower, t + upper]
            return (t + self.lower) // self.width, (t + self.upper) // self.width
        return (t - self.upper) // self.width, (t - self.lower) // self.width  # lt range

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """Per input: the state keys its rows write and the two probe keys of the other side
        (null where a row touches no state)."""
        out = []
        for side, delta in enumerate(deltas):
            ok = pa.array(~self._usable(delta, side))
            codec = self.lkey if side == 0 else self.rkey
            ek = codec.encode(delta)
            t = _micros(delta[self.lt if side == 0 else self.rt])
            lo, hi = self._probe_slots(t, side)
            for slots in (t // self.width, lo, hi):
                k = keys.concat_binary(slot_bytes(slots), ek)
                out.append((side, pc.if_else(ok, pa.scalar(None, pa.binary()), k)))
        return out

    # ---- the step -----------------------------------------------------------------------
    def apply(self, deltas: list[pa.Table], states: list[StateSpine]) -> pa.Table:
        lstate, rstate = states
        zl = self._zside(deltas[0], 0)
        zr = self._zside(deltas[1], 1)
        if not (zl.num_rows or zr.num_rows):
            return self._empty()
        right_old = self._probe(zl, 0, rstate.lookup_many)  # dL x R
        left_old = self._probe(zr, 1, lstate.lookup_many)  # L x dR
        _check_products(zl, right_old[1], left_old[1], zr)
        _check_products(zl, zr, zl.slice(0, 0), zr.slice(0, 0))
        parts = [self._matches(zl, 0, *right_old), self._matches(zr, 1, *left_old)]
        new = self._probe(zl, 0, lambda k: _take_keys(zr, k))
        parts.append(self._matches(zl, 0, *new))
        lstate.insert_updates(zl.select(["key", "val", "w"]))
        rstate.insert_updates(zr.select(["key", "val", "w"]))
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return self._empty()
        return consolidate_rows(pa.concat_tables(parts), self.out_codec)

    def _zside(self, delta: pa.Table, side: int) -> pa.Table:
        """One side's consolidated state delta (key, val, w) of rows that can match."""
        good = delta.filter(pa.array(self._usable(delta, side)))
        codec, rows = (self.lkey, self.lrow) if side == 0 else (self.rkey, self.rrow)
        t = _micros(good[self.lt if side == 0 else self.rt])
        key = keys.concat_binary(slot_bytes(t // self.width), codec.encode(good))
        return consolidate(zset(key, rows.encode(good), weights(good)))

    def _probe(self, z: pa.Table, side: int, lookup) -> tuple[pa.Table, pa.Table]:
        """(probe table: the key and row index of each of z's probes, the other side's rows
        found under those keys) — a row probes its two candidate slots (one if they agree)."""
        if z.num_rows == 0:
            empty = zset([], [], [])
            return pa.table({"key": empty["key"], "i": pa.array([], pa.int64())}), empty
        rows = (self.lrow if side == 0 else self.rrow).decode(z["val"])
        t = _micros(rows[self.lt if side == 0 else self.rt])
        ek = pc.binary_slice(as_array(z["key"]), 8, 1 << 30)
        lo, hi = self._probe_slots(t, side)
        two = hi != lo
        idx = np.arange(z.num_rows, dtype=np.int64)
        slots = np.concatenate([lo, hi[two]])
        probes = pa.table({"key": keys.concat_binary(slot_bytes(slots), pa.concat_arrays(
            [as_array(ek), as_array(ek).filter(pa.array(two))])),
                           "i": np.concatenate([idx, idx[two]])})
        return probes, lookup(as_array(pc.unique(probes["key"])))

    def _matches(self, z: pa.Table, side: int, probes: pa.Table, found: pa.Table) -> pa.Table:
        """Output rows of z's rows x the found rows of the other side whose times fit."""
        if probes.num_rows == 0 or found.num_rows == 0:
            return self._empty()
        j = probes.join(found, "key", join_type="inner", use_threads=False)
        if j.num_rows == 0:
            return self._empty()
        mine = (self.lrow if side == 0 else self.rrow).decode(
            as_array(z["val"]).take(j["i"]))
        theirs = (self.rrow if side == 0 else self.lrow).decode(j["val"])
        lrows, rrows = (mine, theirs) if side == 0 else (theirs, mine)
        lt, rt = _micros(lrows[self.lt]), _micros(rrows[self.rt])
        fit = pa.array((rt >= lt + self.lower) & (rt <= lt + self.upper))
        w = pc.multiply(as_array(z["w"]).take(j["i"]), as_array(j["w"]))
        return self._rows(lrows.filter(fit), rrows.filter(fit), pc.filter(w, fit))

    def expire(self, states, below: bytes, emit: bool) -> pa.Table:
        """Delete each side's slots below its bound (``expiry_bounds``): rows no non-late row
        of the other side can match. The pairs they made stay output."""
        if emit:
            raise InvalidInput("an interval join emits changes, not final rows: mode='update'")
        for state, bound in zip(states, (below[:8], below[8:]), strict=True):
            _delete_below(state, bound)
        return self._empty()


def _take_keys(z: pa.Table, wanted: pa.Array) -> pa.Table:
    """The rows of a (key, val, w) table whose key is in ``wanted`` (a lookup in a delta)."""
    return z.filter(pc.is_in(z["key"], value_set=wanted)).select(["key", "val", "w"])
