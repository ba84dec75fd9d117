"""Reclocking and Materialize's source-ingestion recipe.

A remap shard binds source addresses to times: rows ``(source: string, address: int64)`` whose
snapshot at time t is, per source, the address frontier that is available at t — every message with
an address below it has become data at a time <= t. Bindings only move forward (monotonic), and
are proposed with compare_and_append, so of contending proposals exactly one lands; a pipeline
uses what it *reads back* (``addresses_at``), never what it proposed.

``resume_point`` is the recipe's step 1: t = min upper over outputs and state; restart each
source from the addresses bound at t - 1 and produce times >= t.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput
from headrace.persist.client import PersistClient
from headrace.persist.errors import InvalidBounds

SOURCE, ADDRESS = "source", "address"
MAX_ADDRESS = (1 << 63) - 1


class RemapShard:
    def __init__(self, client: PersistClient, shard: str):
        self.client = client
        self.shard = shard
        self.writer = client.open_writer(shard)
        self.reader = client.read_only(shard)

    def upper(self) -> int | None:
        return self.client.upper(self.shard)

    def addresses_at(self, time: int) -> dict[str, int]:
        """The bound address frontier per source at ``time`` (needs time < upper)."""
        upper = self.upper()
        if upper is not None and time >= upper:
            raise InvalidBounds(f"remap {self.shard!r}: time {time} is not bound yet "
                                f"(upper {upper})")
        snap = self.reader.snapshot(time, timeout_s=0)
        if snap.num_rows == 0:
            return {}
        if pc.any(pc.not_equal(snap.column("diff"), 1)).as_py() or \
                len(pc.unique(snap.column(SOURCE))) != snap.num_rows:
            raise InvalidInput(f"remap {self.shard!r} at {time} is not one address per source")
        return dict(zip(snap.column(SOURCE).to_pylist(), snap.column(ADDRESS).to_pylist(),
                        strict=True))

    def reclock(self, addresses: dict[str, int], time: int | None = None) -> int:
        """Bind ``addresses`` at ``time`` (default: the current upper); returns the time.

        Raises UpperMismatch if another instance bound that time first: read it back with
        ``addresses_at``. An address below its current binding is an InvalidInput.
        """
        upper = self.upper()
        if upper is None:
            raise InvalidBounds(f"remap {self.shard!r} is finished")
        t = upper if time is None else time
        if t < upper:
            raise InvalidBounds(f"time {t} is below the remap upper {upper}: already bound")
        current = self.addresses_at(upper - 1) if upper > 0 else {}
        sources, addrs, diffs = [], [], []
        for source, address in sorted(addresses.items()):
            if not isinstance(source, str) or type(address) is not int or \
                    not 0 <= address <= MAX_ADDRESS:
                raise InvalidInput(f"bad binding {source!r} -> {address!r}")
            old = current.get(source)
            if old is not None and address < old:
                raise InvalidInput(f"source {source!r} would go back from {old} to {address}")
            if old == address:
                continue
            if old is not None:
                sources.append(source)
                addrs.append(old)
                diffs.append(-1)
            sources.append(source)
            addrs.append(address)
            diffs.append(1)
        updates = pa.table({SOURCE: pa.array(sources, pa.string()),
                            ADDRESS: pa.array(addrs, pa.int64()),
                            "time": pa.array(np.full(len(diffs), t, np.uint64)),
                            "diff": pa.array(diffs, pa.int64())})
        self.writer.compare_and_append(updates, upper, t + 1)
        return t

    def time_for(self, source: str, address: int) -> int | None:
        """The first bound time at which ``address`` of ``source`` is available, if any."""
        upper = self.upper()
        if not upper:
            return None
        ups = self.reader.updates_between(0, upper)
        mask = pc.and_(pc.and_(pc.equal(ups.column(SOURCE), source),
                               pc.equal(ups.column("diff"), 1)),
                       pc.greater(ups.column(ADDRESS), address))
        hits = ups.filter(mask).column("time")
        return int(pc.min(hits).as_py()) if len(hits) else None


@dataclass(frozen=True)
class ResumePoint:
    time: int | None  # None: every shard is finished
    addresses: dict[str, int]
    uppers: dict[str, int | None]


def resume_point(client: PersistClient, output_shards: list[str], state_shards: list[str],
                 remap: RemapShard) -> ResumePoint:
    """The recipe's consistent restart point: t = min upper of outputs and state, with the
    source addresses bound at t - 1 (all messages below them are already reflected)."""
    uppers = {s: client.upper(s) for s in [*output_shards, *state_shards]}
    finite = [u for u in uppers.values() if u is not None]
    if not finite:
        return ResumePoint(None, {}, uppers)
    t = min(finite)
    addresses = remap.addresses_at(t - 1) if t > 0 else {}
    return ResumePoint(t, addresses, uppers)
