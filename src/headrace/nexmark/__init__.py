"""Nexmark for headrace: the auction event stream (persons, auctions, bids) and queries q0–q8.

- ``generator``: a deterministic, vectorised generator of the stream, following the published
  (Apache Beam / Flink) generator's semantics; Arrow tables per kind, and queue entries
  (columnar or JSON).
- ``producer``: writes N events into a headrace queue.
- ``queries``: q0–q8 in the fluent pipeline API, and the same queries as Spark batch SQL.

Importing this package does not import pyspark (``queries`` imports it when a query is built).
"""

from headrace.nexmark.generator import (
    KINDS,
    SCHEMAS,
    EventBatch,
    Generator,
    GeneratorConfig,
    columnar_entries,
    json_entries,
)

__all__ = ["KINDS", "SCHEMAS", "EventBatch", "Generator", "GeneratorConfig", "columnar_entries",
           "json_entries"]
