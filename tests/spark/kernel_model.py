"""A dict Z-set with the StateSpine protocol: the reference model the kernels are checked with."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

from headrace.spark.kernels import ZSET_SCHEMA


class DictZSet:
    def __init__(self):
        self.rows: dict[str, dict[str, int]] = defaultdict(dict)

    def lookup_many(self, keys: pa.Array) -> pa.Table:
        out = {"key": [], "val": [], "w": []}
        for k in dict.fromkeys(keys.to_pylist()):
            for v, w in sorted(self.rows.get(k, {}).items()):
                out["key"].append(k)
                out["val"].append(v)
                out["w"].append(w)
        return pa.table(out, schema=ZSET_SCHEMA)

    def insert_updates(self, updates: pa.Table) -> None:
        for k, v, w in zip(*(updates[c].to_pylist() for c in ("key", "val", "w")), strict=True):
            cur = self.rows[k].get(v, 0) + w
            if cur:
                self.rows[k][v] = cur
            else:
                self.rows[k].pop(v, None)
