"""`headrace nexmark URL QUEUE --events N`: produce N events of the Nexmark stream into a queue.

The stream is ``headrace.nexmark``'s deterministic generator: the same ``--seed``, ``--rate``
and event range always give the same events, so a second call with ``--start N`` continues the
stream. Entries are ``{"table": "person"|"auction"|"bid", "w": 1, ...}``; a pipeline reads them
with ``p.read_queue(QUEUE, headrace.nexmark.SCHEMAS)``. This command writes (it creates the
store folder and the queue if they do not exist).
"""

from __future__ import annotations

import click
from rich.table import Table

from headrace.cli.common import echo_json, err_console, json_option, out_console


@click.command("nexmark")
@click.argument("url")
@click.argument("queue")
@click.option("--events", required=True, type=click.IntRange(min=1),
              help="How many events to produce (persons, auctions, bids in 1:3:46).")
@click.option("--rate", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Events per second of event time (dateTime advances 1/rate s per event).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0, max=2**63 - 1))
@click.option("--start", default=0, show_default=True, type=click.IntRange(min=0),
              help="Id of the first event: continue an earlier run's stream.")
@click.option("--batch-events", default=10_000, show_default=True,
              type=click.IntRange(min=1), help="Events per queue batch.")
@click.option("--entries", default="columnar", show_default=True,
              type=click.Choice(["columnar", "json"]),
              help="Entry format: columnar (Arrow, read with no parse) or json (one per event).")
@json_option
def nexmark(url: str, queue: str, events: int, rate: int, seed: int, start: int,
            batch_events: int, entries: str, as_json: bool) -> None:
    """Produce N Nexmark events (persons, auctions, bids) into QUEUE at URL."""
    from headrace.nexmark import GeneratorConfig
    from headrace.nexmark.producer import produce_events
    from headrace.store import open_store

    store = open_store(url)
    cfg = GeneratorConfig(seed=seed, rate=rate)
    progress = None if as_json else err_console()

    def on_batch(s) -> None:
        if progress is not None and progress.is_terminal:
            progress.print(f"{s.events:,} / {events:,} events", end="\r")

    summary = produce_events(None, queue, events, config=cfg, start=start,
                             batch_events=batch_events, store=store, on_batch=on_batch,
                             entries=entries)
    out = {"url": store.url, **summary.as_dict(), "seed": seed, "rate": rate,
           "entries": entries}
    if as_json:
        echo_json(out)
        return
    t = Table(title=f"nexmark -> queue {queue!r}", show_header=False)
    for key, value in out.items():
        t.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    out_console().print(t)
    click.echo(f"read it with Pipeline.read_queue({queue!r}, headrace.nexmark.SCHEMAS)")
