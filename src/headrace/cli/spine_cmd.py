"""`headrace spine ...`: look inside a spine storage directory (read-only, shared lock)."""

from __future__ import annotations

import datetime as dt
import sys

import click
from rich.console import Console
from rich.table import Table

from headrace.errors import HeadraceError
from headrace.spine import Batch, LocalBatchStore, Spine, SpineConfig
from headrace.spine.catalog import TYPE_NAMES


def _open(directory: str) -> LocalBatchStore:
    try:
        return LocalBatchStore(directory, read_only=True)
    except HeadraceError as e:
        raise click.ClickException(str(e)) from e


def _pick(store: LocalBatchStore, checkpoint: str | None):
    entries = store.checkpoints()
    if not entries:
        raise click.ClickException(f"{store.path} holds no checkpoint")
    if checkpoint is None:
        return entries[-1]
    for e in entries:
        if e.id == checkpoint:
            return e
    raise click.ClickException(f"checkpoint {checkpoint!r} not in {store.path}")


@click.group("spine")
def spine_group() -> None:
    """Inspect, verify and dump spine storage directories (checkpoints, spines, batches)."""


@spine_group.command("inspect")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--checkpoint", default=None, help="Checkpoint id (default: the latest).")
def inspect_cmd(directory: str, checkpoint: str | None) -> None:
    """Checkpoints, then each spine's batches with rows, bytes, level and key bounds."""
    console = Console()
    with _open(directory) as store:
        ct = Table("checkpoint", "step", "fingerprint", "created (UTC)", "identifier",
                   title="checkpoints (oldest first)")
        for e in store.checkpoints():
            when = dt.datetime.fromtimestamp(e.created_ms / 1000, dt.UTC)
            ct.add_row(e.id, str(e.step), e.fingerprint, when.strftime("%Y-%m-%d %H:%M:%S"),
                       e.identifier)
        console.print(ct)
        if not store.checkpoints():
            return
        info = _pick(store, checkpoint)
        level_of = Spine(TYPE_NAMES["int64"], TYPE_NAMES["int64"],
                         config=SpineConfig(background_merge=False)).level_of
        bt = Table("spine", "batch", "rows", "bytes", "level", "first key", "last key",
                   title=f"spines at checkpoint {info.id} (step {info.step})")
        total_rows = total_bytes = 0
        for name, m in store.read_manifests(info.id).items():
            bt.add_row(name, f"{len(m.batches)} batches", "", "", "",
                       f"key {m.key_type}", f"val {m.val_type}")
            for bname in m.batches:
                b = store.open_batch(bname)
                size = (store.path / bname).stat().st_size
                bounds = b.key_bounds() or ("", "")
                bt.add_row("", bname, f"{len(b):,}", f"{size:,}", str(level_of(b)),
                           repr(bounds[0])[:24], repr(bounds[1])[:24])
                total_rows += len(b)
                total_bytes += size
        console.print(bt)
        refs = {n for e in store.checkpoints() for m in store.read_manifests(e.id).values()
                for n in m.batches}
        orphans = [n for n in store.batch_names() if n not in refs]
        click.echo(f"{total_rows:,} rows in {total_bytes:,} bytes at this checkpoint; "
                   f"{len(store.batch_names())} batch files, {len(orphans)} unreferenced")


@spine_group.command("verify")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def verify_cmd(directory: str) -> None:
    """Check the catalog, every manifest and every block CRC of every referenced batch."""
    failures = 0
    checked = 0
    with _open(directory) as store:
        names: set[str] = set()
        for e in store.checkpoints():
            try:
                for m in store.read_manifests(e.id).values():
                    names.update(m.batches)
            except HeadraceError as err:
                click.echo(f"FAIL checkpoint {e.id}: {err}")
                failures += 1
        for name in sorted(names):
            try:
                b = store.open_batch(name)
                b.verify()
                b.table.validate(full=True)
                checked += 1
            except Exception as err:  # noqa: BLE001 - every failure is reported, none hidden
                click.echo(f"FAIL {name}: {err}")
                failures += 1
    click.echo(f"{checked} batches verified, {failures} failures")
    if failures:
        sys.exit(1)


@spine_group.command("dump")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.argument("spine")
@click.option("--key", "key", default=None, help="Only this key (int for int64 keys).")
@click.option("--checkpoint", default=None, help="Checkpoint id (default: the latest).")
@click.option("--limit", default=100, show_default=True, help="At most this many rows.")
def dump_cmd(directory: str, spine: str, key: str | None, checkpoint: str | None,
             limit: int) -> None:
    """Print a spine's consolidated (key, val, w) rows as of a checkpoint."""
    with _open(directory) as store:
        info = _pick(store, checkpoint)
        manifests = store.read_manifests(info.id)
        if spine not in manifests:
            raise click.ClickException(f"no spine {spine!r}; spines: {sorted(manifests)}")
        m = manifests[spine]
        kt, vt = TYPE_NAMES[m.key_type], TYPE_NAMES[m.val_type]
        batches = [store.open_batch(n) for n in m.batches] or [Batch.empty(kt, vt)]
        sp = Spine.from_batches(batches, lower_bound=m.lower_bound)
        if key is None:
            table = sp.to_table()
        else:
            k: object = int(key) if m.key_type == "int64" else key
            if m.key_type == "large_binary":
                k = key.encode()
            table = sp.lookup_many([k])
        out = Table("key", "val", "w", title=f"{spine} at step {info.step}: {table.num_rows:,} rows")
        for row in table.slice(0, limit).to_pylist():
            out.add_row(repr(row["key"]), repr(row["val"]), str(row["w"]))
        Console().print(out)


commands = [spine_group]
