"""Session windows with retractions: ``GROUP BY session_window(time, gap), keys``, Spark SQL's
semantics, each session's aggregates computed by the aggregate kernel.

Sessions as Spark forms them: a key's rows sorted by time; a row at ``t`` opens
``[t, t + gap)``; a row whose ``t`` is at most the current session's end joins it and moves the
end to ``t + gap`` (sessions that touch merge: rows at 0 s and 5 s with a 5 s gap are one
session ``[0 s, 10 s)``). Rows with a NULL time are in no session (Spark filters them); a NULL
key is a key, and ``-0.0``/``0.0`` (every NaN) one key, as Spark groups. "Key" below means the
other group columns, normalised.

A delta reads the rows of its keys, forms the sessions of the old rows and of old + delta,
computes both sides' aggregates and emits the difference (consolidated): an insert may merge
two sessions, a retraction split one, and both are simply the recomputation. Sessions are
formed for all touched keys at once (one sort by key and time; a session breaks where the key
changes or the time jumps by more than the gap); each session's rows then go, weighted, through
an :class:`AggregateKernel` on an empty scratch state, so NULLs, exact and overflow-checked
sums, avg, min/max and count_distinct are the aggregate's, value for value. A batch that
retracts a row more often than it was inserted raises NegativeMultiplicity before anything is
written (the keys' rows are read anyway).

Two state layouts (one spine), fixed by ``expiring``:

- without event time (:class:`RoutedSessionKernel`): ``00 key`` -> val = the exact row,
  w = its multiplicity. A batch reads its keys' rows and writes its delta.
- with event time (:class:`SessionKernel`, ``expiring``): everything is keyed by a time, so the
  watermark deletes it as key ranges, unread, like the windows' state (plan/eventtime.py):
  ``00 end key`` -> the rows of the open session (key, end); ``01 end key`` -> w 1 per open
  session (the index); ``02 t+gap key`` -> rows of net negative weight (only in state
  written before batches were checked for them). A batch scans the index of the bucket's
  open sessions (one small row each) and the negative rows (normally none), reads the rows of its keys' sessions, and writes the sessions that changed under
  their new end (a session that grew moves: its rows are retracted under the old end, a key
  range the watermark deletes soon after, and written under the new one). Keying the rows by
  key alone left every closed row as a retraction for the LSM's merges to cancel: measured
  over 200 batches of 40 KB of open sessions, the live state rose and fell between 40 KB
  and 740 KB.

Event time: a row is late when ``t + gap <= watermark`` (Spark: the row's own session
``[t, t + gap)`` has ended); a session is final when ``end <= watermark``. Every row of a final
session is late (its end is at least ``t + gap``), so a final session never changes:
``expire`` emits it (append mode) and deletes the ranges below the watermark. A later, non-late
row before a final session's end starts a new session rather than reopening it — as in Spark,
which has evicted that session too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.operators import exactsum
from headrace.pipeline.operators.aggregate import Agg, AggregateKernel
from headrace.pipeline.operators.deltas import (
    as_array,
    consolidate_rows,
    dense_ids,
    fill,
    refuse_pushed_negative,
    weights,
    zset,
)
from headrace.pipeline.operators.kernel import (
    ZSET_SCHEMA,
    Expires,
    Kernel,
    KeyLayout,
    Rebucketable,
    RoutesKeys,
    StateSpine,
    delete_below,
    scanning,
    tagged_offsets,
)
from headrace.zset import consolidate

ROWS, ENDS, NEGATIVE = b"\x00", b"\x01", b"\x02"
NOT_NULL = b"\x01"  # RowCodec's flag byte before a non-NULL value (encoding/rowkeys.py)
_START, _END = f"{PREFIX}session_start", f"{PREFIX}session_end"
_I64_MAX = (1 << 63) - 1


class _Blank:
    """An empty state: the scratch aggregate sees every session's rows as new."""

    def lookup_many(self, keys: pa.Array) -> pa.Table:
        return ZSET_SCHEMA.empty_table()

    def insert_updates(self, updates: pa.Table) -> None:
        pass


def _empty_binary(n: int) -> pa.Array:
    return pa.array([b""] * n, pa.binary())


