"""`headrace store ...`: look at any store the way headrace sees it."""

from __future__ import annotations

import base64
import sys

import click
from rich.markup import escape
from rich.table import Table

from headrace.cli.common import Missing, echo_json, json_option, open_existing_store, out_console
from headrace.errors import NotFound
from headrace.store import CountingStore, open_store


@click.group("store")
def store_group() -> None:
    """Inspect an object store (any URL headrace accepts)."""


@store_group.command("ls")
@click.argument("url")
@click.option("--prefix", default="", help="Only keys starting with this.")
@json_option
def ls(url: str, prefix: str, as_json: bool) -> None:
    """List objects with size and etag."""
    metas = list(open_existing_store(url).list(prefix))
    if prefix and not metas:
        raise Missing("objects under prefix", prefix, url,
                      hint="`headrace store ls URL` lists every key")
    if as_json:
        echo_json({"objects": [{"key": m.key, "size": m.size, "etag": m.etag,
                                "last_modified": m.last_modified} for m in metas],
                   "count": len(metas), "bytes": sum(m.size for m in metas)})
        return
    table = Table("key", "size", "etag")
    for m in metas:
        table.add_row(escape(m.key), f"{m.size:,}", m.etag)
    out_console().print(table)
    click.echo(f"{len(metas)} objects, {sum(m.size for m in metas):,} bytes")


@store_group.command("cat")
@click.argument("url")
@click.argument("key")
@json_option
def cat(url: str, key: str, as_json: bool) -> None:
    """Write one object's bytes to stdout (--json: its etag, size and base64 bytes)."""
    try:
        res = open_existing_store(url).get(key)
    except NotFound as e:
        if isinstance(e, Missing):
            raise
        raise Missing("object", key, url,
                      hint="`headrace store ls URL --prefix P` lists the keys") from None
    if as_json:
        echo_json({"key": key, "etag": res.etag, "size": len(res.data),
                   "base64": base64.b64encode(res.data).decode()})
        return
    sys.stdout.buffer.write(res.data)


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
    if store.get(key).data != b"probe-1":
        raise click.ClickException("the store returned other bytes than were written")
    store.put(key, b"probe-2", IfMatch(e1))
    try:
        store.put(key, b"probe-3", IfMatch(e1))
        raise click.ClickException("store accepted a stale etag: conditional writes are broken")
    except PreconditionFailed:
        pass
    store.delete(key)
    click.echo(f"ok: {store.url} supports create / if-match; requests: {store.counts()}")
