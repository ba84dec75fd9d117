"""Interval joins: an equi-join whose pairs must also be close in event time — (l, r) match when
the keys are equal and ``r.rt BETWEEN l.lt + lower AND l.lt + upper`` — inner, left, right,
full outer, left semi and left anti, with Spark SQL's semantics over the net input.

State, one spine per side: key = the *time slot* of the row's time (8 bytes, order-preserving:
big-endian, sign bit flipped), then the equi-key encoding; val = the exact row; w. Slots are
``width = max(upper - lower, 1 µs)`` wide, so the partners of a row lie in at most two slots of
the other side: a delta row probes those two keys (``lookup_many``) and the pairs found are
kept where the times fit. Matched rows change by dL x R + L x dR + dL x dR, as in
``join.JoinKernel``.

A side whose rows also come out alone — the left of left/full/semi/anti, the right of
right/full: *counted* — keeps each row's match count m, the weighted number of rows of the
other side it matches now: val = m (8 bytes, big-endian) + the row. A row v is output alone
(NULL-padded, or as is for semi/anti) while f(m) holds (f = "m == 0", for semi "m > 0"), so
with old weight L, new L', old count m, new m' its output changes by f(m') L' - f(m) L, which
retracts the padding at the first match and restores it when the last one leaves; the entry
(m, v, L) becomes (m', v, L'). A new row's m comes from its probe of the other side's state, a
stored row's m from state, and the delta rows of the other side that match it are found by
their probe: one lookup per side and batch. A row with a NULL key or time never matches (SQL):
on a padded side it comes out padded at once; one with a time is stored with m = 0 (for append
mode), one without a time (never final) is not; elsewhere such rows are never stored.

Expiry (``expiry_bounds``): a row leaves the state once it is *final*: late itself and no
non-late row of the other side can match it any more. Because the slot leads the key, the final
rows are a key prefix of each bucket: one deleted range per side. In update mode everything a
final row contributed is out already; in append mode (``expire(emit=True)``) it comes out then:
its row alone if f(m), and its pairs with the other side's rows still in state — a pair comes
out when the first of its two rows is final (the other is late then: its weight is final too).

A batch that retracts a stored row more often than it was inserted raises NegativeMultiplicity
before anything is written: a counted side's rows are read anyway; on another side only the
retracted rows' keys are looked up for it. A row that is never stored (no time, or a NULL key
on a side that is not padded) cannot be checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.errors import NegativeMultiplicity
from headrace.pipeline.names import W
from headrace.pipeline.operators.deltas import (
    as_array,
    consolidate_rows,
    group_sum,
    pushed_negative,
    weights,
    zset,
)
from headrace.pipeline.operators.join import JoinKernel, _check_products
from headrace.pipeline.operators.kernel import (
    ZSET_SCHEMA,
    KeyLayout,
    StateSpine,
    delete_below,
    scanning,
)
from headrace.zset import consolidate

MAX_BOUND_US = 1 << 60  # far beyond any timestamp span: sums of times and bounds never wrap
COUNT_BYTES = 8


def slot_width(lower_us: int, upper_us: int) -> int:
    return max(upper_us - lower_us, 1)


def slot_bytes(slots: np.ndarray) -> pa.Array:
    """int64 slots -> 8-byte keys whose byte order is the slots' order."""
    flipped = (np.asarray(slots, np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
    return _fixed8(flipped)


def _fixed8(values: np.ndarray) -> pa.Array:
    """8-byte big-endian values as a binary array."""
    n = len(values)
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), n,
                                                 [None, pa.py_buffer(values.tobytes())])
    return fixed.cast(pa.binary())


def expiry_bounds(interval: dict, offsets_us: Sequence[int], watermark_us: int) -> bytes:
    """The ``expire`` bound of an interval join at a watermark: left slot key + right slot
    key (8 bytes each); every row in a slot below its side's key is final.

    A row is late once its time + its offset <= watermark. A left row has no partner left to
    come once lt + upper <= watermark - offset_r (a later right row would be late); a right
    row once rt - lower <= watermark - offset_l. Final = both; a slot goes when all its times
    are final."""
    lower, upper = interval["lower_us"], interval["upper_us"]
    width = slot_width(lower, upper)
    left_last = min(watermark_us - offsets_us[1] - upper, watermark_us - offsets_us[0])
    right_last = min(watermark_us - offsets_us[0] + lower, watermark_us - offsets_us[1])
    slots = np.array([(left_last + 1) // width, (right_last + 1) // width], np.int64)
    return b"".join(slot_bytes(slots).to_pylist())


def _micros(col) -> np.ndarray:
    """A timestamp column as int64 µs (NULLs as 0: callers mask them)."""
    arr = as_array(col)
    arr = pc.cast(arr, pa.timestamp("us", tz=arr.type.tz))
    return np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
                      np.int64)


def _valid(col) -> np.ndarray:
    return np.asarray(as_array(col).is_valid().to_numpy(zero_copy_only=False), bool)


def _ints(col) -> np.ndarray:
    return np.asarray(as_array(col).to_numpy(zero_copy_only=False), np.int64)


@dataclass
class _Delta:
    """One side's batch: ``z`` the consolidated state delta (key, val = row, w) of the rows
    that can match, ``rows`` its decoded rows; ``alone`` the output of the rows that cannot
    (padded side); ``nulls`` the state entries of those with a time (m = 0)."""

    z: pa.Table
    rows: pa.Table
    alone: pa.Table | None
    nulls: pa.Table | None


@dataclass
class _Pairs:
    """Matched pairs whose times fit: the decoded rows, their encodings and weights."""

    lrows: pa.Table
    rrows: pa.Table
    enc: pa.Table  # lv, rv (row encodings), lw, rw


class IntervalJoinKernel(JoinKernel):
    def __init__(self, left: pa.Schema, right: pa.Schema, how: str = "inner", *,
                 interval: dict, on: Sequence[str] | None = None,
                 left_on: Sequence[str] | None = None, right_on: Sequence[str] | None = None):
        super().__init__(left, right, how, on=on, left_on=left_on, right_on=right_on)
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
        self.semi = self.how in ("left_semi", "left_anti")
        self.counted = (self.how in ("left", "full", "left_semi", "left_anti"),
                        self.how in ("right", "full"))
        # a counted side's unmatched rows come out (all but semi's): they are stored too
        self.padded = (self.counted[0] and self.how != "left_semi", self.counted[1])

    def key_layout(self, side: int) -> KeyLayout:
        """slot (8 bytes) key: the join key after the time slot."""
        return (self.lkey if side == 0 else self.rkey), 8

    def _alone(self, m: np.ndarray) -> np.ndarray:
        """f(m): is a counted row with m matches output alone?"""
        return m > 0 if self.how == "left_semi" else m == 0

    # ---- keys ---------------------------------------------------------------------------
    def _masks(self, delta: pa.Table, side: int) -> tuple[np.ndarray, np.ndarray]:
        """(no NULL in a key column, a non-NULL time) per row."""
        on = self.left_on if side == 0 else self.right_on
        key_ok = np.ones(delta.num_rows, bool)
        for c in on:
            key_ok &= _valid(delta[c])
        return key_ok, _valid(delta[self.lt if side == 0 else self.rt])

    def _codecs(self, side: int):
        return (self.lkey, self.lrow) if side == 0 else (self.rkey, self.rrow)

    def _time(self, rows: pa.Table, side: int) -> np.ndarray:
        return _micros(rows[self.lt if side == 0 else self.rt])

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
            key_ok, time_ok = self._masks(delta, side)
            own = time_ok & (key_ok | self.padded[side])
            probe = time_ok & key_ok
            ek = self._codecs(side)[0].encode(delta)
            t = self._time(delta, side)
            lo, hi = self._probe_slots(t, side)
            for slots, ok in ((t // self.width, own), (lo, probe), (hi, probe)):
                k = keys.concat_binary(slot_bytes(slots), ek)
                out.append((side, pc.if_else(pa.array(~ok), pa.scalar(None, pa.binary()), k)))
        return out

    # ---- the step -----------------------------------------------------------------------
    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
        d = [self._delta(deltas[s], s) for s in (0, 1)]
        parts = [x.alone for x in d if x.alone is not None]
        zl, zr = d[0].z, d[1].z
        writes: list[tuple[int, pa.Table]] = []
        if zl.num_rows or zr.num_rows:
            probes = [self._probes(d[0].rows, zl, 0), self._probes(d[1].rows, zr, 1)]
            found = [self._lookup(states[s], probes[1 - s], d[s].z if self.counted[s] else None,
                                  s) for s in (0, 1)]
            _check_products(zl, found[1], found[0], zr)
            _check_products(zl, zr, zl.slice(0, 0), zr.slice(0, 0))
            new_old = self._fit(d[0].rows, zl, 0, probes[0], found[1])  # dL x R
            old_new = self._fit(d[1].rows, zr, 1, probes[1], found[0])  # L x dR
            new_new = self._fit(d[0].rows, zl, 0, probes[0],
                                _take_keys(zr, as_array(pc.unique(probes[0]["key"]))))
            if not self.semi:
                parts += [self._pair_rows(p) for p in (new_old, old_new, new_new)]
            for s in (0, 1):
                if self.counted[s]:  # checks its rows' new weights
                    out, update = self._recount(s, d[s].z, found[s], new_old, old_new, new_new)
                    parts.append(out)
                    writes.append((s, update))
                elif d[s].z.num_rows:
                    self._check_stored(states[s], d[s].z, s, counts=False)
                    writes.append((s, d[s].z))
        for s in (0, 1):
            nulls = d[s].nulls
            if nulls is not None and nulls.num_rows:
                self._check_stored(states[s], nulls, s, counts=True)
                writes.append((s, nulls))
        for s, update in writes:  # every check passed: nothing was written before
            states[s].insert_updates(update)
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return self._empty()
        return consolidate_rows(pa.concat_tables(parts), self.out_codec)

    def _delta(self, delta: pa.Table, side: int) -> _Delta:
        key_ok, time_ok = self._masks(delta, side)
        row_codec = self._codecs(side)[1]
        good = delta.filter(pa.array(key_ok & time_ok))
        z = consolidate(zset(self._own_keys(good, side), row_codec.encode(good), weights(good)))
        rows = row_codec.decode(z["val"])
        alone = nulls = None
        if self.padded[side] and not (key_ok & time_ok).all():
            bad = delta.filter(pa.array(~(key_ok & time_ok)))
            bad = bad.select(row_codec.columns + [W]).cast(
                pa.schema(list(row_codec.schema) + [pa.field(W, pa.int64())]))
            alone = self._alone_rows(bad, side, bad[W])
            stored = delta.filter(pa.array(~key_ok & time_ok))
            nulls = consolidate(zset(self._own_keys(stored, side),
                                     _with_counts(np.zeros(stored.num_rows, np.int64),
                                                  row_codec.encode(stored)), weights(stored)))
        return _Delta(z, rows, alone, nulls)

    def _own_keys(self, rows: pa.Table, side: int) -> pa.Array:
        return keys.concat_binary(slot_bytes(self._time(rows, side) // self.width),
                                  self._codecs(side)[0].encode(rows))

    def _alone_rows(self, rows: pa.Table, side: int, w) -> pa.Table:
        return self._rows(rows, None, w) if side == 0 else self._rows(None, rows, w)

    def _probes(self, rows: pa.Table, z: pa.Table, side: int) -> pa.Table:
        """The key and row index of each of z's probes of the other side: a row probes its
        two candidate slots (one if they agree)."""
        t = self._time(rows, side)
        ek = as_array(pc.binary_slice(as_array(z["key"]), 8, 1 << 30))
        lo, hi = self._probe_slots(t, side)
        two = hi != lo
        idx = np.arange(z.num_rows, dtype=np.int64)
        return pa.table({"key": keys.concat_binary(slot_bytes(np.concatenate([lo, hi[two]])),
                                                   pa.concat_arrays([ek, ek.filter(
                                                       pa.array(two))])),
                         "i": pa.array(np.concatenate([idx, idx[two]]), pa.int64())})

    def _lookup(self, state: StateSpine, probes: pa.Table, own: pa.Table | None,
                side: int) -> pa.Table:
        """One side's stored rows under the other side's probe keys (and, for a counted side,
        under its own delta's keys: their old weights and counts), as key, val (the row), w,
        m (0 on an uncounted side) and raw (the stored val)."""
        want = [as_array(probes["key"])] + ([as_array(own["key"])] if own is not None else [])
        wanted = as_array(pc.unique(pa.concat_arrays(want)))
        found = state.lookup_many(wanted) if len(wanted) else ZSET_SCHEMA.empty_table()
        return self._entries(found, side)

    def _entries(self, found: pa.Table, side: int) -> pa.Table:
        raw = as_array(found["val"])
        if self.counted[side]:
            val, m = _split_counts(raw)
        else:
            val, m = raw, np.zeros(len(raw), np.int64)
        return pa.table({"key": as_array(found["key"]), "val": val,
                         "w": as_array(found["w"]), "m": pa.array(m, pa.int64()), "raw": raw})

    def _fit(self, rows: pa.Table, z: pa.Table, side: int, probes: pa.Table,
             found: pa.Table) -> _Pairs | None:
        """z's rows x the found rows of the other side under their probe keys, where the
        times fit."""
        if probes.num_rows == 0 or found.num_rows == 0:
            return None
        j = probes.join(found.select(["key", "val", "w"]), "key", join_type="inner",
                        use_threads=False)
        if j.num_rows == 0:
            return None
        at = as_array(j["i"])
        mine = rows.take(at)
        theirs = self._codecs(1 - side)[1].decode(j["val"])
        mine_v, theirs_v = as_array(z["val"]).take(at), as_array(j["val"])
        mine_w, theirs_w = as_array(z["w"]).take(at), as_array(j["w"])
        lrows, rrows = (mine, theirs) if side == 0 else (theirs, mine)
        lt, rt = self._time(lrows, 0), self._time(rrows, 1)
        fit = pa.array((rt >= lt + self.lower) & (rt <= lt + self.upper))
        enc = pa.table({"lv": mine_v, "rv": theirs_v, "lw": mine_w, "rw": theirs_w} if side == 0
                       else {"lv": theirs_v, "rv": mine_v, "lw": theirs_w, "rw": mine_w})
        return _Pairs(lrows.filter(fit), rrows.filter(fit), enc.filter(fit))

    def _pair_rows(self, p: _Pairs | None) -> pa.Table:
        if p is None or p.enc.num_rows == 0:
            return self._empty()
        return self._rows(p.lrows, p.rrows, pc.multiply(p.enc["lw"], p.enc["rw"]))

    def _recount(self, side: int, z: pa.Table, found: pa.Table, new_old: _Pairs | None,
                 old_new: _Pairs | None, new_new: _Pairs | None) -> tuple[pa.Table, pa.Table]:
        """A counted side's rows alone (output) and state update: for every row of its delta
        and every stored row a delta row of the other side matched, f(m') L' - f(m) L out,
        the entry (m, v, L) replaced by (m', v, L')."""
        mine, other_w = ("lv", "rw") if side == 0 else ("rv", "lw")
        if side == 1:  # for the right side, "new x old" is L x dR and "old x new" dL x R
            new_old, old_new = old_new, new_old
        touched = [as_array(z["val"])] + ([as_array(old_new.enc[mine])] if old_new else [])
        vals = as_array(pc.unique(pa.concat_arrays(touched)))
        n = len(vals)

        def ids(col) -> tuple[np.ndarray, np.ndarray]:
            i = as_array(pc.index_in(as_array(col), value_set=vals))
            return _valid(i), np.asarray(i.fill_null(0).to_numpy(zero_copy_only=False),
                                         np.int64)

        def matched(p: _Pairs | None) -> np.ndarray:
            if p is None:
                return np.zeros(n, np.int64)
            _, i = ids(p.enc[mine])
            return group_sum(i, _ints(p.enc[other_w]), n)

        _, zid = ids(z["val"])
        f_ok, fid = ids(found["val"])
        old = found.filter(pa.array(f_ok))
        fid = fid[f_ok]
        in_delta = np.zeros(n, bool)
        in_delta[zid] = True
        stored_m = np.zeros(n, np.int64)
        stored_m[fid] = _ints(old["m"])
        old_w = _ints(old["w"])
        m_old = np.where(in_delta, matched(new_old), stored_m)
        m_new = m_old + np.where(in_delta, matched(new_new), matched(old_new))
        w_new = group_sum(fid, old_w, n) + group_sum(zid, _ints(z["w"]), n)
        out_w = (self._alone(m_new) * w_new
                 - group_sum(fid, self._alone(_ints(old["m"])) * old_w, n))
        # every touched row is stored or in the delta: the first of its keys is its key
        first = np.unique(np.concatenate([fid, zid]), return_index=True)[1]
        key_of = pa.concat_arrays([as_array(old["key"]), as_array(z["key"])]).take(
            pa.array(first))
        bad = (w_new < 0) & (w_new < group_sum(fid, old_w, n))
        if bad.any():
            self._refuse(key_of.filter(pa.array(bad)), vals.filter(pa.array(bad)), side)
        live = w_new != 0
        update = pa.concat_tables([
            zset(old["key"], old["raw"], -old_w),
            zset(key_of.filter(pa.array(live)),
                 _with_counts(m_new[live], vals.filter(pa.array(live))), w_new[live])])
        emit = out_w != 0
        rows = self._codecs(side)[1].decode(vals.filter(pa.array(emit)))
        return (self._alone_rows(rows, side, pa.array(out_w[emit])), consolidate(update))

    def _check_stored(self, state: StateSpine, z: pa.Table, side: int, counts: bool) -> None:
        """Before entries ``z`` (key, val, w) are added unrecounted: NegativeMultiplicity if
        one retracts a stored entry more often than it was inserted. Only the retractions'
        keys are looked up, so a batch without any pays nothing. ``counts``: vals carry m."""
        neg = z.filter(pc.less(z["w"], 0))
        if not neg.num_rows:
            return
        bad = pushed_negative(state.lookup_many(as_array(pc.unique(neg["key"]))), neg)
        if bad.any():
            vals = as_array(neg["val"]).filter(pa.array(bad))
            self._refuse(as_array(neg["key"]).filter(pa.array(bad)),
                         _split_counts(vals)[0] if counts else vals, side)

    def _refuse(self, state_keys: pa.Array, rows: pa.Array, side: int) -> None:
        """Raise NegativeMultiplicity for these entries (state keys: slot + key; rows)."""
        row = self._codecs(side)[1].decode(rows.slice(0, 1)).to_pylist()[0]
        raise NegativeMultiplicity(
            f"{('left', 'right')[side]} interval join row {row} would occur fewer than 0 times",
            as_array(pc.binary_slice(state_keys, 8, 1 << 30)).to_pylist())

    # ---- event time ---------------------------------------------------------------------
    def expire(self, states: Sequence[StateSpine], below: bytes, emit: bool) -> pa.Table:
        """Delete each side's slots below its bound (``expiry_bounds``): final rows. With
        ``emit`` (append mode) return what they contribute, now final: counted rows alone
        where f(m), and pairs with a row that was not final before."""
        if not below:  # no watermark yet: nothing is final
            return self._empty()
        bounds = (below[:8], below[8:16])
        out = self._final(states, bounds) if emit else self._empty()
        for state, bound in zip(states, bounds, strict=True):
            delete_below(state, bound)
        return out

    def _final(self, states, bounds: tuple[bytes, bytes]) -> pa.Table:
        gone = [self._scan(states[s], bounds[s], s) for s in (0, 1)]
        parts = []
        for s in (0, 1):
            if self.counted[s]:
                e = gone[s].filter(pa.array(self._alone(_ints(gone[s]["m"]))))
                parts.append(self._alone_rows(self._codecs(s)[1].decode(e["val"]), s, e["w"]))
        if not self.semi:
            for s in (0, 1):
                z, rows = self._matchable(gone[s], s)
                if not z.num_rows:
                    continue
                probes = self._probes(rows, z, s)
                found = self._lookup(states[1 - s], probes, None, 1 - s)
                if s == 1:  # pairs with a final left row came out with it
                    found = found.filter(pc.greater_equal(found["key"],
                                                          pa.scalar(bounds[0], pa.binary())))
                parts.append(self._pair_rows(self._fit(rows, z, s, probes, found)))
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return self._empty()
        return consolidate_rows(pa.concat_tables(parts), self.out_codec)

    def _scan(self, state, bound: bytes, side: int) -> pa.Table:
        found = list(scanning(state).scan(b"", bound))
        t = pa.concat_tables(found) if found else ZSET_SCHEMA.empty_table()
        return self._entries(t, side)

    def _matchable(self, e: pa.Table, side: int) -> tuple[pa.Table, pa.Table]:
        """(key, val, w) of stored rows that can match (not a NULL key), and their rows."""
        rows = self._codecs(side)[1].decode(e["val"])
        key_ok, _ = self._masks(rows, side)
        ok = pa.array(key_ok)
        return e.select(["key", "val", "w"]).filter(ok), rows.filter(ok)


def _with_counts(m: np.ndarray, rows: pa.Array) -> pa.Array:
    """val of a counted side's entry: m (8 bytes, big-endian), then the row."""
    return keys.concat_binary(_fixed8(np.asarray(m, ">i8")), rows)


def _split_counts(raw: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(rows, m) of a counted side's stored vals."""
    if len(raw) == 0:
        return raw, np.zeros(0, np.int64)
    head = as_array(pc.binary_slice(raw, 0, COUNT_BYTES)).cast(pa.binary(COUNT_BYTES))
    m = np.frombuffer(head.buffers()[1], ">i8", count=len(head),
                      offset=head.offset * COUNT_BYTES).astype(np.int64)
    return as_array(pc.binary_slice(raw, COUNT_BYTES, 1 << 30)), m


def _take_keys(z: pa.Table, wanted: pa.Array) -> pa.Table:
    """The rows of a (key, val, w) table whose key is in ``wanted`` (a lookup in a delta)."""
    return z.filter(pc.is_in(z["key"], value_set=wanted)).select(["key", "val", "w"])
