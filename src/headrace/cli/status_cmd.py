"""`headrace status URL`: what a store holds — the first command to type.

One listing of the root finds every part by its key layout; each part is then read through its
library's public read API (the same readers the part's own commands use):

    {queue}/manifest                                   buffer queue (read_manifest)
    {stream}/v/{version}/ckpt/… or …/registry          reservoir stream (inspect_stream)
    persist/shards/{shard}/consensus/…                 shard (PersistClient.state)
    {name}.progress shard + {name}.state stream        pipeline (its progress rows, read
                                                       without the lease progress_at takes)
    {prefix}/index/{blob id}, {prefix}/permanent/…     backup (decode_index of the latest)

Nothing is written. A part that cannot be read is listed with its error and the exit code is 1.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict

import click
from rich.markup import escape
from rich.table import Table

from headrace.cli.common import (
    echo_json,
    json_option,
    open_existing_store,
    out_console,
)
from headrace.errors import HeadraceError
from headrace.store import ObjectStore
from headrace.store.url import redact_url

# The parts' readers are imported where used: they cost most of a second of start-up, which
# a mistyped path should not pay.

_STREAM_KEY = re.compile(r"^(?P<stream>[A-Za-z0-9_-][A-Za-z0-9._-]*)/v/(?P<version>[^/]+)/"
                         r"(?:ckpt/\d{20}\.(?:checkpoint|snapshot\.checkpoint|bundle)"
                         r"|(?P<registry>registry))$")
_BACKUP_KEY = re.compile(r"^(?:(?P<prefix>.+)/)?(?P<folder>index|permanent)/(?P<id>[^/]+)$")
_PROGRESS = ".progress"
_BUCKET_BACKUPS = ".backup/"  # local+backup pipelines: {pipeline}.backup/{bucket}


# what a part that cannot be read raises: it is listed with the error, the others still shown
_READ_ERRORS = (HeadraceError, ValueError, OSError)


def _error(e: Exception) -> str:
    return " ".join(str(e).split())


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _queues(store: ObjectStore, keys: dict[str, int]) -> list[dict]:
    from headrace.buffer import read_manifest

    out = []
    for key in sorted(k for k in keys if k == "manifest" or k.endswith("/manifest")):
        name = key.rpartition("/")[0] or "."
        batch_keys = [k for k in keys if k.startswith(name + "/") and k.endswith(".batch")]
        q = {"queue": name, "manifest": key, "batch_files": len(batch_keys),
             "batch_bytes": sum(keys[k] for k in batch_keys)}
        try:
            m = read_manifest(store, key)
        except _READ_ERRORS as e:
            q["error"] = _error(e)
        else:
            q.update(length=len(m.entries), next_sequence=m.next_sequence, epoch=m.epoch,
                     first_sequence=m.entries[0].sequence if m.entries else None,
                     sequences=[e.sequence for e in m.entries])
        out.append(q)
    return out


def _streams(store: ObjectStore, keys: dict[str, int]) -> list[dict]:
    from headrace.reservoir import ReservoirOptions
    from headrace.reservoir.verify import inspect_stream

    found: dict[tuple[str, str], bool] = {}
    for key in keys:
        m = _STREAM_KEY.match(key)
        if m:
            ident = (m["stream"], m["version"])
            found[ident] = found.get(ident, False) or m["registry"] is not None
    out = []
    for (stream, version), has_registry in sorted(found.items()):
        s = {"stream": stream, "stream_version": version}
        opts = ReservoirOptions(stream_version=None if version == "default" else version,
                                registry="file" if has_registry else "bundled")
        try:
            info = inspect_stream(store, stream, None, opts)
        except _READ_ERRORS as e:
            s["error"] = _error(e)
        else:
            s.update(checkpoint=info["version"], checkpoints=len(info["checkpoints"]),
                     pages=info["pages"], page_bytes=info["page_bytes"],
                     files=len(info["files"]))
        out.append(s)
    return out


def _shards(client, keys: dict[str, int]) -> list[dict]:
    shard_key = re.compile(rf"^{re.escape(client.root)}/(?P<shard>[^/]+)/consensus/")
    names = sorted({m["shard"] for k in keys if (m := shard_key.match(k))})
    out = []
    for name in names:
        d = {"shard": name}
        try:
            s = client.state(name)
        except _READ_ERRORS as e:
            d["error"] = _error(e)
        else:
            d.update(seqno=s.seqno, since=s.since, upper=s.upper, finished=s.upper is None,
                     parts=len(s.parts), rows=sum(p.rows for p in s.parts),
                     bytes=sum(p.size for p in s.parts),
                     readers=len(s.leased) + len(s.critical))
        out.append(d)
    return out


def _pipelines(client, shards: list[dict], streams: list[dict],
               queues: list[dict], backups: list[dict]) -> list[dict]:
    from headrace.pipeline.plan.progress import GRAPH_KEY, STATE_KEY

    out = []
    for sh in shards:
        if not sh["shard"].endswith(_PROGRESS) or "error" in sh:
            continue
        name = sh["shard"][: -len(_PROGRESS)]
        upper = sh["upper"] or 0
        p: dict = {"pipeline": name, "progress_shard": sh["shard"], "batches": upper}
        try:  # pipeline.progress.progress_at, minus the read lease it takes (writes nothing)
            snap = client.read_only(sh["shard"], lease=False).snapshot(
                upper - 1, timeout_s=0) if upper else None
            bindings = {} if snap is None else {
                r["source"]: r["address"] for r in snap.select(["source", "address"]).to_pylist()}
        except _READ_ERRORS as e:
            p["error"] = _error(e)
            out.append(p)
            continue
        p["state_version"] = bindings.get(STATE_KEY)
        p["graph"] = [k.split(":", 1)[1] for k in bindings if k.startswith(GRAPH_KEY + ":")]
        sources = {}
        for queue, through in sorted(bindings.items()):
            if queue.startswith("__"):
                continue
            src = {"through_sequence": through}  # the last queue sequence consumed
            q = next((q for q in queues if q["queue"] == queue and "error" not in q), None)
            if q is not None:  # entries in the queue after what was consumed
                src["pending_entries"] = sum(1 for s in q["sequences"] if s > through)
            sources[queue] = src
        p["sources"] = sources
        stream = next((s for s in streams if s["stream"] == f"{name}.state"), None)
        p["state_stream"] = None if stream is None else {
            "stream": stream["stream"], "checkpoint": stream.get("checkpoint"),
            "error": stream.get("error")}
        p["bucket_backups"] = sum(1 for b in backups
                                  if b["prefix"].startswith(name + _BUCKET_BACKUPS))
        out.append(p)
    return out


def _backups(store: ObjectStore, keys: dict[str, int]) -> list[dict]:
    from headrace.backup import decode_index
    from headrace.backup.index import BLOB_ID

    ids: dict[str, dict[str, set[str]]] = defaultdict(lambda: {"index": set(),
                                                               "permanent": set()})
    for key in keys:
        m = _BACKUP_KEY.match(key)
        if m and BLOB_ID.match(m["id"]):
            ids[m["prefix"] or ""][m["folder"]].add(m["id"])
    out = []
    for prefix, folders in sorted(ids.items()):
        indexes = sorted(folders["index"])  # a blob id starts with its ULID: time order
        committed = [i for i in indexes if i in folders["permanent"]]
        b: dict = {"prefix": prefix, "snapshots": len(indexes), "committed": len(committed),
                   "latest_committed": None}
        if committed:
            index_id = committed[-1]
            key = f"{prefix}/index/{index_id}" if prefix else f"index/{index_id}"
            latest = {"index_id": index_id}
            try:
                idx = decode_index(store.get(key).data, key=key)
            except _READ_ERRORS as e:
                latest["error"] = _error(e)
            else:
                latest.update(checkpoint_id=idx.checkpoint_id, created=_utc(idx.created_time_ms),
                              files=idx.file_count, bytes=idx.total_bytes)
            b["latest_committed"] = latest
        out.append(b)
    return out


def collect_status(store: ObjectStore, url: str) -> dict:
    """Everything ``headrace status`` reports, as one JSON-able dict."""
    from headrace.persist import PersistClient

    keys = {m.key: m.size for m in store.list("")}
    client = PersistClient(store, auto_compact_at=None)
    queues = _queues(store, keys)
    streams = _streams(store, keys)
    shards = _shards(client, keys)
    backups = _backups(store, keys)
    pipelines = _pipelines(client, shards, streams, queues, backups)
    for q in queues:
        q.pop("sequences", None)
    return {"url": redact_url(url), "objects": len(keys), "bytes": sum(keys.values()),
            "queues": queues, "streams": streams, "shards": shards, "pipelines": pipelines,
            "backups": backups}


def _errors(status: dict) -> list[str]:
    out = []
    for section in ("queues", "streams", "shards", "pipelines", "backups"):
        for item in status[section]:
            if "error" in item:
                out.append(item["error"])
            latest = item.get("latest_committed") or {}
            if "error" in latest:
                out.append(latest["error"])
    return out


def _num(v) -> str:
    return "" if v is None else f"{v:,}" if isinstance(v, int) else escape(str(v))


def _print(status: dict) -> None:
    console = out_console()
    console.print(f"[bold]{status['url']}[/]: {status['objects']:,} objects, "
                  f"{status['bytes']:,} bytes")

    def section(title: str, rows: list, columns: list[str], row_of) -> None:
        if not rows:
            console.print(f"{title}: none")
            return
        t = Table(*columns, title=title, title_justify="left")
        for r in rows:
            if "error" in r:
                first = r.get("queue") or r.get("stream") or r.get("shard") or r.get("pipeline")
                t.add_row(escape(str(first)), f"[red]unreadable: {escape(r['error'])}[/]",
                          *[""] * (len(columns) - 2))
            else:
                t.add_row(*row_of(r))
        console.print(t)

    section("queues", status["queues"],
            ["queue", "entries", "first seq", "next seq", "epoch", "batch files", "bytes"],
            lambda q: [_num(q["queue"]), _num(q["length"]), _num(q["first_sequence"]),
                       _num(q["next_sequence"]), _num(q["epoch"]), _num(q["batch_files"]),
                       _num(q["batch_bytes"])])
    section("reservoir streams", status["streams"],
            ["stream", "stream version", "checkpoint", "checkpoints", "pages", "page bytes",
             "files"],
            lambda s: [_num(s["stream"]), _num(s["stream_version"]), _num(s["checkpoint"]),
                       _num(s["checkpoints"]), _num(s["pages"]), _num(s["page_bytes"]),
                       _num(s["files"])])
    section("shards", status["shards"],
            ["shard", "since", "upper", "parts", "rows", "bytes", "readers"],
            lambda s: [_num(s["shard"]), _num(s["since"]),
                       "finished" if s["finished"] else _num(s["upper"]), _num(s["parts"]),
                       _num(s["rows"]), _num(s["bytes"]), _num(s["readers"])])

    def pipeline_row(p):
        inputs = ", ".join(
            f"{escape(q)} through seq {s['through_sequence']:,}"
            + (f" ({s['pending_entries']:,} pending)" if "pending_entries" in s else "")
            for q, s in p["sources"].items()) or "-"
        st = p["state_stream"]
        state = "-" if st is None else escape(
            f"{st['stream']} (unreadable)" if st.get("error")
            else f"{st['stream']} checkpoint {st['checkpoint']}")
        return [_num(p["pipeline"]), _num(p["batches"]), inputs, _num(p["state_version"]), state,
                _num(p["bucket_backups"])]

    section("pipelines", status["pipelines"],
            ["pipeline", "batches", "input", "state version", "state stream", "bucket backups"],
            pipeline_row)

    def backup_row(b):
        latest = b["latest_committed"] or {}
        if "error" in latest:
            return [_num(b["prefix"] or "(root)"), _num(b["snapshots"]), _num(b["committed"]),
                    f"[red]unreadable: {escape(latest['error'])}[/]", "", "", ""]
        return [_num(b["prefix"] or "(root)"), _num(b["snapshots"]), _num(b["committed"]),
                _num(latest.get("checkpoint_id", "-")), latest.get("created", ""),
                _num(latest.get("files")), _num(latest.get("bytes"))]

    section("backups", status["backups"],
            ["prefix", "snapshots", "committed", "latest committed checkpoint", "created (UTC)",
             "files", "bytes"], backup_row)


@click.command("status")
@click.argument("url")
@json_option
def status(url: str, as_json: bool) -> None:
    """What the store at URL holds: queues, reservoir streams, shards, pipelines, backups."""
    store = open_existing_store(url)
    result = collect_status(store, url)
    if as_json:
        echo_json(result)
    else:
        _print(result)
    errors = _errors(result)
    if errors:
        click.echo(f"Error: {len(errors)} part(s) could not be read, first: {errors[0]} "
                   "(hint: the part's `verify` command says more)", err=True)
        raise click.exceptions.Exit(1)
