"""`headrace backup [create] DIR URL`, `backup ls|sweep|show|verify` and `headrace restore`.

Errors are typed headrace errors (a missing snapshot, prefix or store folder is ``NotFound``
naming it), printed as one line by the shared handler of ``headrace.cli.main``. Read commands
take ``--json`` and never create anything.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
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
from headrace.backup.index import SnapshotIndex, blob_expiry_ms
from headrace.cli.common import Missing, echo_json, json_option, open_existing_store, out_console
from headrace.errors import HeadraceError
from headrace.store import CountingStore, open_store

_prefix_option = click.option("--prefix", default="backup", show_default=True,
                              help="Key prefix of the backup inside the store.")


@contextmanager
def _progress_bar(label: str):
    """A rich progress bar fed by the managers' progress callback, shown from the first report
    on (an error before any transfer is then the only thing printed)."""
    state: dict = {}
    lock = threading.Lock()  # reports come from the worker threads

    def update(p: Progress) -> None:
        with lock:
            _update(p)

    def _update(p: Progress) -> None:
        if "bar" not in state:
            bar = RichProgress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                               TransferSpeedColumn(), TextColumn("{task.fields[files]}"),
                               TimeRemainingColumn(), console=Console(stderr=True))
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task(label, total=None, files="")
        state["bar"].update(state["task"], completed=p.bytes_done, total=p.bytes_total or None,
                            files=f"{p.files_done}/{p.files_total} files")

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()


def _file_doc(rel: str, f) -> dict:
    return {"path": rel, "size": f.size, "crc32": f"{f.crc32:08x}", "mode": f"{f.mode:04o}",
            "mtime_ms": f.mtime_ms, "chunks": len(f.blobs), "content_hash": f.content_hash}


def _index_doc(index_id: str, idx: SnapshotIndex, committed: bool) -> dict:
    return {"index_id": index_id, "checkpoint_id": idx.checkpoint_id,
            "created_time_ms": idx.created_time_ms, "files": idx.file_count,
            "bytes": idx.total_bytes, "committed": committed,
            "expires_ms": None if committed else blob_expiry_ms(index_id),
            "previous": idx.prev_snapshot_index_blob_id, "keeps_previous": idx.keep_previous,
            "schema_version": idx.schema_version}


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
    """Incremental snapshots of a local state directory on an object store.

    `headrace backup DIR URL --checkpoint-id ID` is short for `headrace backup create ...`."""


@backup_group.command("create")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.argument("url")
@click.option("--checkpoint-id", required=True, help="The caller's checkpoint id to record.")
@click.option("--previous", default=None, help="Index id of a snapshot to diff against (only "
              "changed files are uploaded); it is kept, never deleted.")
@click.option("--workers", default=4, show_default=True, help="Parallel uploads.")
@click.option("--chunk-mb", default=16, show_default=True, help="Chunk size of large files.")
@click.option("--no-commit", is_flag=True, help="Upload only; do not remove the TTL (cleanup).")
@_prefix_option
def create(directory: str, url: str, checkpoint_id: str, previous: str | None, workers: int,
           chunk_mb: int, no_commit: bool, prefix: str) -> None:
    """Back up DIRECTORY to URL; prints the new index blob id."""
    try:
        cfg = BackupConfig(upload_workers=workers, chunk_size=chunk_mb << 20)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    store = CountingStore(open_store(url))
    # keep_previous: the snapshot named by --previous stays restorable (its cleanup keeps it)
    with _progress_bar("upload") as update, BackupManager(
            store, prefix=prefix, config=cfg, previous_index_blob_id=previous,
            progress=update, keep_previous=True) as bm:
        index_id = bm.upload(directory, checkpoint_id)
        if not no_commit:
            bm.cleanup(index_id)
        m = bm.metrics()
    click.echo(f"uploaded {m['files_uploaded']} files ({m['bytes_uploaded']:,} bytes), "
               f"retained {m['files_retained']}; requests: {store.counts()}", err=True)
    click.echo(index_id)


@backup_group.command("ls")
@click.argument("url")
@_prefix_option
@json_option
def ls(url: str, prefix: str, as_json: bool) -> None:
    """List snapshot indexes: checkpoint, time, files, bytes, committed or expiring."""
    with BackupManager(open_existing_store(url), prefix=prefix) as bm:
        index_ids = bm.blobs.list_ids("index")
        if not index_ids:
            raise Missing("backup prefix", prefix, bm.blobs.store_name(),
                          detail=f"no snapshot index under {bm.blobs.folder('index')!r}",
                          hint="`headrace status URL` lists what a store holds; check "
                               "--prefix")
        permanent = set(bm.blobs.list_ids("permanent"))
        docs = []
        for index_id in index_ids:
            try:
                docs.append(_index_doc(index_id, bm.blobs.get_index(index_id),
                                       index_id in permanent))
            except HeadraceError as e:
                docs.append({"index_id": index_id, "error": f"{type(e).__name__}: {e}"})
    if as_json:
        echo_json({"prefix": prefix, "snapshots": docs})
        return
    table = Table("checkpoint", "created (UTC)", "files", "bytes", "state")
    table.add_column("index id", no_wrap=True)
    for d in docs:
        if "error" in d:
            table.add_row("?", "?", "?", "?", f"unreadable: {d['error']}", d["index_id"])
            continue
        created = dt.datetime.fromtimestamp(d["created_time_ms"] / 1000, dt.UTC)
        state = "committed" if d["committed"] else (
            "expires " + dt.datetime.fromtimestamp(d["expires_ms"] / 1000,
                                                   dt.UTC).strftime("%Y-%m-%d %H:%M"))
        table.add_row(d["checkpoint_id"], created.strftime("%Y-%m-%d %H:%M:%S"),
                      str(d["files"]), f"{d['bytes']:,}", state, d["index_id"])
    out_console().print(table)


@backup_group.command("sweep")
@click.argument("url")
@click.option("--dry-run", is_flag=True, help="Report what would be deleted; delete nothing.")
@_prefix_option
@json_option
def sweep_cmd(url: str, dry_run: bool, prefix: str, as_json: bool) -> None:
    """Delete expired blobs and indexes of crashed commits that no live index references."""
    with BackupManager(open_existing_store(url), prefix=prefix) as bm:
        r = bm.sweep(dry_run=dry_run)
    if as_json:
        echo_json({"dry_run": dry_run, **dataclasses.asdict(r)})
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {r.indexes_deleted} indexes, {r.blobs_deleted} blobs, "
               f"{r.markers_deleted} markers; kept {r.indexes_live} live indexes, "
               f"{r.blobs_live} live blobs, {r.blobs_young} young unreferenced blobs")


@backup_group.command("verify")
@click.argument("url")
@click.argument("index_id")
@click.option("--deep", is_flag=True, help="Download every blob and check its crc32s.")
@_prefix_option
@json_option
def verify_cmd(url: str, index_id: str, deep: bool, prefix: str, as_json: bool) -> None:
    """Check snapshot INDEX_ID: index decodes, blobs exist (and match their crc32s, --deep).
    Exit code 1 when a problem is found."""
    with BackupManager(open_existing_store(url), prefix=prefix) as bm:
        r = verify_snapshot(bm.blobs, index_id, deep=deep)
    if as_json:
        echo_json({**dataclasses.asdict(r), "ok": r.ok, "deep": deep})
        if not r.ok:
            click.get_current_context().exit(1)
        return
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
@json_option
def show(url: str, index_id: str, prefix: str, as_json: bool) -> None:
    """Print the files of snapshot INDEX_ID: path, size, crc32, chunks."""
    with BackupManager(open_existing_store(url), prefix=prefix) as bm:
        idx = bm.blobs.get_index(index_id)
        committed = bm.blobs.is_permanent(index_id)
    if as_json:
        echo_json({**_index_doc(index_id, idx, committed),
                    "paths": [_file_doc(rel, f) for rel, f in idx.dir_index.walk_files()],
                    "dirs": list(idx.dir_index.walk_dirs())})
        return
    table = Table("path", "size", "crc32", "mode", "chunks")
    for rel, f in idx.dir_index.walk_files():
        table.add_row(rel, f"{f.size:,}", f"{f.crc32:08x}", f"{f.mode & 0o777:04o}",
                      str(len(f.blobs)))
    for rel in idx.dir_index.walk_dirs():
        table.add_row(rel + "/", "", "", "", "")
    out_console().print(table)
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
@click.option("--force", is_flag=True, help="Replace DIRECTORY even if it holds data that is "
              "not a previous restore of this backup.")
@_prefix_option
def restore(url: str, index_id: str, directory: str, workers: int, no_cleanup: bool,
            force: bool, prefix: str) -> None:
    """Restore snapshot INDEX_ID from URL into DIRECTORY (replaced atomically).

    A non-empty DIRECTORY is replaced only if it is a previous restore of this backup (or
    already equals the snapshot); anything else needs --force."""
    try:
        cfg = BackupConfig(download_workers=workers)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    store = CountingStore(open_existing_store(url))
    with _progress_bar("download") as update, RestoreManager(
            store, prefix=prefix, config=cfg, progress=update) as rm:
        r = rm.restore(index_id, directory, redo_cleanup=not no_cleanup, force=force)
    how = "reused the identical local directory" if r.reused_directory else (
        f"downloaded {r.files_downloaded} files ({r.bytes_downloaded:,} bytes), "
        f"reused {r.files_reused}")
    click.echo(f"restored checkpoint {r.checkpoint_id} into {directory}: {how} in "
               f"{r.elapsed_s:.2f} s; requests: {store.counts()}")


commands = [backup_group, restore]
