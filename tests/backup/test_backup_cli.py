"""`headrace backup create|ls|sweep` and `headrace restore` through click's runner."""

from __future__ import annotations

from backup_testlib import read_tree, sample_tree, write_tree
from click.testing import CliRunner

from headrace.cli.main import cli


def test_cli_create_ls_restore_sweep(tmp_path):
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    url = str(tmp_path / "store")
    runner = CliRunner()
    res = runner.invoke(cli, ["backup", "create", str(src), url, "--checkpoint-id", "c1",
                              "--chunk-mb", "1"])
    assert res.exit_code == 0, res.output
    index_id = res.stdout.strip().splitlines()[-1]
    res = runner.invoke(cli, ["backup", "ls", url], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and index_id in res.output and "committed" in res.output
    res = runner.invoke(cli, ["restore", url, index_id, str(tmp_path / "dst")])
    assert res.exit_code == 0, res.output
    assert read_tree(tmp_path / "dst") == sample_tree()
    res = runner.invoke(cli, ["backup", "sweep", url])
    assert res.exit_code == 0 and "deleted 0 indexes" in res.output
    res = runner.invoke(cli, ["restore", url, "01ARZ3NDEKTSV4RRFFQ69G5FAV-1", str(tmp_path / "x")])
    assert res.exit_code == 2 and "01ARZ3NDEKTSV4RRFFQ69G5FAV-1" in res.stderr  # NotFound
    assert not (tmp_path / "x").exists()
    res = runner.invoke(cli, ["backup", "create", str(src), url, "--checkpoint-id", "c",
                              "--workers", "0"])
    assert res.exit_code == 2 and "upload_workers" in res.output


def test_cli_short_form_backup_dir_url(tmp_path):
    """The issue's form `headrace backup DIR URL --checkpoint-id ID` is `backup create`."""
    src = tmp_path / "src"
    write_tree(src, sample_tree())
    url = str(tmp_path / "store")
    runner = CliRunner()
    res = runner.invoke(cli, ["backup", str(src), url, "--checkpoint-id", "c7"])
    assert res.exit_code == 0, res.output
    index_id = res.stdout.strip().splitlines()[-1]
    res = runner.invoke(cli, ["restore", url, index_id, str(tmp_path / "dst")])
    assert res.exit_code == 0, res.output
    assert read_tree(tmp_path / "dst") == sample_tree()
    res = runner.invoke(cli, ["backup", str(tmp_path / "missing"), url, "--checkpoint-id", "c"])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_cli_verify_and_show(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {**sample_tree(), "big.sst": b"b" * 300_000})  # a pack + one big blob
    url = str(tmp_path / "store")
    runner = CliRunner()
    res = runner.invoke(cli, ["backup", "create", str(src), url, "--checkpoint-id", "c1"])
    index_id = res.stdout.strip().splitlines()[-1]
    res = runner.invoke(cli, ["backup", "show", url, index_id], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "sub/deep/deeper/b.batch" in res.output
    res = runner.invoke(cli, ["backup", "verify", url, index_id, "--deep"])
    assert res.exit_code == 0 and "committed" in res.output and "ok" in res.output
    blobs = sorted((tmp_path / "store" / "backup" / "blobs").iterdir())
    data = bytearray(blobs[0].read_bytes())
    data[0] ^= 0xFF
    blobs[0].write_bytes(bytes(data))
    blobs[1].unlink()
    res = runner.invoke(cli, ["backup", "verify", url, index_id])
    assert res.exit_code == 1 and "missing" in res.output and "crc32" not in res.output
    res = runner.invoke(cli, ["backup", "verify", url, index_id, "--deep"])
    assert res.exit_code == 1 and "crc32 mismatch" in res.output and "2 problem(s)" in res.output
