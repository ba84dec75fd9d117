"""`headrace queue ...`: inspect, verify, stats, garbage-collect a buffer queue, and skip a batch
that cannot be read (recorded in the skip log). Nothing here bumps the epoch or dequeues."""

from __future__ import annotations

import dataclasses
import json

import click
from rich.console import Console
from rich.table import Table

from headrace.buffer import GarbageCollector, SkipRecord, fetch_block, read_manifest, read_skips
from headrace.buffer import skip_batch as record_skip
from headrace.buffer.config import DEFAULT_DATA_PREFIX, DEFAULT_MANIFEST_PATH
from headrace.buffer.gc import batch_file_ulid
from headrace.errors import HeadraceError
from headrace.store import CountingStore, open_store

_manifest_opt = click.option("--manifest-path", default=DEFAULT_MANIFEST_PATH, show_default=True)
_prefix_opt = click.option("--data-path-prefix", default=DEFAULT_DATA_PREFIX, show_default=True)


def _payload(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + b.hex()


@click.group("queue")
def queue_group() -> None:
    """The ingest buffer's queue manifest and batch files."""


@queue_group.command("inspect")
@click.argument("url")
@_manifest_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def inspect(url: str, manifest_path: str, as_json: bool) -> None:
    """Print the manifest: epoch, next sequence, entries with their metadata, recorded skips."""
    store = open_store(url)
    try:
        m = read_manifest(store, manifest_path)
        skips = read_skips(store, manifest_path)
    except HeadraceError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps({
            "manifest_path": manifest_path, "epoch": m.epoch, "next_sequence": m.next_sequence,
            "entry_count": len(m.entries),
            "entries": [{"sequence": e.sequence, "location": e.location, "metadata": [
                {"start_index": md.start_index, "ingestion_time_ms": md.ingestion_time_ms,
                 "payload": _payload(md.payload)} for md in e.metadata]} for e in m.entries],
            "skipped": [dataclasses.asdict(r) for r in skips.values()],
        }, indent=2))
        return
    table = Table("sequence", "location", "metadata (start_index @ time_ms: payload)")
    for e in m.entries:
        table.add_row(str(e.sequence), e.location, "; ".join(
            f"{md.start_index} @ {md.ingestion_time_ms}: {_payload(md.payload)}"
            for md in e.metadata))
    Console().print(table)
    click.echo(f"{len(m.entries)} entries, next_sequence {m.next_sequence}, epoch {m.epoch}, "
               f"{len(skips)} skips recorded")


@queue_group.command("verify")
@click.argument("url")
@_manifest_opt
@_prefix_opt
def verify(url: str, manifest_path: str, data_path_prefix: str) -> None:
    """Read every batch the manifest references; exit 1 on the first unreadable one that has no
    recorded skip."""
    store = open_store(url)
    records = skipped = 0
    try:
        m = read_manifest(store, manifest_path)
        for e in m.entries:
            got = fetch_block(store, manifest_path, e, data_path_prefix=data_path_prefix)
            if isinstance(got, SkipRecord):
                skipped += 1
            else:
                records += len(got.starts)
    except HeadraceError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"ok: {len(m.entries)} entries, {records} records, {skipped} skipped")


@queue_group.command("skip")
@click.argument("url")
@click.argument("sequence", type=int)
@click.option("--reason", required=True, help="Why (kept in the skip log for audit).")
@_manifest_opt
@_prefix_opt
def skip(url: str, sequence: int, reason: str, manifest_path: str,
         data_path_prefix: str) -> None:
    """Record that entry SEQUENCE is skipped because its batch cannot be read (missing,
    undecodable or at a refused location). Consumers then get it as an empty batch. Refused
    for a batch that reads fine."""
    try:
        r = record_skip(open_store(url), manifest_path, sequence, reason=reason,
                        data_path_prefix=data_path_prefix)
    except HeadraceError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"skipped sequence {r.sequence} ({r.location}, {r.cause}) by {r.actor}: "
               f"{r.reason}")


@queue_group.command("stats")
@click.argument("url")
@_manifest_opt
@_prefix_opt
def stats(url: str, manifest_path: str, data_path_prefix: str) -> None:
    """Queue length, bytes queued and batch files on the store (with request counts)."""
    store = CountingStore(open_store(url))
    m = read_manifest(store, manifest_path)
    referenced = {e.location for e in m.entries}
    files = [o for o in store.list(data_path_prefix.rstrip("/") + "/")
             if batch_file_ulid(o.key, data_path_prefix) is not None]
    queued = sum(o.size for o in files if o.key in referenced)
    out = {"queue_length": len(m.entries), "next_sequence": m.next_sequence, "epoch": m.epoch,
           "batch_files": len(files), "batch_bytes": sum(o.size for o in files),
           "queued_bytes": queued,
           "unreferenced_files": sum(1 for o in files if o.key not in referenced)}
    for k, v in out.items():
        click.echo(f"{k:<20} {v:,}")
    click.echo(f"requests: {store.counts()}")


@queue_group.command("gc")
@click.argument("url")
@_manifest_opt
@_prefix_opt
@click.option("--grace-period-s", default=600.0, show_default=True)
def gc(url: str, manifest_path: str, data_path_prefix: str, grace_period_s: float) -> None:
    """Delete batch files the queue no longer references (one collector cycle)."""
    result = GarbageCollector(open_store(url), manifest_path=manifest_path,
                              data_path_prefix=data_path_prefix,
                              grace_period_s=grace_period_s).run_once()
    click.echo(f"deleted {len(result.deleted)}, kept {result.kept}, failed {len(result.failed)}, "
               f"skipped {result.skipped} non-batch objects")


commands = [queue_group]
