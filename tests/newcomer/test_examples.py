"""Every script in examples/ runs as written on a fresh local folder store (a subprocess, as a
newcomer would run it) and prints the right answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def expected_revenue() -> list[str]:
    rows = {}
    for i in range(300):
        if i == 7:
            continue  # the example retracts order 7
        region, amount = ["emea", "amer", "apac"][i % 3], 10 * (i % 7)
        n, total, top = rows.get(region, (0, 0, None))
        rows[region] = (n + 1, total + amount, amount if top is None else max(top, amount))
    return [f"{r}: {n} orders, revenue {t}, biggest {m}" for r, (n, t, m) in sorted(rows.items())]


def test_ingest_aggregate_example(tmp_path):
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    out = subprocess.run([sys.executable, str(EXAMPLES / "ingest_aggregate.py"),
                          str(tmp_path / "store")], capture_output=True, text=True, env=env,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines() == expected_revenue()


def test_every_example_has_a_test():
    tested = {"ingest_aggregate.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested
