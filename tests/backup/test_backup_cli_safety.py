"""Issue 16 through the CLI: `--previous` keeps what it names, restore asks before replacing an
unrelated folder, a missing store / prefix / snapshot is one line naming it with exit code 2
(and nothing is created), and the read commands print parseable JSON."""

from __future__ import annotations

import json
import os

import pytest
from backup_testlib import read_tree, sample_tree, write_tree
from click.testing import CliRunner

from headrace.cli.main import cli

MISSING_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV-1"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})


def fails(res, code: int, *needles: str) -> str:
    """The command failed with ``code`` and one line on stderr naming every needle."""
    assert res.exit_code == code, (res.output, res.exception)
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("Error: "), err
    assert "Traceback" not in res.output
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def create(src, url, checkpoint: str, *extra: str) -> str:
    res = run("backup", "create", str(src), url, "--checkpoint-id", checkpoint, *extra)
    assert res.exit_code == 0, (res.output, res.exception)
    return res.stdout.strip().splitlines()[-1]


def test_backup_previous_never_deletes_the_snapshot_it_names(tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    url = str(tmp_path / "store")
    x = create(src, url, "c1")
    os.unlink(src / "000002.sst")
    (src / "000009.sst").write_bytes(b"9" * 30_000)
    n = create(src, url, "c2", "--previous", x)
    n2 = create(src, url, "c3", "--previous", n)
    for index_id, want in ((x, sample_tree()), (n, read_tree(src)), (n2, read_tree(src))):
        res = run("restore", url, index_id, str(tmp_path / index_id))
        assert res.exit_code == 0, (res.output, res.exception)
        assert read_tree(tmp_path / index_id) == want
    res = run("backup", "ls", url, "--json")
    assert res.exit_code == 0, res.output
    snaps = {s["index_id"]: s for s in json.loads(res.stdout)["snapshots"]}
    assert set(snaps) == {x, n, n2} and all(s["committed"] for s in snaps.values())
    assert snaps[n]["previous"] == x and snaps[n]["keeps_previous"]
    res = run("backup", "sweep", url)
    assert res.exit_code == 0 and "deleted 0 indexes, 0 blobs" in res.output


def test_restore_asks_before_replacing_an_unrelated_folder(tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    url = str(tmp_path / "store")
    index_id = create(src, url, "c1")
    target = tmp_path / "photos"
    write_tree(target, {"cat.jpg": b"meow"})
    fails(run("restore", url, index_id, str(target)), 1, str(target), "--force")
    assert read_tree(target) == {"cat.jpg": b"meow"}
    res = run("restore", url, index_id, str(target), "--force")
    assert res.exit_code == 0, (res.output, res.exception)
    assert read_tree(target) == sample_tree()
    (target / "CURRENT").write_bytes(b"changed locally")
    res = run("restore", url, index_id, str(target))  # now a previous restore: no --force
    assert res.exit_code == 0, (res.output, res.exception)
    assert read_tree(target) == sample_tree()


@pytest.mark.parametrize("args", [
    ("backup", "ls", "{missing}"),
    ("backup", "ls", "file://{missing}"),
    ("backup", "show", "{missing}", MISSING_ID),
    ("backup", "verify", "{missing}", MISSING_ID),
    ("backup", "sweep", "{missing}", "--dry-run"),
    ("restore", "{missing}", MISSING_ID, "{tmp}/dst"),
])
def test_a_missing_store_folder_is_not_found_and_nothing_is_created(tmp_path, args):
    missing = tmp_path / "no" / "such"
    fails(run(*(a.format(missing=missing, tmp=tmp_path) for a in args)), 2, str(missing))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_missing_snapshot_or_prefix_is_not_found_naming_it(tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    url = str(tmp_path / "store")
    create(src, url, "c1")
    for args in (("backup", "show", url, MISSING_ID), ("backup", "verify", url, MISSING_ID),
                 ("restore", url, MISSING_ID, str(tmp_path / "dst")),
                 ("backup", "create", str(src), url, "--checkpoint-id", "c2",
                  "--previous", MISSING_ID)):
        fails(run(*args), 2, MISSING_ID)
    assert not (tmp_path / "dst").exists()
    fails(run("backup", "ls", url, "--prefix", "typo"), 2, "'typo'")
    assert not (tmp_path / "store" / "typo").exists()


def test_read_commands_print_json(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {**sample_tree(), "big.sst": b"b" * 300_000})
    os.chmod(src / "CURRENT", 0o600)
    url = str(tmp_path / "store")
    index_id = create(src, url, "c1")
    res = run("backup", "show", url, index_id, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["index_id"] == index_id and doc["checkpoint_id"] == "c1" and doc["committed"]
    paths = {p["path"]: p for p in doc["paths"]}
    assert paths["big.sst"]["size"] == 300_000 and paths["CURRENT"]["mode"] == "0600"
    assert "sub/deep/deeper/nothing" in doc["dirs"]
    res = run("backup", "verify", url, index_id, "--json", "--deep")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ok"] and doc["files"] == 8 and doc["problems"] == [] and doc["deep"]
    res = run("backup", "sweep", url, "--dry-run", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["dry_run"] is True
    for blob in (tmp_path / "store" / "backup" / "blobs").iterdir():
        blob.unlink()
    res = run("backup", "verify", url, index_id, "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert not doc["ok"] and all("missing" in p for p in doc["problems"])
