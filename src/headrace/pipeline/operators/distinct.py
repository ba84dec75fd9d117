"""DISTINCT with retractions: a row is in the output (weight 1) while its net multiplicity is
positive; one whose multiplicity would fall below zero (retracted more often than inserted)
raises NegativeMultiplicity. Rows are compared after Spark's normalisation (-0.0 = 0.0, one
NaN), and the output row is the normalised one, as Spark's DISTINCT (a grouping on every
column) returns it. State: key = the normalised row encoding, val empty, w = the row's
multiplicity."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline.encoding import rowkeys as keys
from headrace.pipeline.errors import NegativeMultiplicity
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.operators.deltas import align, weights, zset
from headrace.pipeline.operators.kernel import (
    Kernel,
    KeyLayout,
    Rebucketable,
    RoutesKeys,
    StateSpine,
)
from headrace.zset import consolidate


class DistinctKernel(Kernel, RoutesKeys, Rebucketable):
    state_sides = 1

    def __init__(self, schema: pa.Schema):
        for f in schema:
            if f.name.startswith(PREFIX):
                raise InvalidInput(f"column {f.name!r} uses the reserved prefix {PREFIX!r}")
        self.codec = keys.RowCodec(schema, normalize=True)
        self.output_schema = self.codec.schema

    def key_layout(self, side: int) -> KeyLayout:
        """The row is the key."""
        return self.codec, 0

    def bucket_columns(self, input_index: int) -> list[str]:
        return list(self.output_schema.names)

    def route_keys(self, deltas: list[pa.Table]) -> list[tuple[int, pa.Array]]:
        """The state key of each delta row; see AggregateKernel.route_keys."""
        return [(0, self.codec.encode(deltas[0]))]

    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
        delta, state = deltas[0], states[0]
        empty = pa.schema(list(self.output_schema) + [pa.field(W, pa.int64())]).empty_table()
        if delta.num_rows == 0:
            return empty
        key = self.codec.encode(delta)
        d = consolidate(zset(key, pa.array([b""] * len(key), pa.binary()), weights(delta)))
        if d.num_rows == 0:
            return empty
        old = state.lookup_many(d["key"])
        oid, _ = align(old["key"], d["key"].combine_chunks())
        ow = np.zeros(d.num_rows, np.int64)
        np.add.at(ow, oid, np.asarray(old["w"].to_numpy(), np.int64))
        nw = ow + np.asarray(d["w"].to_numpy(), np.int64)
        bad = (nw < 0) & (nw < ow)  # a row retracted more often than it was inserted
        if bad.any():
            keys_ = d["key"].filter(pa.array(bad))
            row = self.codec.decode(keys_.slice(0, 1)).to_pylist()[0]
            raise NegativeMultiplicity(
                f"distinct row {row} would occur {int(nw[bad][0])} times", keys_.to_pylist())
        step = (nw > 0).astype(np.int64) - (ow > 0).astype(np.int64)
        state.insert_updates(d)
        keep = step != 0
        rows = self.codec.decode(d["key"].filter(pa.array(keep)))
        return rows.append_column(W, pa.array(step[keep], pa.int64()))
