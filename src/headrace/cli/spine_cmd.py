"""`headrace spine ...`: look inside a spine storage directory (read-only, shared lock)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from headrace.cli.common import Missing, echo_json, json_option, out_console
from headrace.errors import HeadraceError, NotFound

# headrace.spine is imported where used, once the directory is known to exist (start-up cost)
_NOT_SPINE_HINT = "a spine storage directory is the one a Circuit was opened on"


def _open(directory: str):
    """Open read-only; a missing or non-spine directory is Missing (nothing is created)."""
    path = Path(directory)
    if not path.is_dir():
        raise Missing("spine storage directory", directory,
                      detail="it is a file" if path.exists() else None, hint=_NOT_SPINE_HINT)
    from headrace.spine import LocalBatchStore

    try:
        return LocalBatchStore(directory, read_only=True)
    except NotFound:
        raise Missing("spine storage directory", directory, detail="it holds no LOCK file",
                      hint=_NOT_SPINE_HINT) from None


def _pick(store, checkpoint: str | None):
    entries = store.checkpoints()
    if not entries:
        raise Missing("checkpoint", checkpoint or "(latest)", str(store.path),
                      detail="the directory holds no checkpoint yet",
                      hint="a circuit writes one at each commit")
    if checkpoint is None:
        return entries[-1]
    for e in entries:
        if e.id == checkpoint:
            return e
    raise Missing("checkpoint", checkpoint, str(store.path),
                  hint=f"checkpoints here: {', '.join(e.id for e in entries)}")


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group("spine")
def spine_group() -> None:
    """Inspect, verify and dump spine storage directories (checkpoints, spines, batches)."""


@spine_group.command("inspect")
@click.argument("directory")
@click.option("--checkpoint", default=None, help="Checkpoint id (default: the latest).")
@json_option
def inspect_cmd(directory: str, checkpoint: str | None, as_json: bool) -> None:
    """Checkpoints, then each spine's batches with rows, bytes, level and key bounds."""
    with _open(directory) as store:
        from headrace.spine import Spine, SpineConfig
        from headrace.spine.catalog import TYPE_NAMES

        info = _pick(store, checkpoint)
        checkpoints = [{"id": e.id, "step": e.step, "fingerprint": e.fingerprint,
                        "created": _utc(e.created_ms), "identifier": e.identifier}
                       for e in store.checkpoints()]
        level_of = Spine(TYPE_NAMES["int64"], TYPE_NAMES["int64"],
                         config=SpineConfig(background_merge=False)).level_of
        spines = {}
        for name, m in store.read_manifests(info.id).items():
            batches = []
            for bname in m.batches:
                b = store.open_batch(bname)
                bounds = b.key_bounds() or (None, None)
                batches.append({"batch": bname, "rows": len(b),
                                "bytes": (store.path / bname).stat().st_size,
                                "level": level_of(b), "first_key": bounds[0],
                                "last_key": bounds[1]})
            spines[name] = {"key_type": m.key_type, "val_type": m.val_type, "batches": batches}
        refs = {n for e in store.checkpoints() for m in store.read_manifests(e.id).values()
                for n in m.batches}
        names = store.batch_names()
    all_batches = [b for s in spines.values() for b in s["batches"]]
    summary = {"rows": sum(b["rows"] for b in all_batches),
               "bytes": sum(b["bytes"] for b in all_batches),
               "batch_files": len(names),
               "unreferenced": sum(1 for n in names if n not in refs)}
    if as_json:
        echo_json({"directory": directory, "checkpoints": checkpoints, "checkpoint": info.id,
                   "step": info.step, "spines": spines, **summary})
        return
    console = out_console()
    ct = Table("checkpoint", "step", "fingerprint", "created (UTC)", "identifier",
               title="checkpoints (oldest first)")
    for c in checkpoints:
        ct.add_row(c["id"], str(c["step"]), escape(c["fingerprint"]), c["created"],
                   escape(c["identifier"]))
    console.print(ct)
    bt = Table("spine", "batch", "rows", "bytes", "level", "first key", "last key",
               title=f"spines at checkpoint {info.id} (step {info.step})")
    for name, s in spines.items():
        bt.add_row(escape(name), f"{len(s['batches'])} batches", "", "", "",
                   f"key {s['key_type']}", f"val {s['val_type']}")
        for b in s["batches"]:
            bt.add_row("", b["batch"], f"{b['rows']:,}", f"{b['bytes']:,}", str(b["level"]),
                       escape(repr(b["first_key"])[:24]), escape(repr(b["last_key"])[:24]))
    console.print(bt)
    click.echo(f"{summary['rows']:,} rows in {summary['bytes']:,} bytes at this checkpoint; "
               f"{summary['batch_files']} batch files, {summary['unreferenced']} unreferenced")


