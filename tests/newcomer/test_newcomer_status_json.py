"""`headrace status` on a populated root, `--json` on every read command, full tables when
piped, read commands that leave the store exactly as it was."""

from __future__ import annotations

import base64
import json

from newcomer_lib import LONG_SHARD, run, run_all, tree


def test_status_lists_what_the_root_holds(populated):
    res = run("status", str(populated["root"]), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    (queue,) = doc["queues"]
    assert (queue["queue"], queue["length"], queue["first_sequence"],
            queue["next_sequence"]) == ("ingest", 3, 0, 3)
    assert queue["batch_files"] == 3
    streams = {s["stream"]: s for s in doc["streams"]}
    assert streams["sales.state"]["checkpoint"] == 2 and streams["sales.state"]["pages"] == 2
    shards = {s["shard"]: s for s in doc["shards"]}
    assert set(shards) == {"orders", "sales.progress", LONG_SHARD}
    assert (shards["orders"]["since"], shards["orders"]["upper"],
            shards["orders"]["rows"]) == (0, 3, 6)
    (pipeline,) = doc["pipelines"]
    assert pipeline["pipeline"] == "sales" and pipeline["batches"] == 2
    assert pipeline["sources"] == {"ingest": {"through_sequence": 1, "pending_entries": 1}}
    assert pipeline["state_version"] == 2 and pipeline["graph"] == ["f00d"]
    assert pipeline["state_stream"]["checkpoint"] == 2
    (backup,) = doc["backups"]
    assert (backup["prefix"], backup["snapshots"], backup["committed"]) == ("backup", 1, 1)
    assert backup["latest_committed"]["checkpoint_id"] == "ck-1"
    assert backup["latest_committed"]["files"] == 2
    assert backup["latest_committed"]["bytes"] == 1010


def test_every_read_command_prints_json_and_changes_nothing(populated):
    root, spine = str(populated["root"]), str(populated["spine"])
    before = tree(populated["root"])
    spine_before = tree(populated["spine"])
    argvs = [["status", root, "--json"],
             ["store", "ls", root, "--json"],
             ["store", "cat", root, "ingest/manifest", "--json"],
             ["queue", "inspect", root, "--json"],
             ["queue", "verify", root, "--json"],
             ["queue", "stats", root, "--json"],
             ["reservoir", "inspect", root, "--stream", "sales.state", "--json"],
             ["reservoir", "verify", root, "--stream", "sales.state", "--json"],
             ["shard", "ls", root, "--json"],
             ["shard", "inspect", root, "orders", "--json"],
             ["shard", "read", root, "orders", "--json"],
             ["shard", "verify", root, "orders", "--json"],
             ["spine", "inspect", spine, "--json"],
             ["spine", "verify", spine, "--json"],
             ["spine", "dump", spine, "counts", "--json"]]
    docs = {}
    for argv, res in zip(argvs, run_all(argvs), strict=True):
        assert res.returncode == 0, (argv, res.stderr)
        assert res.stderr == "", (argv, res.stderr)
        docs[tuple(argv[:2])] = json.loads(res.stdout)
    manifest = (populated["root"] / "ingest" / "manifest").read_bytes()
    assert base64.b64decode(docs["store", "cat"]["base64"]) == manifest
    assert docs["reservoir", "verify"]["ok"] and docs["reservoir", "verify"]["checkpoint"] == 2
    assert docs["shard", "read"]["rows"] == 6
    assert {r["k"] for r in docs["shard", "read"]["data"]} == {"a0", "b0", "a1", "b1", "a2",
                                                              "b2"}
    verified = docs["shard", "verify"]
    assert (verified["shard"], verified["ok"], verified["parts"], verified["rows"]) == \
        ("orders", True, 3, 6)
    assert docs["spine", "verify"]["ok"] and docs["spine", "verify"]["batches_verified"] >= 1
    assert docs["spine", "dump"]["rows"] == 10
    assert docs["queue", "inspect"]["entry_count"] == 3
    assert (docs["queue", "verify"]["ok"], docs["queue", "verify"]["records"]) == (True, 3)
    assert (docs["queue", "stats"]["queue_length"], docs["queue", "stats"]["batch_files"]) == (3, 3)
    assert "counts" in docs["spine", "inspect"]["spines"]
    keys = {o["key"] for o in docs["store", "ls"]["objects"]}
    assert "ingest/manifest" in keys and not any(k.startswith(".hr") for k in keys)
    assert tree(populated["root"]) == before and tree(populated["spine"]) == spine_before


def test_reservoir_inspect_says_what_its_live_figure_is(populated):
    res = run("reservoir", "inspect", str(populated["root"]), "--stream", "sales.state",
              "--json")
    files = json.loads(res.stdout)["files"]
    assert files
    for f in files:
        assert "live_ratio" not in f  # was live bytes / 64 MiB: ~0% for a file that is all live
        assert f["live_fraction"] == round(f["live_bytes"] / f["size"], 4)
        assert f["compaction_candidate"] is True  # tiny files are what compaction repacks
    assert max(f["live_fraction"] for f in files) > 0.01
    table = run("reservoir", "inspect", str(populated["root"]), "--stream", "sales.state")
    assert "live (of size)" in table.stdout and "live ratio" not in table.stdout


def test_tables_are_not_cut_when_piped(populated):
    root = str(populated["root"])
    status, ls = run_all([["status", root], ["shard", "ls", root]])
    for res in (status, ls):
        assert res.returncode == 0, res.stderr
        assert LONG_SHARD in res.stdout  # whole, on one line, not cut at 80 columns
    assert "through seq 1 (1 pending)" in status.stdout
    assert "ck-1" in status.stdout


def test_read_commands_do_not_create_the_lock_folder(populated, tmp_path):
    """A store copied without its hidden files (or written by another tool) has no `.hrlocks/`;
    old read commands created it (LocalStore made it when opened)."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(populated["root"], root, ignore=shutil.ignore_patterns(".hr*"))
    before = tree(root)
    r = str(root)
    argvs = [["status", r, "--json"], ["queue", "inspect", r], ["queue", "verify", r],
             ["queue", "stats", r], ["shard", "read", r, "orders"], ["shard", "verify", r, "orders"],
             ["reservoir", "verify", r, "--stream", "sales.state"], ["store", "ls", r]]
    for argv, res in zip(argvs, run_all(argvs), strict=True):
        assert res.returncode == 0, (argv, res.stderr)
    assert tree(root) == before and not (root / ".hrlocks").exists()
