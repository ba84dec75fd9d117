"""Every script in examples/ runs as written on a fresh local folder store and prints the right
answer (each also checks itself against Spark batch SQL and fails loudly if it differs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from newcomer_lib import job_failure

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]  # the first one runs them all

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def ran(runnable_docs, name: str) -> list[str]:
    """The example's stdout lines; the test fails with its traceback if it raised."""
    job = runnable_docs[name]
    assert job["ok"], job_failure(runnable_docs, name)
    return job["out"].strip().splitlines()


def expected_revenue() -> list[str]:
    rows = {}
    for i in range(300):
        if i == 7:
            continue  # the example retracts order 7
        region, amount = ["emea", "amer", "apac"][i % 3], 10 * (i % 7)
        n, total, top = rows.get(region, (0, 0, None))
        rows[region] = (n + 1, total + amount, amount if top is None else max(top, amount))
    return [f"{r}: {n} orders, revenue {t}, biggest {m}" for r, (n, t, m) in sorted(rows.items())]


def test_ingest_aggregate_example(runnable_docs):
    assert ran(runnable_docs, "ingest_aggregate.py") == [*expected_revenue(),
                                                         "same as Spark batch SQL"]


def test_join_dead_letter_example(runnable_docs):
    out = ran(runnable_docs, "join_dead_letter.py")
    assert "same as Spark batch SQL" in out
    assert "dead letters: 4 (metrics: 4 bad entries)" in out
    letters = [ln for ln in out if ln.startswith("  queue sequence")]
    # each bad entry kept with the field at fault: none for a non-JSON entry
    assert [re.search(r"field=(\S+)", ln).group(1) for ln in letters] == \
        ["None", "order_id", "customer_id", "table"]
    assert "entry=b'order 121: 7 EUR'" in letters[0]


def test_backup_restore_example(runnable_docs):
    out = ran(runnable_docs, "backup_restore.py")
    first = next(ln for ln in out if ln.startswith("run 1:"))
    assert int(re.search(r"backups in the store: (\d+) objects", first).group(1)) > 0
    assert "local state directory deleted: 0 files" in out
    second = next(ln for ln in out if ln.startswith("run 2:"))
    # the second run had to fetch the state it continued from out of the backups
    assert int(re.search(r"\((\d+) bytes read", second).group(1)) > 0
    assert int(re.search(r"now (\d+) local files", second).group(1)) > 0
    assert out[-1] == "same as Spark batch SQL over both runs' input"


def test_read_shard_stream_example(runnable_docs):
    out = ran(runnable_docs, "read_shard_stream.py")
    starts = [i for i, ln in enumerate(out) if ln.startswith("stream micro-batch")]
    assert len(starts) == 2
    snapshot, changes = out[starts[0] + 1:starts[1]], out[starts[1] + 1:]
    assert snapshot and all(ln.endswith(", 0, 1)") for ln in snapshot)  # time 0, inserted
    assert any(ln.endswith(", 1, -1)") for ln in changes)  # an old row retracted at time 1
    assert out[-1] == "same as Spark batch SQL"


def test_windowed_aggregate_example(runnable_docs):
    out = ran(runnable_docs, "windowed_aggregate.py")
    windows = [ln for ln in out if ln.startswith("window ")]
    # the final watermark is 49.5 s - 5 s: windows ending by 40 s are final, each once
    assert {ln.split()[1] for ln in windows} == {"00:00:00-00:00:10", "00:00:10-00:00:20",
                                                 "00:00:20-00:00:30", "00:00:30-00:00:40"}
    assert len(windows) == len(set(windows))
    assert "late bids dropped: 3" in out
    assert out[-1] == "same as Spark batch SQL"


def test_every_example_has_a_test():
    tested = {"ingest_aggregate.py", "join_dead_letter.py", "backup_restore.py",
              "read_shard_stream.py", "windowed_aggregate.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested
