"""Collections and renditions (Materialize's STORAGE architecture, "The STORAGE collection
structure").

A collection ``C`` is a metadata shard ``C~meta`` of rows ``(rendition, shards, role)`` where
role is ``"active"`` or ``"retired"``. At every time exactly one row has role active: the
rendition that defines the collection at that time. A handover at t writes, in one
compare_and_append, ``(old, active, -1) (old, retired, +1) (new, active, +1)`` at time t. The
retired rows never consolidate away, so the garbage collector always knows what it may delete.
Rendition ``R`` has shards ``C~R~0 .. C~R~{n-1}``.

A CollectionReader follows the metadata shard: the meta upper advancing is proof that no handover
happened below it, so the reader emits the current rendition's updates up to it; at a handover t
it emits the negated snapshot of the old rendition at t - 1 (exactly what it had emitted) plus the
snapshot of the new one at t, both at time t. Its output therefore accumulates to rendition 1
before t and to rendition 2 from t on, never a mixture. It reads under leased readers: one on the
metadata shard and one on each shard of the rendition it follows (as in Materialize: readers hold
read capabilities), so compaction can never take times it still has to read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import FormatError, InvalidInput
from headrace.persist import parts as P
from headrace.persist.client import DEFAULT_LEASE_S, PersistClient
from headrace.persist.errors import InvalidBounds, UpperMismatch
from headrace.persist.handles import ReadHandle

RENDITION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,60}$")


@dataclass(frozen=True)
class Rendition:
    collection: str
    name: str
    shards: int

    @property
    def shard_names(self) -> list[str]:
        return [f"{self.collection}~{self.name}~{i}" for i in range(self.shards)]


def _meta_rows(rows: list[tuple[str, int, str, int]], t: int) -> pa.Table:
    return pa.table({"rendition": pa.array([r[0] for r in rows], pa.string()),
                     "shards": pa.array([r[1] for r in rows], pa.int64()),
                     "role": pa.array([r[2] for r in rows], pa.string()),
                     "time": pa.array(np.full(len(rows), t, np.uint64)),
                     "diff": pa.array([r[3] for r in rows], pa.int64())})


class Collection:
    def __init__(self, client: PersistClient, name: str):
        if not RENDITION.match(name):
            raise InvalidInput(f"bad collection name {name!r}")
        self.client = client
        self.name = name
        self.meta_shard = f"{name}~meta"
        self.meta = client.read_only(self.meta_shard)

    @classmethod
    def create(cls, client: PersistClient, name: str, rendition: str,
               shards: int = 1) -> Collection:
        """Create the collection with ``rendition`` active from time 0 (idempotent)."""
        coll = cls(client, name)
        first = coll.rendition(rendition, shards)
        try:
            client.open_writer(coll.meta_shard).compare_and_append(
                _meta_rows([(first.name, shards, "active", 1)], 0), 0, 1)
        except UpperMismatch:
            if coll.active(0) != first:
                raise InvalidInput(
                    f"collection {name!r} exists with another first rendition") from None
        return coll

    def rendition(self, name: str, shards: int = 1) -> Rendition:
        """Name the shards of a (possibly new) rendition; writers write them directly."""
        if not RENDITION.match(name) or not 1 <= shards <= 4096:
            raise InvalidInput(f"bad rendition {name!r} / shard count {shards}")
        return Rendition(self.name, name, shards)

    create_rendition = rendition

    def meta_upper(self) -> int | None:
        return self.client.upper(self.meta_shard)

    def _roles(self, as_of: int, reader: ReadHandle | None = None) -> dict[str, list[Rendition]]:
        snap = (reader or self.meta).snapshot(as_of, timeout_s=0)
        out: dict[str, list[Rendition]] = {"active": [], "retired": []}
        for row in snap.to_pylist():
            if row["diff"] != 1 or row["role"] not in out:
                raise FormatError(self.meta_shard, None, f"bad metadata row {row} at {as_of}")
            out[row["role"]].append(Rendition(self.name, row["rendition"], row["shards"]))
        if len(out["active"]) != 1:
            raise FormatError(self.meta_shard, None,
                              f"{len(out['active'])} active renditions at {as_of}")
        return out

    def active(self, as_of: int, reader: ReadHandle | None = None) -> Rendition:
        return self._roles(as_of, reader)["active"][0]

    def rendition_upper(self, r: Rendition) -> int | None:
        ups = [self.client.upper(s) for s in r.shard_names]
        finite = [u for u in ups if u is not None]
        return min(finite) if finite else None

    def advance(self, new_upper: int) -> None:
        """Declare that no handover happens below ``new_upper`` (advances the meta upper)."""
        w = self.client.open_writer(self.meta_shard)
        w.append(_meta_rows([], 0).slice(0, 0), self.meta_upper() or 0, new_upper)

    def handover(self, new: Rendition, t_handover: int) -> None:
        """From ``t_handover`` on, ``new`` defines the collection. The old rendition must be
        complete below t_handover, and nothing may have been declared at or past it."""
        upper = self.meta_upper()
        if upper is None or t_handover < upper:
            raise InvalidBounds(f"handover at {t_handover} is below the meta upper {upper}")
        old = self.active(upper - 1)
        if old.name == new.name:
            raise InvalidInput(f"{new.name!r} is already active")
        old_upper = self.rendition_upper(old)
        if old_upper is not None and old_upper < t_handover:
            raise InvalidBounds(f"rendition {old.name!r} is only complete below {old_upper}")
        rows = [(old.name, old.shards, "active", -1), (old.name, old.shards, "retired", 1),
                (new.name, new.shards, "active", 1)]
        self.client.open_writer(self.meta_shard).compare_and_append(
            _meta_rows(rows, t_handover), upper, t_handover + 1)

    def gc(self) -> list[str]:
        """Delete the shards of renditions retired at or before the meta since: every reader of
        the metadata has promised never to read before that, so none can reach them."""
        since = self.client.since(self.meta_shard)
        upper = self.meta_upper()
        if upper is not None and since >= upper:
            return []
        deleted = []
        for r in self._roles(since)["retired"]:
            for shard in r.shard_names:
                if self.client.delete_shard(shard):
                    deleted.append(shard)
        return deleted

    def reader(self, as_of: int, *, lease_s: float = DEFAULT_LEASE_S) -> CollectionReader:
        return CollectionReader(self, as_of, lease_s=lease_s)


class CollectionReader:
    """Follows the metadata shard; ``poll()`` returns the updates newly available.

    Holds leased readers while it lives (heartbeated by its polls; ``close()`` expires them):
    opening it at an ``as_of`` the collection's since has passed raises SinceViolation."""

    def __init__(self, collection: Collection, as_of: int, *, lease_s: float = DEFAULT_LEASE_S):
        self.coll = collection
        self.client = collection.client
        self.lease_s = lease_s
        self.meta_reader = self.client.open_reader(collection.meta_shard, as_of=as_of,
                                                   lease_s=lease_s)
        self.readers: dict[str, ReadHandle] = {}  # shard of the followed rendition -> reader
        self.as_of = as_of
        self.current: Rendition | None = None
        self.frontier = as_of  # everything below has been emitted (after the first poll)
        self._since = 0  # what the readers were last downgraded to

    def _hold(self, r: Rendition, as_of: int) -> None:
        """Leased readers on ``r``'s shards, registered where ``as_of`` can still be read."""
        for shard in r.shard_names:
            if shard not in self.readers:
                self.readers[shard] = self.client.open_reader(shard, as_of=as_of,
                                                              lease_s=self.lease_s)

    def _release(self, r: Rendition) -> None:
        for shard in r.shard_names:
            reader = self.readers.pop(shard, None)
            if reader is not None:
                reader.expire()

    def _snapshot(self, r: Rendition, t: int, sign: int, at: int | None = None) -> pa.Table:
        """Rendition ``r`` consolidated at ``t``, times set to ``at`` (default t), times sign."""
        at = t if at is None else at
        tables = [self.readers[s].snapshot(t, timeout_s=0) for s in r.shard_names]
        snap = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        snap = snap.append_column(P.TIME, pa.array(np.full(snap.num_rows, at, np.uint64)))
        diff = snap.column(P.DIFF) if sign > 0 else pc.negate(snap.column(P.DIFF))
        return snap.set_column(snap.schema.get_field_index(P.DIFF), P.DIFF, diff)\
            .select(P.data_columns(snap.schema) + [P.TIME, P.DIFF])

    def _updates(self, r: Rendition, lo: int, hi: int) -> pa.Table:
        tables = [self.readers[s].updates_between(lo, hi, timeout_s=0) for s in r.shard_names]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def poll(self) -> list[pa.Table]:
        """Updates (with times, time-ordered) that became definite since the last poll."""
        out: list[pa.Table] = []
        if self.current is None:
            meta_upper = self.coll.meta_upper()
            if meta_upper is not None and meta_upper <= self.as_of:
                return out
            r = self.coll.active(self.as_of, self.meta_reader)
            self._hold(r, self.as_of)
            r_upper = self.coll.rendition_upper(r)
            if r_upper is not None and r_upper <= self.as_of:
                return out
            self.current = r
            out.append(self._snapshot(r, self.as_of, +1))
            self.frontier = self.as_of + 1
        while True:
            meta_upper = self.coll.meta_upper()
            meta_hi = meta_upper if meta_upper is not None else (1 << 64) - 1
            changes = self.meta_reader.updates_between(self.frontier, meta_hi, timeout_s=0)
            handovers = pc.filter(changes.column(P.TIME), pc.and_(
                pc.equal(changes.column("role"), "active"), pc.equal(changes.column(P.DIFF), 1)))
            h = int(pc.min(handovers).as_py()) if len(handovers) else None
            limit = h if h is not None else meta_hi
            r_upper = self.coll.rendition_upper(self.current)
            if r_upper is not None:
                limit = min(limit, r_upper)
            if limit > self.frontier:
                out.append(self._updates(self.current, self.frontier, limit).sort_by(P.TIME))
                self.frontier = limit
            if h is None or self.frontier != h:
                break
            new = self.coll.active(h, self.meta_reader)
            self._hold(new, h)
            new_upper = self.coll.rendition_upper(new)
            if new_upper is not None and new_upper <= h:
                break  # the new rendition has not reached t_handover yet
            if h > 0:
                out.append(self._snapshot(self.current, h - 1, -1, h))
            out.append(self._snapshot(new, h, +1))
            self._release(self.current)
            self.current, self.frontier = new, h + 1
        self._downgrade()
        return [t for t in out if t.num_rows]

    def _downgrade(self) -> None:
        """Promise never to read below frontier - 1 again: lets compaction advance."""
        since = self.frontier - 1
        if since <= self._since:
            for reader in (self.meta_reader, *self.readers.values()):
                reader._maybe_heartbeat()
            return
        self.meta_reader.downgrade_since(since)
        for shard in self.current.shard_names if self.current else ():
            self.readers[shard].downgrade_since(since)
        self._since = since

    def close(self) -> None:
        for shard in list(self.readers):
            self.readers.pop(shard).expire()
        self.meta_reader.expire()