@spine_group.command("verify")
@click.argument("directory")
@json_option
def verify_cmd(directory: str, as_json: bool) -> None:
    """Check the catalog, every manifest and every block CRC of every referenced batch."""
    failures: list[str] = []
    checked = 0
    with _open(directory) as store:
        entries = store.checkpoints()
        if not entries:  # nothing verified is not "ok"
            raise Missing("checkpoint", "(any)", directory,
                          detail="the directory holds no checkpoint to verify",
                          hint="a circuit writes one at each commit")
        names: set[str] = set()
        for e in entries:
            try:
                for m in store.read_manifests(e.id).values():
                    names.update(m.batches)
            except HeadraceError as err:
                failures.append(f"checkpoint {e.id}: {err}")
        for name in sorted(names):
            try:
                b = store.open_batch(name)
                b.verify()
                b.table.validate(full=True)
                checked += 1
            except Exception as err:  # noqa: BLE001 - every failure is reported, none hidden
                failures.append(f"{name}: {err}")
    if as_json:
        echo_json({"directory": directory, "ok": not failures, "checkpoints": len(entries),
                   "batches_verified": checked, "failures": failures})
    else:
        for f in failures:
            click.echo(f"FAIL {f}")
        click.echo(f"{checked} batches verified, {len(failures)} failures")
    if failures:
        click.echo(f"Error: {len(failures)} failure(s) in {directory}, first: "
                   f"{' '.join(failures[0].split())} (hint: the batch named is damaged)",
                   err=True)
        raise click.exceptions.Exit(1)


@spine_group.command("dump")
@click.argument("directory")
@click.argument("spine")
@click.option("--key", "key", default=None, help="Only this key (int for int64 keys).")
@click.option("--checkpoint", default=None, help="Checkpoint id (default: the latest).")
@click.option("--limit", default=100, show_default=True, help="At most this many rows.")
@json_option
def dump_cmd(directory: str, spine: str, key: str | None, checkpoint: str | None,
             limit: int, as_json: bool) -> None:
    """Print a spine's consolidated (key, val, w) rows as of a checkpoint."""
    with _open(directory) as store:
        from headrace.spine import Batch, Spine
        from headrace.spine.catalog import TYPE_NAMES

        info = _pick(store, checkpoint)
        manifests = store.read_manifests(info.id)
        if spine not in manifests:
            raise Missing("spine", spine, f"checkpoint {info.id} of {directory}",
                          hint=f"spines there: {', '.join(sorted(manifests)) or 'none'}")
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
        rows = table.slice(0, limit).to_pylist()
    if as_json:
        echo_json({"spine": spine, "checkpoint": info.id, "step": info.step,
                   "rows": table.num_rows, "shown": len(rows), "data": rows})
        return
    out = Table("key", "val", "w", title=f"{spine} at step {info.step}: {table.num_rows:,} rows")
    for row in rows:
        out.add_row(escape(repr(row["key"])), escape(repr(row["val"])), str(row["w"]))
    out_console().print(out)
