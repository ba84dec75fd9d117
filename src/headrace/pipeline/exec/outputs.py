"""Output shards: parts uploaded by tasks, linked by the driver with one CAS per shard.

A task uploads its share of a sink's output as a persist part (or, when it is small, hands it
to the driver inline); the driver writes the inline leftovers of all tasks as one part and links
every part into the shard at time t with one compare-and-set. No output row passes through the
driver except those leftovers (at most tasks × INLINE_MAX bytes, whatever the batch size).
A replayed batch whose output is already linked (the shard's upper is past t) is a no-op.
"""

from __future__ import annotations

import pickle
from collections import defaultdict

import pyarrow as pa

from headrace.persist import upload_part
from headrace.pipeline.encoding.ipc import table_from_ipc

TIME, DIFF = "time", "diff"  # the output shard's columns (persist's update layout)


def upload_task_part(store, shard: str, writer_id: str, table: pa.Table, persist_root: str):
    """Task side: upload ``table`` (data columns, time, diff) as a part of ``shard`` under the
    driver's registered writer id (one PUT, no consensus access); returns its PartMeta."""
    return upload_part(store, shard, writer_id, table, root=persist_root)


class OutputCollector:
    """Gathers the control rows that describe a micro-batch's output parts, per shard."""

    def __init__(self):
        self.parts: dict[str, list] = defaultdict(list)
        self.inline: dict[str, list[pa.Table]] = defaultdict(list)

    def add(self, kind: str, payload: bytes) -> None:
        shard, item = pickle.loads(payload)
        if kind == "part":
            self.parts[shard].append(item)
        else:
            self.inline[shard].append(table_from_ipc(item))

    @property
    def inline_bytes(self) -> int:
        return sum(t.nbytes for ts in self.inline.values() for t in ts)

    def link(self, persist, shard: str, schema: pa.Schema, t: int) -> bool:
        """Link this batch's parts into ``shard`` at time t (one CAS); False if a run before a
        crash already did (then the parts must equal what it linked: DefinitenessViolation)."""
        parts = list(self.parts.get(shard, []))
        small = self.inline.get(shard)
        writer = persist.open_writer(shard)
        wid = writer.register()
        if small:
            table = pa.concat_tables(small).select([*schema.names, TIME, DIFF])
            parts.append(upload_task_part(persist.store, shard, wid, table, persist.root))
        if not parts:
            try:
                writer.link_parts([], t, t + 1, schema)
                return True
            except Exception:  # noqa: BLE001 - decide on the shard's real upper below
                if (writer.upper() or 0) > t:
                    return False
                raise
        return writer.append_parts(parts, t, t + 1)
