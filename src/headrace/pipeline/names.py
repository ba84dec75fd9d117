"""Internal column names. All start with ``__hr_``; a user column with that prefix is refused
when the pipeline is defined, so no user name can ever collide with the engine's own."""

from __future__ import annotations

PREFIX = "__hr_"
W = "__hr_w"  # the Z-set weight of a row (int64, never 0 in a consolidated set)
BUCKET = "__hr_bucket"  # the state bucket (key group) a row routes to
SIDE = "__hr_side"  # which input of a two-input operator a row belongs to
KIND = "__hr_kind"  # a stage row's kind: NULL for a data row, else what its control row holds
PAYLOAD = "__hr_payload"  # a control row's bytes
