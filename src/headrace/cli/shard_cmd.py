"""`headrace shard ...`: list, inspect, read, verify and garbage-collect persist shards."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from headrace.persist import PersistClient
from headrace.persist.handles import read_parts_parallel


@click.group("shard")
def shard_group() -> None:
    """Persist shards (definite collections) on a store."""


@shard_group.command("ls")
@click.argument("url")
def ls(url: str) -> None:
    """One line per shard: since, upper, parts, readers."""
    client = PersistClient(url)
    table = Table("shard", "seqno", "since", "upper", "parts", "rows", "bytes", "readers")
    for name in client.list_shards():
        s = client.state(name)
        table.add_row(name, str(s.seqno), str(s.since),
                      "finished" if s.upper is None else str(s.upper), str(len(s.parts)),
                      f"{sum(p.rows for p in s.parts):,}", f"{sum(p.size for p in s.parts):,}",
                      str(len(s.leased) + len(s.critical)))
    Console().print(table)


@shard_group.command("inspect")
@click.argument("url")
@click.argument("shard")
def inspect(url: str, shard: str) -> None:
    """The shard's current state version as JSON."""
    client = PersistClient(url)
    s = client.state(shard)
    schema = client.schema(shard)
    click.echo(json.dumps({
        "shard": s.shard, "seqno": s.seqno, "since": s.since, "upper": s.upper,
        "schema": str(schema) if schema else None,
        "parts": [p.__dict__ for p in s.parts],
        "leased_readers": [r.__dict__ for r in s.leased],
        "critical_readers": [r.__dict__ for r in s.critical],
        "written_ms": s.written_ms,
    }, indent=2))


@shard_group.command("read")
@click.argument("url")
@click.argument("shard")
@click.option("--as-of", "as_of", type=int, default=None,
              help="Snapshot time (default: upper - 1, the latest complete time).")
@click.option("--limit", type=int, default=50, show_default=True)
def read(url: str, shard: str, as_of: int | None, limit: int) -> None:
    """Print the consolidated snapshot at a time."""
    client = PersistClient(url)
    if as_of is None:
        upper = client.upper(shard)
        if upper is None:
            upper = max((p.upper for p in client.state(shard).parts), default=0)
        if upper == 0:
            raise click.ClickException(f"shard {shard!r} is empty")
        as_of = upper - 1
    snap = client.read_only(shard).snapshot(as_of, timeout_s=0)
    table = Table(*snap.column_names, title=f"{shard} as of {as_of}: {snap.num_rows:,} rows")
    for row in snap.slice(0, limit).to_pylist():
        table.add_row(*(str(v) for v in row.values()))
    Console().print(table)


@shard_group.command("verify")
@click.argument("url")
@click.argument("shard")
def verify(url: str, shard: str) -> None:
    """Decode the state and check every part's size, CRC32 and Parquet structure."""
    client = PersistClient(url)
    s = client.state(shard)
    read_parts_parallel(client.store, list(s.parts))
    click.echo(f"ok: {shard} seqno {s.seqno}, {len(s.parts)} parts verified")


@shard_group.command("gc")
@click.argument("url")
@click.option("--grace-s", type=float, default=600.0, show_default=True,
              help="Only delete unreferenced parts older than this.")
@click.option("--dry-run", is_flag=True)
def gc(url: str, grace_s: float, dry_run: bool) -> None:
    """Delete parts no shard references and truncate old consensus versions."""
    res = PersistClient(url).sweep(grace_s=grace_s, dry_run=dry_run)
    click.echo(f"{'would delete' if dry_run else 'deleted'} {res.parts_deleted} parts "
               f"({res.bytes_deleted:,} bytes) in {res.shards} shards; "
               f"{res.versions_truncated} state versions truncated")


commands = [shard_group]
