"""The stateless pass-through: a sink's stage behind a stateless node (a filter, a projection,
a source table) writes the delta as it comes, with no state and no shuffle."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from headrace.pipeline.names import W
from headrace.pipeline.operators.kernel import Kernel, StateSpine


class IdentityKernel(Kernel):
    state_sides = 0

    def __init__(self, schema: pa.Schema):
        self.output_schema = schema

    def bucket_columns(self, input_index: int) -> list[str]:
        return []

    def apply(self, deltas: list[pa.Table], states: Sequence[StateSpine]) -> pa.Table:
        (delta,) = deltas
        return delta.select([*self.output_schema.names, W])
