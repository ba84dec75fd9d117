"""What every command shares: opening a store without creating it, "not found" errors that name
the missing thing, tables that are not cut when piped, and JSON output.

Read commands open their store with :func:`open_existing_store`: a mistyped path is caught
before it is opened, and an existing folder is opened with ``create=False`` (no ``.hrlocks/``).
Persist shards are read with ``read_only(shard, lease=False)``: a read command writes nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import click
from rich.console import Console

from headrace.errors import NotFound
from headrace.store import ObjectStore, open_store
from headrace.store.url import redact_url

# Wide enough for any key or value we print; rich sizes a table to its content, not to this.
PIPE_WIDTH = 100_000


class Missing(NotFound):
    """A store, queue, stream, shard, checkpoint or snapshot that does not exist (exit 2).

    ``what`` says which kind of thing, ``name`` which one, ``where`` in which store; ``hint``
    is the next step shown after the message."""

    def __init__(self, what: str, name: str, where: str | None = None, *,
                 hint: str | None = None, detail: str | None = None):
        super().__init__(name)
        self.what = what
        self.name = name
        self.where = where
        self.hint = hint
        self.detail = detail

    def __str__(self) -> str:
        out = f"no {self.what} {self.name!r}"
        if self.where:
            out += f" in {self.where}"
        if self.detail:
            out += f": {self.detail}"
        return out


def local_path(url: str) -> Path | None:
    """The folder a local store URL names (as ``open_store`` reads it), None for other schemes."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None  # open_store reports the malformed URL
    scheme = parts.scheme.lower()
    if scheme == "file":
        return Path(unquote(parts.path))
    if scheme == "":
        return Path(url)
    return None


def _holds_objects(folder: Path) -> bool:
    """True at the first object found (LocalStore hides ``.hr*`` entries: locks, temp files)."""
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.startswith(".hr"):
                continue
            if entry.is_file(follow_symlinks=False):
                return True
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return False


_NO_STORE_HINT = ("check the URL; a store is created by its first write (a producer, a pipeline, "
                  "a backup)")


def open_existing_store(url: str) -> ObjectStore:
    """Open the store at ``url`` for reading; a store that does not exist, or holds no object at
    all (the same thing on S3), is :class:`Missing` and nothing is created."""
    path = local_path(url)
    if path is not None:
        if not path.exists():
            raise Missing("store", str(path), hint=_NO_STORE_HINT)
        if not path.is_dir():
            raise Missing("store", str(path), detail="it is a file, not a folder",
                          hint="a local store is a folder")
        if not _holds_objects(path):
            raise Missing("store", str(path), detail="the folder holds no object",
                          hint=_NO_STORE_HINT)
        return open_store(url, create=False)  # no .hrlocks/ either: a read creates nothing
    store = open_store(url)
    if next(iter(store.list("")), None) is None:
        raise Missing("store", redact_url(url), detail="nothing is stored under it",
                      hint=_NO_STORE_HINT)
    return store


def out_console() -> Console:
    """Console for stdout: full width when piped (rich would otherwise cut tables at 80)."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def err_console() -> Console:
    """Console for progress and notes: stderr, so stdout stays clean for tables and JSON."""
    return Console(stderr=True)


def echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON on stdout instead of tables.")
