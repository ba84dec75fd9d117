"""Write Nexmark events into a headrace queue: one queue batch per ``batch_events`` events.

Each batch is generated (vectorised), turned into columnar entries (Arrow record batches of
each kind, read with no parse; ``entries="json"``: one JSON entry ``{"table": kind, "w": 1,
...}`` per event, in event-id order) and handed to the buffer's
:class:`~headrace.buffer.Producer` in one ``produce`` call followed by ``flush``, so a queue
batch holds exactly the events of one generated batch (a pipeline with ``batches_per_trigger=1``
then sees ``batch_events`` events per micro-batch). Returns once every
entry is durable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from headrace.errors import InvalidInput
from headrace.nexmark.generator import (
    KINDS,
    Generator,
    GeneratorConfig,
    columnar_entries,
    iso_ms,
    json_entries,
)

MAX_BATCH_BYTES = 64 * 1024 * 1024  # the producer's flush size; a batch past it is refused
DEFAULT_BATCH_EVENTS = 10_000


@dataclass
class ProduceSummary:
    queue: str
    first_event: int
    events: int = 0
    batches: int = 0
    entry_bytes: int = 0
    per_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    first_time_ms: int | None = None
    last_time_ms: int | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"queue": self.queue, "first_event": self.first_event, "events": self.events,
                "batches": self.batches, "entry_bytes": self.entry_bytes,
                **{f"{k}s": v for k, v in self.per_kind.items()},
                "first_event_time": _iso(self.first_time_ms),
                "last_event_time": _iso(self.last_time_ms),
                "seconds": round(self.seconds, 3),
                "events_per_s": round(self.events / self.seconds, 1) if self.seconds else 0.0}


def produce_events(url: str | None, queue: str, count: int, *,
                   config: GeneratorConfig | None = None, start: int = 0,
                   batch_events: int = DEFAULT_BATCH_EVENTS, store=None,
                   on_batch: Callable[[ProduceSummary], None] | None = None,
                   entries: str = "columnar") -> ProduceSummary:
    """Produce events ``[start, start + count)`` of ``config``'s stream into ``queue`` (manifest
    ``{queue}/manifest``, batch files under ``{queue}/``) at ``url`` (or ``store``), as
    ``entries`` ("columnar" or "json")."""
    from headrace.buffer import Producer, ProducerConfig

    encode = {"columnar": columnar_entries, "json": json_entries}.get(entries)
    if encode is None:
        raise InvalidInput(f"nexmark entries: 'columnar' or 'json', got {entries!r}")
    for name, value, low in (("count", count, 1), ("start", start, 0),
                             ("batch_events", batch_events, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidInput(f"nexmark {name}: must be an integer >= {low}, got {value!r}")
    gen = Generator(config)
    cfg = ProducerConfig(url=url, store=store, data_path_prefix=queue,
                         manifest_path=f"{queue}/manifest", flush_interval_s=3600.0,
                         flush_size_bytes=MAX_BATCH_BYTES)
    summary = ProduceSummary(queue=queue, first_event=start)
    t0 = time.perf_counter()
    with Producer(cfg) as producer:
        for batch in gen.batches(count, batch_events, start):
            payloads = encode(batch)
            size = sum(map(len, payloads))
            if size > MAX_BATCH_BYTES:
                raise InvalidInput(f"nexmark batch of {batch.count} events starting at event "
                                   f"{batch.start} is {size} bytes of entries, more than one "
                                   f"queue batch may hold ({MAX_BATCH_BYTES}); use fewer "
                                   "batch_events")
            handle = producer.produce(payloads)
            producer.flush()
            handle.watcher.await_durable()
            summary.events += batch.count
            summary.batches += 1
            summary.entry_bytes += size
            for kind in KINDS:
                t = batch.tables[kind]
                summary.per_kind[kind] += t.num_rows
                if t.num_rows:
                    lo, hi = _ms(t["dateTime"][0]), _ms(t["dateTime"][-1])
                    summary.first_time_ms = lo if summary.first_time_ms is None \
                        else min(summary.first_time_ms, lo)
                    summary.last_time_ms = hi if summary.last_time_ms is None \
                        else max(summary.last_time_ms, hi)
            summary.seconds = time.perf_counter() - t0
            if on_batch is not None:
                on_batch(summary)
    summary.seconds = time.perf_counter() - t0
    return summary


def _iso(ms: int | None) -> str | None:
    return None if ms is None else iso_ms(np.array([ms])).to_pylist()[0]


def _ms(scalar) -> int:
    return int(scalar.cast("int64").as_py())