class SessionKernel(Kernel, Expires, Rebucketable):
    """``group_by(F.session_window(time, gap), *by).agg(*aggs)`` with event-time state (the
    layout in the module docstring); output columns: ``by``, ``<name>_start``,
    ``<name>_end`` (the session), then the aggregates."""

    state_sides = 1
    expiring = True

    def __init__(self, schema: pa.Schema, by: Sequence[str], time: str, gap_us: int,
                 aggs: Sequence[Agg], *, name: str = "session_window"):
        self.by, self.time, self.gap_us = list(by), time, gap_us
        if time not in schema.names:
            raise InvalidInput(f"session window: no time column {time!r} in {schema.names}")
        t = schema.field(time).type
        if not (pa.types.is_timestamp(t) and t.unit == "us"):
            raise InvalidInput(f"session window: time column {time!r} is {t}, not a timestamp "
                               "(microseconds)")
        if not isinstance(gap_us, int) or isinstance(gap_us, bool) or gap_us <= 0:
            raise InvalidInput(f"session window: the gap must be a positive number of "
                               f"microseconds, got {gap_us!r}")
        for f in schema:
            if f.name.startswith(PREFIX):
                raise InvalidInput(f"column {f.name!r} uses the reserved prefix {PREFIX!r}")
        self.start_name, self.end_name = f"{name}_start", f"{name}_end"
        wide = pa.schema([*schema, pa.field(_START, t), pa.field(_END, t)])
        self._agg = AggregateKernel(wide, [*self.by, _START, _END], aggs)
        rename = {_START: self.start_name, _END: self.end_name}
        out = [pa.field(rename.get(f.name, f.name), f.type) for f in self._agg.output_schema]
        names = [f.name for f in out]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InvalidInput(f"session window: output column(s) {dup} repeat; the session "
                               f"is output as {self.start_name!r} and {self.end_name!r}")
        self.output_schema = pa.schema(out)
        self.out_codec = keys.RowCodec(self.output_schema)
        self.input_schema = schema
        self.time_type = t
        self.group_codec = keys.RowCodec(schema, self.by, normalize=True) if self.by else None
        self.row_codec = keys.RowCodec(schema)
        self.time_codec = keys.RowCodec(pa.schema([pa.field(time, t)]), [time], normalize=True)
        self._time_bytes = len(self._times(np.zeros(1, np.int64))[0].as_py())

    def key_layout(self, side: int) -> KeyLayout:
        """ROWS|ENDS|NEGATIVE time g: the group key after the tag and the session time."""
        n = 1 + self._time_bytes
        return self.group_codec, tagged_offsets({0: n, 1: n, 2: n}, "session")

    def bucket_columns(self, input_index: int) -> list[str]:
        return list(self.by)

    def _group_keys(self, delta: pa.Table) -> pa.Array:
        if self.group_codec is None:
            return _empty_binary(delta.num_rows)
        return self.group_codec.encode(delta)

    def _times(self, us: np.ndarray) -> pa.Array:
        """Encoded times (order-preserving, as ``eventtime.bound_key`` encodes the bound)."""
        col = pa.array(np.asarray(us, np.int64), pa.int64()).cast(self.time_type)
        return self.time_codec.encode(pa.table({self.time: col}))

    def _empty(self) -> pa.Table:
        return pa.schema(list(self.output_schema) + [pa.field(W, pa.int64())]).empty_table()

    # ---- a micro-batch --------------------------------------------------------------------
    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
        delta, state = deltas[0], states[0]
        timed = as_array(delta[self.time]).is_valid() if delta.num_rows else None
        if timed is not None and timed.false_count:  # Spark: NULL time, no session
            delta = delta.filter(timed)
        if delta.num_rows == 0:
            return self._empty()
        w = weights(delta)
        exactsum.check_weights(w, "session window")
        d = consolidate(zset(self._group_keys(delta), self.row_codec.encode(delta), w))
        if d.num_rows == 0:
            return self._empty()
        old = self._read(state, as_array(pc.unique(d["key"])))
        # a row retracted more often than inserted: nothing written yet
        refuse_pushed_negative(old, d, self.row_codec, "session window row")
        new = self._sessions(consolidate(pa.concat_tables([old, d])))
        old = self._sessions(old)
        out_new = self._aggregate(new["rows"])  # raises ArithmeticOverflow: state untouched
        out_old = self._aggregate(old["rows"])
        self._write(state, d, old, new)
        both = pa.concat_tables([
            out_old.append_column(W, pa.array(fill(out_old.num_rows, -1))),
            out_new.append_column(W, pa.array(fill(out_new.num_rows, 1)))])
        return consolidate_rows(both, self.out_codec)

    def _sessions(self, z: pa.Table) -> dict:
        """The rows ``z`` (key, val, w: every row of each key) in sessions: "rows" (the
        positive rows sorted by key and time, with their session's start and end, and W),
        "z" (those rows as key, val, w, in the same order), "end" (each one's session end,
        µs), "first" (the first row of each session), "negative" (the rows of negative
        weight, as key, val, w) and "negative_t" (their times, µs)."""
        w = np.asarray(z["w"].to_numpy(), np.int64) if z.num_rows else np.zeros(0, np.int64)
        rows = self.row_codec.decode(z["val"])
        t = np.asarray(as_array(rows[self.time]).cast(pa.int64()).to_numpy(
            zero_copy_only=False), np.int64)
        if len(t) and int(t.max()) > _I64_MAX - self.gap_us:
            raise InvalidInput(f"session window: time {int(t.max())} µs + the gap "
                               f"({self.gap_us} µs) is past the largest timestamp")
        pos = w > 0
        negative = z.filter(pa.array(~pos))
        negative_t = t[~pos]
        if not pos.all():
            z, w, t, rows = (z.filter(pa.array(pos)), w[pos], t[pos],
                             rows.filter(pa.array(pos)))
        _, gid = dense_ids(z["key"])
        order = np.lexsort((t, gid))
        gs, ts = gid[order], t[order]
        first = np.ones(len(ts), bool)
        first[1:] = (gs[1:] != gs[:-1]) | (ts[1:] - ts[:-1] > self.gap_us)
        sid = np.cumsum(first) - 1
        last = np.r_[first[1:], True] if len(ts) else first
        end = (ts[last] + self.gap_us)[sid]
        perm = pa.array(order)
        out = rows.take(perm).append_column(_START, pa.array(ts[first][sid], pa.int64()).cast(
            self.time_type))
        out = out.append_column(_END, pa.array(end, pa.int64()).cast(self.time_type))
        out = out.append_column(W, pa.array(w[order], pa.int64()))
        return {"rows": out, "z": z.take(perm), "end": end, "first": first,
                "negative": negative, "negative_t": negative_t}

    def _aggregate(self, rows: pa.Table) -> pa.Table:
        """Each session's output row (the aggregate kernel over the rows, on no state)."""
        if rows.num_rows == 0:
            return self.output_schema.empty_table()
        out = self._agg.apply([rows], [_Blank()])
        return pa.Table.from_arrays([out[f.name] for f in self._agg.output_schema],
                                    schema=self.output_schema)

    # ---- the event-time layout ------------------------------------------------------------
    def _keyed(self, tag: bytes, us: np.ndarray, gkeys) -> pa.Array:
        return keys.concat_binary(tag, self._times(us), gkeys)

    def _split(self, key: pa.Array) -> tuple[pa.Array, pa.Array]:
        """``tag time key`` -> (encoded time, key)."""
        n = self._time_bytes
        return (as_array(pc.binary_slice(key, 1, 1 + n)),
                as_array(pc.binary_slice(key, 1 + n, 1 << 30)))

    def _scan_of(self, state, tag: bytes, gkeys: pa.Array) -> pa.Table:
        """The section ``tag``'s rows whose key is in ``gkeys`` (a scan of the whole section:
        it holds open sessions or negative rows only, the rest is deleted)."""
        found = list(scanning(state).scan(tag + NOT_NULL, tag + b"\xff"))
        if not found:
            return ZSET_SCHEMA.empty_table()
        t = pa.concat_tables(found)
        _, g = self._split(as_array(t["key"]))
        return t.filter(pc.is_in(g, value_set=gkeys))

    def _read(self, state, gkeys: pa.Array) -> pa.Table:
        """Every row of these keys (key = the key's encoding)."""
        index = self._scan_of(state, ENDS, gkeys)
        rows = state.lookup_many(keys.concat_binary(ROWS, as_array(pc.binary_slice(
            index["key"], 1, 1 << 30)))) if index.num_rows else ZSET_SCHEMA.empty_table()
        neg = self._scan_of(state, NEGATIVE, gkeys)
        parts = [pa.table({"key": self._split(as_array(t["key"]))[1], "val": t["val"],
                           "w": t["w"]}, schema=ZSET_SCHEMA) for t in (rows, neg) if t.num_rows]
        return pa.concat_tables(parts) if parts else ZSET_SCHEMA.empty_table()

    def _state_rows(self, s: dict, sign: int) -> list[pa.Table]:
        """A session set's state rows (rows, index, negative rows), times ``sign``."""
        z, first = s["z"], s["first"]
        w = np.asarray(z["w"].to_numpy(), np.int64)
        out = [zset(self._keyed(ROWS, s["end"], z["key"]), z["val"], sign * w)]
        firsts = pa.array(first)
        out.append(zset(self._keyed(ENDS, s["end"][first], as_array(z["key"]).filter(firsts)),
                        _empty_binary(int(first.sum())), fill(int(first.sum()), sign)))
        neg = s["negative"]
        if neg.num_rows:
            out.append(zset(self._keyed(NEGATIVE, s["negative_t"] + self.gap_us, neg["key"]),
                            neg["val"], sign * np.asarray(neg["w"].to_numpy(), np.int64)))
        return out

    def _write(self, state, d: pa.Table, old: dict, new: dict) -> None:
        """The changed sessions under their (new) end; unchanged ones cancel out."""
        state.insert_updates(consolidate(pa.concat_tables(
            self._state_rows(old, -1) + self._state_rows(new, 1))))

    def expire(self, states: Sequence[StateSpine], below: bytes, emit: bool) -> pa.Table:
        """Delete every session whose encoded end sorts below ``below`` (it ended at or before
        the watermark) — its rows, its index entry — and the negative rows whose own session
        ended (a later insertion to cancel them would be late), as key ranges, unread. With
        ``emit`` (append mode) return those sessions' final rows (+1), read by the index's
        range and the rows' keys."""
        state = states[0]
        if not below:  # no watermark yet: nothing is final
            return self._empty()
        out = self._empty()
        if emit:
            found = list(scanning(state).scan(ENDS + NOT_NULL, ENDS + below))
            if found:
                index = pa.concat_tables(found)
                rows = state.lookup_many(keys.concat_binary(ROWS, as_array(pc.binary_slice(
                    index["key"], 1, 1 << 30))))
                z = pa.table({"key": self._split(as_array(rows["key"]))[1], "val": rows["val"],
                              "w": rows["w"]}, schema=ZSET_SCHEMA)
                final = self._aggregate(self._sessions(z)["rows"])
                out = final.append_column(W, pa.array(fill(final.num_rows, 1)))
        for tag in (ROWS, ENDS, NEGATIVE):
            delete_below(state, tag + below, tag + NOT_NULL)
        return out


