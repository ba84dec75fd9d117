"""`headrace queue ...`: inspect, verify, stats, garbage-collect a buffer queue, and skip a batch
that cannot be read (recorded in the skip log). Nothing here bumps the epoch or dequeues.

Every command opens the store with ``open_existing_store`` (a mistyped path creates nothing) and
needs the queue's manifest to exist: a missing one is ``Missing`` (exit 2, naming the queues
the store does hold), never an empty queue — for ``gc`` a mistyped ``--manifest-path`` would
otherwise make every batch file look unreferenced. Library errors propagate to the one-line
handler of ``headrace.cli.main``.
"""

from __future__ import annotations

import dataclasses

import click
from rich.markup import escape
from rich.table import Table

from headrace.buffer.config import DEFAULT_DATA_PREFIX, DEFAULT_MANIFEST_PATH
from headrace.cli.common import Missing, echo_json, json_option, open_existing_store, out_console
from headrace.store import ObjectStore

_manifest_opt = click.option("--manifest-path", default=DEFAULT_MANIFEST_PATH, show_default=True)
_prefix_opt = click.option("--data-path-prefix", default=DEFAULT_DATA_PREFIX, show_default=True)


def _payload(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + b.hex()


def _open_queue(url: str, manifest_path: str):
    """(store, manifest) of an existing queue; Missing naming the queues the store holds."""
    from headrace.buffer.manifest_format import decode_manifest
    from headrace.buffer.queue import read_manifest_bytes

    store = open_existing_store(url)
    data, etag = read_manifest_bytes(store, manifest_path)
    if etag is None:
        queues = _manifests(store)
        raise Missing("queue manifest", manifest_path, url, hint=(
            f"queues here: {', '.join(queues)}; pick one with --manifest-path" if queues
            else "this store holds no queue; a producer creates it with its first batch"))
    return store, decode_manifest(data, manifest_path)


def _manifests(store: ObjectStore) -> list[str]:
    return sorted(o.key for o in store.list("")
                  if o.key == "manifest" or o.key.endswith("/manifest"))


@click.group("queue")
def queue_group() -> None:
    """The ingest buffer's queue manifest and batch files."""


@queue_group.command("inspect")
@click.argument("url")
@_manifest_opt
@json_option
def inspect(url: str, manifest_path: str, as_json: bool) -> None:
    """Print the manifest: epoch, next sequence, entries with their metadata, recorded skips."""
    from headrace.buffer import read_skips

    store, m = _open_queue(url, manifest_path)
    skips = read_skips(store, manifest_path)
    if as_json:
        echo_json({
            "manifest_path": manifest_path, "epoch": m.epoch, "next_sequence": m.next_sequence,
            "entry_count": len(m.entries),
            "entries": [{"sequence": e.sequence, "location": e.location, "metadata": [
                {"start_index": md.start_index, "ingestion_time_ms": md.ingestion_time_ms,
                 "payload": _payload(md.payload)} for md in e.metadata]} for e in m.entries],
            "skipped": [dataclasses.asdict(r) for r in skips.values()],
        })
        return
    table = Table("sequence", "location", "metadata (start_index @ time_ms: payload)")
    for e in m.entries:
        table.add_row(str(e.sequence), escape(e.location), escape("; ".join(
            f"{md.start_index} @ {md.ingestion_time_ms}: {_payload(md.payload)}"
            for md in e.metadata)))
    out_console().print(table)
    click.echo(f"{len(m.entries)} entries, next_sequence {m.next_sequence}, epoch {m.epoch}, "
               f"{len(skips)} skips recorded")


@queue_group.command("verify")
@click.argument("url")
@_manifest_opt
@_prefix_opt
@json_option
def verify(url: str, manifest_path: str, data_path_prefix: str, as_json: bool) -> None:
    """Read every batch the manifest references; exit 1 on the first unreadable one that has no
    recorded skip (naming its sequence and location)."""
    from headrace.buffer import SkipRecord, fetch_block

    store, m = _open_queue(url, manifest_path)
    records = skipped = 0
    for e in m.entries:
        got = fetch_block(store, manifest_path, e, data_path_prefix=data_path_prefix)
        if isinstance(got, SkipRecord):
            skipped += 1
        else:
            records += len(got.starts)
    if as_json:
        echo_json({"manifest_path": manifest_path, "ok": True, "entries": len(m.entries),
                   "records": records, "skipped": skipped})
        return
    click.echo(f"ok: {len(m.entries)} entries, {records} records, {skipped} skipped")


@queue_group.command("skip")
@click.argument("url")
@click.argument("sequence", type=int)
@click.option("--reason", required=True, help="Why (kept in the skip log for audit).")
@_manifest_opt
@_prefix_opt
@json_option
def skip(url: str, sequence: int, reason: str, manifest_path: str,
         data_path_prefix: str, as_json: bool) -> None:
    """Record that entry SEQUENCE is skipped because its batch cannot be read (missing,
    undecodable or at a refused location). Consumers then get it as an empty batch. Refused
    for a batch that reads fine."""
    from headrace.buffer import skip_batch

    store, _ = _open_queue(url, manifest_path)
    r = skip_batch(store, manifest_path, sequence, reason=reason,
                   data_path_prefix=data_path_prefix)
    if as_json:
        echo_json(dataclasses.asdict(r))
        return
    click.echo(f"skipped sequence {r.sequence} ({r.location}, {r.cause}) by {r.actor}: "
               f"{r.reason}")


@queue_group.command("stats")
@click.argument("url")
@_manifest_opt
@_prefix_opt
@json_option
def stats(url: str, manifest_path: str, data_path_prefix: str, as_json: bool) -> None:
    """Queue length, bytes queued and batch files on the store (with request counts)."""
    from headrace.buffer.gc import batch_file_ulid
    from headrace.store import CountingStore

    store, m = _open_queue(url, manifest_path)
    store = CountingStore(store)
    referenced = {e.location for e in m.entries}
    files = [o for o in store.list(data_path_prefix.rstrip("/") + "/")
             if batch_file_ulid(o.key, data_path_prefix) is not None]
    out = {"queue_length": len(m.entries), "next_sequence": m.next_sequence, "epoch": m.epoch,
           "batch_files": len(files), "batch_bytes": sum(o.size for o in files),
           "queued_bytes": sum(o.size for o in files if o.key in referenced),
           "unreferenced_files": sum(1 for o in files if o.key not in referenced)}
    if as_json:
        echo_json({"manifest_path": manifest_path, **out, "requests": store.counts()})
        return
    for k, v in out.items():
        click.echo(f"{k:<20} {v:,}")
    click.echo(f"requests: {store.counts()}")


@queue_group.command("gc")
@click.argument("url")
@_manifest_opt
@_prefix_opt
@click.option("--grace-period-s", default=600.0, show_default=True)
@json_option
def gc(url: str, manifest_path: str, data_path_prefix: str, grace_period_s: float,
       as_json: bool) -> None:
    """Delete batch files the queue no longer references (one collector cycle)."""
    from headrace.buffer import GarbageCollector

    store, _ = _open_queue(url, manifest_path)
    result = GarbageCollector(store, manifest_path=manifest_path,
                              data_path_prefix=data_path_prefix,
                              grace_period_s=grace_period_s).run_once()
    if as_json:
        echo_json({"deleted": result.deleted, "failed": result.failed, "kept": result.kept,
                   "skipped": result.skipped})
        return
    click.echo(f"deleted {len(result.deleted)}, kept {result.kept}, failed {len(result.failed)}, "
               f"skipped {result.skipped} non-batch objects")


commands = [queue_group]
