"""`headrace backup [create] DIR URL`, `backup ls|sweep|show|verify` and `headrace restore`."""

from __future__ import annotations

import datetime as dt
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as RichProgress
from rich.table import Table

from headrace.backup import (
    BackupConfig,
    BackupManager,
    Progress,
    RestoreManager,
    verify_snapshot,
)
from headrace.backup.index import blob_expiry_ms
from headrace.errors import HeadraceError
from headrace.store import CountingStore, open_store

_prefix_option = click.option("--prefix", default="backup", show_default=True,
                              help="Key prefix of the backup inside the store.")


@contextmanager
def _progress_bar(label: str):
    """A rich progress bar fed by the managers' progress callback."""
    with RichProgress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TextColumn("{task.fields[files]}"),
                      TimeRemainingColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=None, files="")

        def update(p: Progress) -> None:
            bar.update(task, completed=p.bytes_done, total=p.bytes_total or None,
                       files=f"{p.files_done}/{p.files_total} files")

        yield update


def _fail(e: HeadraceError) -> click.ClickException:
    return click.ClickException(f"{type(e).__name__}: {e}")


class _DefaultCreateGroup(click.Group):
    """``headrace backup DIR URL --checkpoint-id ID`` (the documented short form) is
    ``headrace backup create DIR URL ...``: a first argument that names no subcommand is the
    directory of a ``create``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["create", *args]
        return super().parse_args(ctx, args)


@click.group("backup", cls=_DefaultCreateGroup)
def backup_group() -> None:
    """Incremental snapshots of a local state directory on an object store (seed 002).

    `headrace backup DIR URL --checkpoint-id ID` is short for `headrace backup create ...`."""


@backup_group.command("create")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.argument("url")
@click.option("--checkpoint-id", required=True, help="The caller's checkpoint id to record.")
@click.option("--previous", default=None, help="Index id of the last committed snapshot "
              "(only new and mutable files are uploaded).")
@click.option("--workers", default=4, show_default=True, help="Parallel uploads.")
@click.option("--chunk-mb", default=16, show_default=True, help="Chunk size of large files.")
@click.option("--no-commit", is_flag=True, help="Upload only; do not remove the TTL (cleanup).")
@_prefix_option
def create(directory: str, url: str, checkpoint_id: str, previous: str | None, workers: int,
           chunk_mb: int, no_commit: bool, prefix: str) -> None:
    """Back up DIRECTORY to URL; prints the new index blob id."""
    store = CountingStore(open_store(url))
    try:
        cfg = BackupConfig(upload_workers=workers, chunk_size=chunk_mb << 20)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    try:
        with _progress_bar("upload") as update, BackupManager(
                store, prefix=prefix, config=cfg, previous_index_blob_id=previous,
                progress=update) as bm:
            index_id = bm.upload(directory, checkpoint_id)
            if not no_commit:
                bm.cleanup(index_id)
            m = bm.metrics()
    except HeadraceError as e:
        raise _fail(e) from e
    click.echo(f"uploaded {m['files_uploaded']} files ({m['bytes_uploaded']:,} bytes), "
               f"retained {m['files_retained']}; requests: {store.counts()}", err=True)
    click.echo(index_id)


@backup_group.command("ls")
@click.argument("url")
@_prefix_option
def ls(url: str, prefix: str) -> None:
    """List snapshot indexes: checkpoint, time, files, bytes, committed or expiring."""
    store = open_store(url)
    with BackupManager(store, prefix=prefix) as bm:
        permanent = set(bm.blobs.list_ids("permanent"))
        table = Table("checkpoint", "created (UTC)", "files", "bytes", "state")
        table.add_column("index id", no_wrap=True)
        for index_id in bm.blobs.list_ids("index"):
            try:
                idx = bm.blobs.get_index(index_id)
            except HeadraceError as e:
                table.add_row("?", "?", "?", "?", f"unreadable: {e}", index_id)
                continue
            created = dt.datetime.fromtimestamp(idx.created_time_ms / 1000, dt.UTC)
            state = "committed" if index_id in permanent else (
                "expires " + dt.datetime.fromtimestamp(blob_expiry_ms(index_id) / 1000,
                                                       dt.UTC).strftime("%Y-%m-%d %H:%M"))
            table.add_row(idx.checkpoint_id, created.strftime("%Y-%m-%d %H:%M:%S"),
                          str(idx.file_count), f"{idx.total_bytes:,}", state, index_id)
    Console().print(table)


@backup_group.command("sweep")
@click.argument("url")
@click.option("--dry-run", is_flag=True, help="Report what would be deleted; delete nothing.")
@_prefix_option
def sweep_cmd(url: str, dry_run: bool, prefix: str) -> None:
    """Delete expired blobs and indexes of crashed commits that no live index references."""
    try:
        with BackupManager(open_store(url), prefix=prefix) as bm:
            r = bm.sweep(dry_run=dry_run)
    except HeadraceError as e:
        raise _fail(e) from e
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {r.indexes_deleted} indexes, {r.blobs_deleted} blobs, "
               f"{r.markers_deleted} markers; kept {r.indexes_live} live indexes, "
               f"{r.blobs_live} live blobs, {r.blobs_young} young unreferenced blobs")


@backup_group.command("verify")
@click.argument("url")
@click.argument("index_id")
@click.option("--deep", is_flag=True, help="Download every blob and check its crc32s.")
@_prefix_option
def verify_cmd(url: str, index_id: str, deep: bool, prefix: str) -> None:
    """Check snapshot INDEX_ID: index decodes, blobs exist (and match their crc32s, --deep)."""
    try:
        with BackupManager(open_store(url), prefix=prefix) as bm:
            r = verify_snapshot(bm.blobs, index_id, deep=deep)
    except HeadraceError as e:
        raise _fail(e) from e
    state = "committed" if r.committed else "not committed (TTL still set)"
    click.echo(f"snapshot {index_id} (checkpoint {r.checkpoint_id}, {state}): {r.files} files, "
               f"{r.bytes:,} bytes in {r.blobs} blobs")
    for problem in r.problems:
        click.echo(f"  problem: {problem}")
    if not r.ok:
        raise click.ClickException(f"{len(r.problems)} problem(s) found")
    click.echo("ok" + (" (all chunk crc32s checked)" if deep else ""))


@backup_group.command("show")
@click.argument("url")
@click.argument("index_id")
@_prefix_option
def show(url: str, index_id: str, prefix: str) -> None:
    """Print the files of snapshot INDEX_ID: path, size, crc32, chunks."""
    try:
        with BackupManager(open_store(url), prefix=prefix) as bm:
            idx = bm.blobs.get_index(index_id)
    except HeadraceError as e:
        raise _fail(e) from e
    table = Table("path", "size", "crc32", "chunks")
    for rel, f in idx.dir_index.walk_files():
        table.add_row(rel, f"{f.size:,}", f"{f.crc32:08x}", str(len(f.blobs)))
    for rel in idx.dir_index.walk_dirs():
        table.add_row(rel + "/", "", "", "")
    Console().print(table)
    click.echo(f"checkpoint {idx.checkpoint_id}, previous index "
               f"{idx.prev_snapshot_index_blob_id}, {idx.file_count} files, "
               f"{idx.total_bytes:,} bytes")


@click.command("restore")
@click.argument("url")
@click.argument("index_id")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--workers", default=4, show_default=True, help="Parallel downloads.")
@click.option("--no-cleanup", is_flag=True, help="Do not redo the snapshot's cleanup "
              "(for read-only credentials).")
@_prefix_option
def restore(url: str, index_id: str, directory: str, workers: int, no_cleanup: bool,
            prefix: str) -> None:
    """Restore snapshot INDEX_ID from URL into DIRECTORY (replaced atomically)."""
    store = CountingStore(open_store(url))
    try:
        cfg = BackupConfig(download_workers=workers)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    try:
        with _progress_bar("download") as update, RestoreManager(
                store, prefix=prefix, config=cfg, progress=update) as rm:
            r = rm.restore(index_id, directory, redo_cleanup=not no_cleanup)
    except HeadraceError as e:
        raise _fail(e) from e
    how = "reused the identical local directory" if r.reused_directory else (
        f"downloaded {r.files_downloaded} files ({r.bytes_downloaded:,} bytes), "
        f"reused {r.files_reused}")
    click.echo(f"restored checkpoint {r.checkpoint_id} into {directory}: {how} in "
               f"{r.elapsed_s:.2f} s; requests: {store.counts()}")


commands = [backup_group, restore]
