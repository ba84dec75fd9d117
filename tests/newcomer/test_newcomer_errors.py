"""Errors a newcomer meets: a mistyped path or name is exit 2 and one line naming it, nothing is
created, verifying nothing fails, and no traceback is shown unless `--debug` is given."""

from __future__ import annotations

from newcomer_lib import run, run_all, tree

from headrace.persist import PersistClient


def _one_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert "(hint: " in lines[0], lines[0]
    return lines[0]


def test_a_missing_path_is_exit_2_one_line_and_is_not_created(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    m = str(missing)
    argvs = [["status", m], ["status", m, "--json"], ["store", "ls", m], ["store", "cat", m, "k"],
             ["reservoir", "inspect", m], ["reservoir", "verify", m], ["reservoir", "compact", m],
             ["shard", "ls", m], ["shard", "inspect", m, "s"], ["shard", "read", m, "s"],
             ["shard", "verify", m, "s"], ["shard", "gc", m],
             ["spine", "inspect", m], ["spine", "verify", m], ["spine", "dump", m, "x"],
             ["queue", "inspect", m], ["queue", "inspect", m, "--json"], ["queue", "verify", m],
             ["queue", "stats", m], ["queue", "gc", m], ["queue", "skip", m, "0", "--reason", "r"],
             ["status", f"file://{m}"]]
    for argv, res in zip(argvs, run_all(argvs), strict=True):
        assert res.returncode == 2, (argv, res.returncode, res.stderr)
        assert m in _one_line(res), argv
        assert res.stdout == "", argv
    assert not (tmp_path / "no").exists()  # read commands used to create the mistyped folder


def test_missing_things_inside_a_store_are_named_with_what_exists(populated):
    root, spine = str(populated["root"]), str(populated["spine"])
    before = tree(populated["root"])
    cases = [
        (["reservoir", "verify", root, "--stream", "nope"], "reservoir stream 'nope'",
         "sales.state"),
        (["reservoir", "inspect", root, "--stream", "sales.state", "--stream-version", "v9"],
         "'sales.state (version v9)'", "sales.state"),
        (["shard", "read", root, "nope"], "shard 'nope'", "orders"),
        (["shard", "verify", root, "nope", "--json"], "shard 'nope'", "orders"),
        (["store", "cat", root, "ingest/nope"], "object 'ingest/nope'", "store ls"),
        (["store", "ls", root, "--prefix", "nope/"], "'nope/'", "store ls"),
        (["spine", "dump", spine, "nope"], "spine 'nope'", "counts"),
        (["spine", "inspect", spine, "--checkpoint", "nope"], "checkpoint 'nope'",
         "checkpoints here"),
        # a queue that is not there is not an empty queue (and gc must not take every batch
        # file for unreferenced)
        (["queue", "inspect", root, "--manifest-path", "nope/manifest"],
         "queue manifest 'nope/manifest'", "queues here: ingest/manifest"),
        (["queue", "verify", root, "--manifest-path", "nope/manifest", "--json"],
         "queue manifest 'nope/manifest'", "ingest/manifest"),
        (["queue", "gc", root, "--manifest-path", "ingest/manifest2", "--grace-period-s", "0"],
         "queue manifest 'ingest/manifest2'", "ingest/manifest"),
    ]
    for (argv, named, hint), res in zip(cases, run_all([c[0] for c in cases]), strict=True):
        assert res.returncode == 2, (argv, res.stderr)
        line = _one_line(res)
        assert named in line and hint in line, (argv, line)
    assert tree(populated["root"]) == before


def test_verifying_nothing_is_an_error(tmp_path):
    from headrace.spine import LocalBatchStore
    from headrace.store import LocalStore

    store_root = tmp_path / "store"
    LocalStore(store_root).put("something/else", b"x")  # a store, but no reservoir stream
    spine_dir = tmp_path / "spine"
    LocalBatchStore(spine_dir).close()  # a spine directory that never committed
    other = tmp_path / "plain"
    other.mkdir()  # a folder no one ever wrote to
    argvs = [["reservoir", "verify", str(store_root)], ["spine", "verify", str(spine_dir)],
             ["status", str(other)], ["spine", "verify", str(other)]]
    results = run_all(argvs)
    for argv, res in zip(argvs, results, strict=True):
        assert res.returncode == 2, (argv, res.returncode, res.stdout, res.stderr)
        _one_line(res)
        assert "ok" not in res.stdout.split(), argv  # `reservoir verify` used to say ok
    assert "no reservoir stream 'default'" in results[0].stderr
    assert "holds no checkpoint" in results[1].stderr
    assert "holds no object" in results[2].stderr


def test_known_errors_are_one_line_and_debug_shows_the_traceback(populated, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(populated["root"], root)
    key = PersistClient(str(root)).state("orders").parts[0].key
    (root / key).write_bytes(b"not parquet at all")
    argvs = [["shard", "verify", str(root), "orders"],
             ["--debug", "shard", "verify", str(root), "orders"],
             ["shard", "read", str(root), "../escape"],
             ["status", "ftp://host/x"],
             ["shard", "read", str(root), "orders", "--as-of", "99"],
             ["spine", "dump", str(populated["spine"]), "counts", "--key", "seven"]]
    corrupt, debug, bad_name, bad_url, future, bad_key = run_all(argvs)
    assert corrupt.returncode == 1 and key in _one_line(corrupt)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == corrupt.stderr.strip()
    for res, named in ((bad_name, "'../escape'"), (bad_url, "'ftp'"), (future, "upper 3"),
                       (bad_key, "seven")):
        assert res.returncode == 1, res.stderr
        assert named in _one_line(res)


def test_an_unreadable_part_makes_status_exit_1_but_still_report_the_rest(populated, tmp_path):
    import json
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(populated["root"], root)
    (root / "ingest" / "manifest").write_bytes(b"garbage")
    res = run("status", str(root), "--json")
    assert res.returncode == 1
    assert "could not be read" in _one_line(res)
    doc = json.loads(res.stdout)
    assert "error" in doc["queues"][0] and "ingest/manifest" in doc["queues"][0]["error"]
    assert [s["shard"] for s in doc["shards"]][-1] == "sales.progress"
