"""`headrace reservoir inspect / verify / compact` against a real stream."""

from __future__ import annotations

import json

from click.testing import CliRunner

from headrace.cli.main import cli
from headrace.reservoir import ReservoirOptions, ReservoirStorage
from headrace.store import LocalStore


def _stream(root):
    store = LocalStore(root, fsync=False)
    with ReservoirStorage.open(store, options=ReservoirOptions(max_file_size=16384)) as st:
        for v in range(3):
            s = st.session()
            for i in range(5):
                s.write(v * 10 + i, bytes([v]) * 900)
            s.write(0, b"rewritten %d" % v)
            s.commit()
            st.checkpoint()
    return store


def test_inspect_verify_compact(tmp_path):
    _stream(tmp_path)
    url = str(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["reservoir", "inspect", url, "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["version"] == 3 and info["pages"] == 15
    assert [c["version"] for c in info["checkpoints"]] == [1, 2, 3]
    assert runner.invoke(cli, ["reservoir", "inspect", url, "--version", "2"]).exit_code == 0
    res = runner.invoke(cli, ["reservoir", "verify", url])
    assert res.exit_code == 0 and "ok" in res.output
    res = runner.invoke(cli, ["reservoir", "compact", url, "--sweep-grace", "0"])
    assert res.exit_code == 0 and "compacted into checkpoint 4" in res.output, res.output


def test_verify_names_the_corrupt_object_and_exits_1(tmp_path):
    store = _stream(tmp_path)
    key = "default/v/default/ckpt/00000000000000000003.bundle"
    data = bytearray(store.get(key).data)
    data[100] ^= 1
    store.put(key, bytes(data))
    res = CliRunner().invoke(cli, ["reservoir", "verify", str(tmp_path)])
    assert res.exit_code == 1
    assert key in res.output and "at byte 0" in res.output
