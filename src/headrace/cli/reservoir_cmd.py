"""`headrace reservoir ...`: inspect, verify and compact a reservoir stream."""

from __future__ import annotations

import re

import click
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from headrace.cli.common import (
    Missing,
    echo_json,
    err_console,
    json_option,
    open_existing_store,
    out_console,
)
from headrace.store import CountingStore, ObjectStore

# headrace.reservoir is imported where used, once the store is known to exist: it costs a good
# part of a second of start-up that a mistyped path should not pay.

_STREAM_DIR = re.compile(r"^([^/]+)/v/([^/]+)/(?:ckpt/|registry$)")


def _options(registry: str, stream_version: str | None):
    from headrace.reservoir import ReservoirOptions

    return ReservoirOptions(registry=registry, stream_version=stream_version)


def _require_stream(store: ObjectStore, url: str, stream: str,
                    stream_version: str | None) -> None:
    """A stream with no checkpoint and no registry does not exist: say so, naming the streams
    that do (the library would recover it as empty, version 0)."""
    from headrace.reservoir.keys import stream_prefix
    from headrace.reservoir.options import check_stream_name

    prefix = stream_prefix(check_stream_name(stream), stream_version)
    if next(iter(store.list(f"{prefix}/ckpt/")), None) is not None \
            or store.exists(f"{prefix}/registry"):
        return
    found = sorted({f"{m[1]}" + ("" if m[2] == "default" else f" (--stream-version {m[2]})")
                    for k in (o.key for o in store.list("")) if (m := _STREAM_DIR.match(k))})
    name = stream if stream_version is None else f"{stream} (version {stream_version})"
    raise Missing("reservoir stream", name, url,
                  hint=(f"streams here: {', '.join(found)}; pick one with --stream" if found
                        else "this store holds no reservoir stream"))


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
    """The page store after Flowtide's Reservoir: checkpoints, files, pages."""


@reservoir_group.command("inspect")
@common
@click.option("--version", "version", type=int, default=None, help="Checkpoint version.")
@json_option
def inspect_cmd(url, stream, stream_version, registry, version, as_json) -> None:
    """Checkpoints, files with the share of their bytes still live, and page counts.

    "live" is live bytes / file size (the rest is pages later rewritten or deleted);
    "compact" marks files `reservoir compact` would repack: live bytes below
    compaction_ratio_threshold x max_file_size (the defaults, as compact uses)."""
    from headrace.reservoir.verify import inspect_stream

    store = open_existing_store(url)
    _require_stream(store, url, stream, stream_version)
    opts = _options(registry, stream_version)
    info = inspect_stream(store, stream, version, opts)
    limit = opts.compaction_ratio_threshold * opts.max_file_size
    for f in info["files"]:
        # the library's "live_ratio" is live bytes / max_file_size, which reads as "share of
        # this file that is live" but is not: replace it with the two things it mixes up
        f.pop("live_ratio", None)
        f["live_fraction"] = round(f["live_bytes"] / f["size"], 4) if f["size"] else 0.0
        f["compaction_candidate"] = f["live_bytes"] < limit
    info["compaction_threshold_bytes"] = int(limit)
    if as_json:
        echo_json(info)
        return
    console = out_console()
    console.print(f"[bold]{escape(info['prefix'])}[/] checkpoint {info['version']}: "
                  f"{info['pages']:,} pages, {info['page_bytes']:,} bytes, "
                  f"{len(info['files'])} files (recovery read {info['recovery_gets']} objects)")
    t = Table("checkpoint", "snapshot", "bundle", "crc64")
    for c in info["checkpoints"]:
        t.add_row(str(c["version"]), "yes" if c["snapshot"] else "", "yes" if c["bundle"] else "",
                  c["crc64"])
    console.print(t)
    t = Table("file id", "pages", "non-active", "size", "live bytes", "live (of size)",
              "compact", "added at")
    for f in info["files"]:
        t.add_row(f["file_id"], str(f["pages"]), str(f["non_active"]), f"{f['size']:,}",
                  f"{f['live_bytes']:,}", f"{f['live_fraction']:.2%}",
                  "yes" if f["compaction_candidate"] else "", str(f["added_at"]))
    console.print(t)
    console.print(f"compact: live bytes below {int(limit):,} (threshold "
                  f"{opts.compaction_ratio_threshold:g} x max file size {opts.max_file_size:,})")
    if info["pending_deletes"]:
        console.print(f"{len(info['pending_deletes'])} files awaiting deletion")


@reservoir_group.command("verify")
@common
@click.option("--version", "version", type=int, default=None, help="Checkpoint version.")
@json_option
def verify_cmd(url, stream, stream_version, registry, version, as_json) -> None:
    """Check every CRC in the chain; exit 1 on a mismatch, naming the object and offset."""
    from headrace.reservoir.verify import verify_stream

    store = open_existing_store(url)
    _require_stream(store, url, stream, stream_version)
    console = err_console()
    with Progress(transient=True, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("verifying files", total=None)
        rep = verify_stream(store, stream, version, _options(registry, stream_version),
                            progress=lambda n: progress.advance(task, n))
    if as_json:
        echo_json({"stream": stream, "stream_version": stream_version, "ok": rep.ok,
                   "checkpoint": rep.version, "checkpoints": rep.checkpoints,
                   "files": rep.files, "pages": rep.pages, "bytes_checked": rep.bytes_checked,
                   "problems": rep.problems})
    else:
        for p in rep.problems:
            click.echo(f"FAIL {p}")
        click.echo(f"checkpoint {rep.version}: {rep.checkpoints} checkpoints, {rep.files} files, "
                   f"{rep.pages:,} pages, {rep.bytes_checked:,} bytes checked: "
                   f"{'ok' if rep.ok else f'{len(rep.problems)} problems'}")
    if not rep.ok:
        click.echo(f"Error: stream {stream!r} failed verification: {rep.problems[0]} "
                   "(hint: the object named is damaged; restore it or the stream)", err=True)
        raise click.exceptions.Exit(1)


@reservoir_group.command("compact")
@common
@click.option("--sweep-grace", type=float, default=None,
              help="Also delete unreferenced objects older than this many seconds.")
def compact_cmd(url, stream, stream_version, registry, sweep_grace) -> None:
    """Repack sparse files into full ones (as a new checkpoint); optionally sweep orphans."""
    store = CountingStore(open_existing_store(url))
    _require_stream(store, url, stream, stream_version)
    from headrace.reservoir import ReservoirStorage

    with ReservoirStorage.open(store, stream, options=_options(registry, stream_version)) as st:
        v = st.compact()
        click.echo(f"compacted into checkpoint {v}" if v is not None else "nothing to compact")
        if sweep_grace is not None:
            swept = st.sweep_orphans(grace_s=sweep_grace)
            click.echo(f"swept {len(swept)} orphaned objects")
    click.echo(f"requests: {store.counts()}")
