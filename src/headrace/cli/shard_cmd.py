"""`headrace shard ...`: list, inspect, read, verify and garbage-collect persist shards."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from headrace.cli.common import (
    Missing,
    echo_json,
    json_option,
    open_existing_store,
    out_console,
)
from headrace.errors import InvalidInput


def _client(url: str):
    """A PersistClient on an existing store (persist is imported only once that is known)."""
    store = open_existing_store(url)
    from headrace.persist import PersistClient

    return PersistClient(store, auto_compact_at=None)


def _require_shard(client, url: str, shard: str) -> None:
    """A shard with no state version does not exist (the library would show it empty)."""
    from headrace.persist.consensus import validate_shard_name

    validate_shard_name(shard)
    shards = client.list_shards()
    if shard not in shards:
        raise Missing("shard", shard, url,
                      hint=(f"shards here: {', '.join(shards)}" if shards
                            else "this store holds no shard"))


def _summary(s) -> dict:
    return {"shard": s.shard, "seqno": s.seqno, "since": s.since, "upper": s.upper,
            "finished": s.upper is None, "parts": len(s.parts),
            "rows": sum(p.rows for p in s.parts), "bytes": sum(p.size for p in s.parts),
            "readers": len(s.leased) + len(s.critical)}


@click.group("shard")
def shard_group() -> None:
    """Persist shards (definite collections) on a store."""


@shard_group.command("ls")
@click.argument("url")
@json_option
def ls(url: str, as_json: bool) -> None:
    """One line per shard: since, upper, parts, readers."""
    client = _client(url)
    rows = [_summary(client.state(name)) for name in client.list_shards()]
    if as_json:
        echo_json({"shards": rows})
        return
    table = Table("shard", "seqno", "since", "upper", "parts", "rows", "bytes", "readers")
    for r in rows:
        table.add_row(escape(r["shard"]), str(r["seqno"]), str(r["since"]),
                      "finished" if r["finished"] else str(r["upper"]), str(r["parts"]),
                      f"{r['rows']:,}", f"{r['bytes']:,}", str(r["readers"]))
    out_console().print(table)
    click.echo(f"{len(rows)} shards")


@shard_group.command("inspect")
@click.argument("url")
@click.argument("shard")
@click.option("--json", "as_json", is_flag=True, help="Accepted for uniformity: the output is "
              "always JSON.")
def inspect(url: str, shard: str, as_json: bool) -> None:
    """The shard's current state version as JSON."""
    client = _client(url)
    _require_shard(client, url, shard)
    s = client.state(shard)
    schema = client.schema(shard)
    echo_json({
        "shard": s.shard, "seqno": s.seqno, "since": s.since, "upper": s.upper,
        "schema": str(schema) if schema else None,
        "parts": [p.__dict__ for p in s.parts],
        "leased_readers": [r.__dict__ for r in s.leased],
        "critical_readers": [r.__dict__ for r in s.critical],
        "written_ms": s.written_ms,
    })


@shard_group.command("read")
@click.argument("url")
@click.argument("shard")
@click.option("--as-of", "as_of", type=int, default=None,
              help="Snapshot time (default: upper - 1, the latest complete time).")
@click.option("--limit", type=int, default=50, show_default=True,
              help="At most this many rows (0: all).")
@json_option
def read(url: str, shard: str, as_of: int | None, limit: int, as_json: bool) -> None:
    """Print the consolidated snapshot at a time."""
    if limit < 0:
        raise click.BadParameter("must be >= 0", param_hint="--limit")
    client = _client(url)
    _require_shard(client, url, shard)
    state = client.state(shard)
    upper = state.upper
    if upper is None:  # finished: every written time is readable
        upper = max((p.upper for p in state.parts), default=0)
    if as_of is None:
        if upper == 0:
            raise InvalidInput(f"shard {shard!r} holds no complete time yet (upper 0): "
                               "nothing to read")
        as_of = upper - 1
    elif as_of >= upper:
        raise InvalidInput(f"--as-of {as_of} is not complete yet in shard {shard!r} "
                           f"(upper {upper}); use a time below it")
    if as_of < state.since:
        raise InvalidInput(f"--as-of {as_of} is below shard {shard!r}'s since {state.since}: "
                           "those times are compacted; use a time from since on")
    # lease-free: a read command writes nothing; a compaction racing it is a SinceViolation
    snap = client.read_only(shard, lease=False).snapshot(as_of, timeout_s=0)
    shown = snap if limit == 0 else snap.slice(0, limit)
    if as_json:
        echo_json({"shard": shard, "as_of": as_of, "rows": snap.num_rows,
                   "shown": shown.num_rows, "columns": snap.column_names,
                   "data": shown.to_pylist()})
        return
    table = Table(*snap.column_names, title=f"{shard} as of {as_of}: {snap.num_rows:,} rows")
    for row in shown.to_pylist():
        table.add_row(*(escape(str(v)) for v in row.values()))
    out_console().print(table)


@shard_group.command("verify")
@click.argument("url")
@click.argument("shard")
@json_option
def verify(url: str, shard: str, as_json: bool) -> None:
    """Decode the state and check every part's size, CRC32 and Parquet structure."""
    from headrace.persist.handles import read_parts_parallel

    client = _client(url)
    _require_shard(client, url, shard)
    s = client.state(shard)
    read_parts_parallel(client.store, list(s.parts))  # raises naming the first bad part
    if as_json:
        echo_json({"shard": shard, "ok": True, "seqno": s.seqno, "parts": len(s.parts),
                   "rows": sum(p.rows for p in s.parts)})
        return
    click.echo(f"ok: {shard} seqno {s.seqno}, {len(s.parts)} parts verified")


@shard_group.command("gc")
@click.argument("url")
@click.option("--grace-s", type=float, default=600.0, show_default=True,
              help="Only delete unreferenced parts older than this.")
@click.option("--dry-run", is_flag=True)
def gc(url: str, grace_s: float, dry_run: bool) -> None:
    """Delete parts no shard references and truncate old consensus versions."""
    res = _client(url).sweep(grace_s=grace_s, dry_run=dry_run)
    click.echo(f"{'would delete' if dry_run else 'deleted'} {res.parts_deleted} parts "
               f"({res.bytes_deleted:,} bytes) in {res.shards} shards; "
               f"{res.versions_truncated} state versions truncated")
