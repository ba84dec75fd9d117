"""`headrace reservoir ...`: inspect, verify and compact a reservoir stream."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from headrace.errors import HeadraceError
from headrace.reservoir import ReservoirOptions, ReservoirStorage
from headrace.reservoir.verify import inspect_stream, verify_stream
from headrace.store import CountingStore, open_store


def _options(registry: str, stream_version: str | None) -> ReservoirOptions:
    return ReservoirOptions(registry=registry, stream_version=stream_version)


_common = [
    click.argument("url"),
    click.option("--stream", default="default", show_default=True, help="Stream name."),
    click.option("--stream-version", default=None, help="Stream version (opt-in versioning)."),
    click.option("--registry", type=click.Choice(["auto", "bundled", "file"]), default="auto",
                 show_default=True, help="Where the checkpoint registry lives."),
]


def common(fn):
    for deco in reversed(_common):
        fn = deco(fn)
    return fn


@click.group("reservoir")
def reservoir_group() -> None:
    """Reservoir page store (seed 000): checkpoints, files, pages."""


@reservoir_group.command("inspect")
@common
@click.option("--version", "version", type=int, default=None, help="Checkpoint version.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def inspect_cmd(url, stream, stream_version, registry, version, as_json) -> None:
    """Checkpoints, files with live ratios, and page counts."""
    info = inspect_stream(open_store(url), stream, version, _options(registry, stream_version))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    console = Console()
    console.print(f"[bold]{info['prefix']}[/] checkpoint {info['version']}: {info['pages']:,} "
                  f"pages, {info['page_bytes']:,} bytes, {len(info['files'])} files "
                  f"(recovery read {info['recovery_gets']} objects)")
    t = Table("checkpoint", "snapshot", "bundle", "crc64")
    for c in info["checkpoints"]:
        t.add_row(str(c["version"]), "yes" if c["snapshot"] else "", "yes" if c["bundle"] else "",
                  c["crc64"])
    console.print(t)
    t = Table("file id", "pages", "non-active", "size", "live bytes", "live ratio", "added at")
    for f in info["files"]:
        t.add_row(f["file_id"], str(f["pages"]), str(f["non_active"]), f"{f['size']:,}",
                  f"{f['live_bytes']:,}", f"{f['live_ratio']:.2%}", str(f["added_at"]))
    console.print(t)
    if info["pending_deletes"]:
        console.print(f"{len(info['pending_deletes'])} files awaiting deletion")


@reservoir_group.command("verify")
@common
@click.option("--version", "version", type=int, default=None, help="Checkpoint version.")
def verify_cmd(url, stream, stream_version, registry, version) -> None:
    """Check every CRC in the chain; exit 1 on a mismatch, naming the object and offset."""
    store = open_store(url)
    with Progress(transient=True) as progress:
        task = progress.add_task("verifying files", total=None)
        rep = verify_stream(store, stream, version, _options(registry, stream_version),
                            progress=lambda n: progress.advance(task, n))
    for p in rep.problems:
        click.echo(f"FAIL {p}", err=True)
    click.echo(f"checkpoint {rep.version}: {rep.checkpoints} checkpoints, {rep.files} files, "
               f"{rep.pages:,} pages, {rep.bytes_checked:,} bytes checked: "
               f"{'ok' if rep.ok else f'{len(rep.problems)} problems'}")
    sys.exit(0 if rep.ok else 1)


@reservoir_group.command("compact")
@common
@click.option("--sweep-grace", type=float, default=None,
              help="Also delete unreferenced objects older than this many seconds.")
def compact_cmd(url, stream, stream_version, registry, sweep_grace) -> None:
    """Repack sparse files into full ones (as a new checkpoint); optionally sweep orphans."""
    store = CountingStore(open_store(url))
    try:
        with ReservoirStorage.open(store, stream,
                                   options=_options(registry, stream_version)) as st:
            v = st.compact()
            click.echo(f"compacted into checkpoint {v}" if v is not None
                       else "nothing to compact")
            if sweep_grace is not None:
                swept = st.sweep_orphans(grace_s=sweep_grace)
                click.echo(f"swept {len(swept)} orphaned objects")
    except HeadraceError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"requests: {store.counts()}")


commands = [reservoir_group]
