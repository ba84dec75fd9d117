"""`headrace spine inspect / verify / dump` on a real storage directory."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from click.testing import CliRunner

from headrace.cli.main import cli
from headrace.spine import Batch, Circuit, SpineConfig


def _make_state(path) -> list[str]:
    cfg = SpineConfig(background_merge=False, memory_budget_bytes=0)
    with Circuit.open(path, "cli-graph", config=cfg) as c:
        sp = c.spine("counts", pa.int64(), pa.int64())
        rng = np.random.default_rng(3)
        for _ in range(3):
            sp.insert(Batch.from_arrow(pa.table({"key": rng.integers(0, 50, 400),
                                                 "val": rng.integers(0, 2, 400),
                                                 "w": np.ones(400, dtype=np.int64)})))
        c.spine("names", pa.large_string(), pa.float64()).insert(
            Batch.from_pydict(["ann", "bob"], [1.5, 2.5], [1, 1]))
        c.commit(step=1)
        return sorted(c.store.batch_names())


def test_inspect_verify_dump(tmp_path):
    names = _make_state(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["spine", "inspect", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "counts" in res.output and "names" in res.output and "0 unreferenced" in res.output
    res = runner.invoke(cli, ["spine", "verify", str(tmp_path)])
    assert res.exit_code == 0 and f"{len(names)} batches verified, 0 failures" in res.output
    res = runner.invoke(cli, ["spine", "dump", str(tmp_path), "names", "--key", "bob"])
    assert res.exit_code == 0 and "'bob'" in res.output and "'ann'" not in res.output
    res = runner.invoke(cli, ["spine", "dump", str(tmp_path), "counts", "--key", "7"])
    assert res.exit_code == 0 and "counts at step 1" in res.output
    res = runner.invoke(cli, ["spine", "dump", str(tmp_path), "nope"])
    assert res.exit_code != 0 and "no spine 'nope'" in res.output


def test_verify_reports_a_corrupt_block(tmp_path):
    names = _make_state(tmp_path)
    victim = tmp_path / names[0]
    raw = bytearray(victim.read_bytes())
    at = Batch.from_bytes(bytes(raw))._check.layouts[2].values_off  # first weight of block 0
    raw[at] ^= 0xFF
    victim.write_bytes(bytes(raw))
    res = CliRunner().invoke(cli, ["spine", "verify", str(tmp_path)])
    assert res.exit_code == 1
    assert f"FAIL {names[0]}" in res.output and "block 0" in res.output


def test_inspect_refuses_a_directory_a_circuit_holds(tmp_path):
    with Circuit.open(tmp_path, "g"):
        res = CliRunner().invoke(cli, ["spine", "inspect", str(tmp_path)])
    assert res.exit_code != 0 and "locked" in res.output