class RoutedSessionKernel(SessionKernel, RoutesKeys):
    """A session kernel whose time column is not event time: nothing expires, so the rows are
    kept by key (``00 key``) and every state key it touches is a delta row's — one apply can
    serve all of a task's buckets (``route_keys``). The event-time layout has no
    ``route_keys``: its keys carry session ends known only once the state is read, so it runs
    per bucket (exec/tasks.py)."""

    expiring = False

    def key_layout(self, side: int) -> KeyLayout:
        """ROWS g: the group key after the section tag."""
        return self.group_codec, tagged_offsets({0: 1}, "session")

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """The state key of each delta row (its key's rows); see AggregateKernel.route_keys."""
        return [(0, keys.concat_binary(ROWS, self._group_keys(deltas[0])))]

    def _read(self, state, gkeys: pa.Array) -> pa.Table:
        found = state.lookup_many(keys.concat_binary(ROWS, gkeys))
        return pa.table({"key": as_array(pc.binary_slice(found["key"], 1, 1 << 30)),
                         "val": found["val"], "w": found["w"]}, schema=ZSET_SCHEMA)

    def _write(self, state, d: pa.Table, old: dict, new: dict) -> None:
        state.insert_updates(zset(keys.concat_binary(ROWS, d["key"]), d["val"],
                                  d["w"].to_numpy()))

    def expire(self, states: Sequence[StateSpine], below: bytes, emit: bool) -> pa.Table:
        raise InvalidInput("this session window's time column is not event time: nothing "
                           "expires (with_watermark on it first)")
