"""`headrace store ...`: look at any store the way headrace sees it."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from headrace.store import CountingStore, open_store


@click.group("store")
def store_group() -> None:
    """Inspect an object store (any URL headrace accepts)."""


@store_group.command("ls")
@click.argument("url")
@click.option("--prefix", default="", help="Only keys starting with this.")
def ls(url: str, prefix: str) -> None:
    """List objects with size and etag."""
    store = open_store(url)
    table = Table("key", "size", "etag")
    total = n = 0
    for m in store.list(prefix):
        table.add_row(m.key, f"{m.size:,}", m.etag)
        total += m.size
        n += 1
    Console().print(table)
    click.echo(f"{n} objects, {total:,} bytes")


@store_group.command("cat")
@click.argument("url")
@click.argument("key")
def cat(url: str, key: str) -> None:
    """Write one object's bytes to stdout."""
    sys.stdout.buffer.write(open_store(url).get(key).data)


@store_group.command("check")
@click.argument("url")
def check(url: str) -> None:
    """Write, read back, conditionally update and delete a probe object; print request counts."""
    from headrace.errors import PreconditionFailed
    from headrace.store import CREATE, IfMatch

    store = CountingStore(open_store(url))
    key = "_headrace_probe/object"
    store.delete(key)
    e1 = store.put(key, b"probe-1", CREATE)
    assert store.get(key).data == b"probe-1"
    store.put(key, b"probe-2", IfMatch(e1))
    try:
        store.put(key, b"probe-3", IfMatch(e1))
        raise click.ClickException("store accepted a stale etag: conditional writes are broken")
    except PreconditionFailed:
        pass
    store.delete(key)
    click.echo(f"ok: {store.url} supports create / if-match; requests: {store.counts()}")


commands = [store_group]
