"""`headrace nexmark`: N events into a queue (one queue batch per --batch-events), exactly the
generator's entries, a continuation with --start, and one-line errors. Also the producer API the
command is built on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from headrace.buffer import read_entries
from headrace.errors import InvalidInput
from headrace.nexmark import Generator, GeneratorConfig, json_entries
from headrace.nexmark.producer import produce_events
from headrace.store import open_store


def _headrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headrace.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


def _queued(root, queue: str) -> list[list[bytes]]:
    return [b.entries for b in read_entries(open_store(str(root)), f"{queue}/manifest", None)]


def test_the_command_produces_the_generators_events_into_the_queue(tmp_path):
    root = tmp_path / "store"
    r = _headrace("nexmark", str(root), "nx", "--events", "1200", "--rate", "100",
                  "--seed", "3", "--batch-events", "500", "--entries", "json", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {k: out[k] for k in ("queue", "events", "batches", "persons", "auctions", "bids")} \
        == {"queue": "nx", "events": 1200, "batches": 3, "persons": 24, "auctions": 72,
            "bids": 1104}
    assert out["first_event_time"] == "2015-07-15T00:00:00.000Z"
    assert out["last_event_time"] == "2015-07-15T00:00:11.990Z"  # event 1199 at 100 events/s
    batches = _queued(root, "nx")
    assert [len(b) for b in batches] == [500, 500, 200]
    want = json_entries(Generator(GeneratorConfig(seed=3, rate=100)).events(0, 1200))
    assert [e for b in batches for e in b] == want

    # --start continues the same stream after what is queued
    r = _headrace("nexmark", f"file://{root}", "nx", "--events", "300", "--start", "1200",
                  "--rate", "100", "--seed", "3", "--entries", "json", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["first_event"] == 1200
    batches = _queued(root, "nx")
    assert len(batches) == 4
    more = json_entries(Generator(GeneratorConfig(seed=3, rate=100)).events(0, 1500))
    assert [e for b in batches for e in b] == more


def test_columnar_entries_decode_to_the_generators_tables(tmp_path):
    """The default entry format: per queue batch, each kind's rows as columnar entries, equal to
    the generator's tables row for row."""
    from headrace.nexmark import SCHEMAS
    from headrace.pipeline.encoding import columnar
    from headrace.pipeline.encoding.types import parse_schema

    root = tmp_path / "store"
    r = _headrace("nexmark", str(root), "nx", "--events", "1200", "--rate", "100",
                  "--seed", "3", "--batch-events", "500", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["entries"] == "columnar"
    gen = Generator(GeneratorConfig(seed=3, rate=100))
    for i, entries in enumerate(_queued(root, "nx")):
        want = gen.events(500 * i, min(500, 1200 - 500 * i)).tables
        got: dict = {}
        for e in entries:
            kind, rb = columnar.decode(e, {k: parse_schema(d) for k, d in SCHEMAS.items()})
            assert rb.column("__hr_w").to_pylist() == [1] * rb.num_rows
            got[kind] = rb.drop_columns(["__hr_w"]).to_pylist()
        assert got == {k: t.to_pylist() for k, t in want.items() if t.num_rows}


def test_the_table_output_names_the_counts(tmp_path):
    r = _headrace("nexmark", str(tmp_path / "s"), "q", "--events", "100")
    assert r.returncode == 0, r.stderr
    assert "bids" in r.stdout and "92" in r.stdout and "read_queue('q'" in r.stdout


@pytest.mark.parametrize("args, code, message", [
    (["--events", "5", "--queue-is-not-an-option"], 2, "No such option"),
    (["--events", "0"], 2, "0 is not in the range"),
    (["--events", "5", "--rate", "0"], 2, "0 is not in the range"),
])
def test_bad_arguments_are_usage_errors(tmp_path, args, code, message):
    r = _headrace("nexmark", str(tmp_path / "s"), "q", *args)
    assert r.returncode == code and message in r.stderr, r.stderr


def test_a_queue_name_that_escapes_the_store_is_one_line_error(tmp_path):
    r = _headrace("nexmark", str(tmp_path / "s"), "../outside", "--events", "5")
    assert r.returncode == 1
    assert r.stderr.startswith("Error: ") and "'..'" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "outside").exists()


def test_produce_events_writes_one_batch_per_batch_events(tmp_path):
    cfg = GeneratorConfig(seed=9, rate=50)
    s = produce_events(str(tmp_path), "in", 2_600, config=cfg, batch_events=1_000,
                       entries="json")
    assert (s.events, s.batches, s.per_kind) == (2_600, 3, {"person": 52, "auction": 156,
                                                           "bid": 2_392})
    batches = _queued(tmp_path, "in")
    assert [len(b) for b in batches] == [1_000, 1_000, 600]
    tables = Counter(json.loads(e)["table"] for b in batches for e in b)
    assert tables == {"person": 52, "auction": 156, "bid": 2_392}
    assert s.entry_bytes == sum(len(e) for b in batches for e in b)
    with pytest.raises(InvalidInput, match="count"):
        produce_events(str(tmp_path), "in", 0, config=cfg)
    with pytest.raises(InvalidInput, match="batch_events"):
        produce_events(str(tmp_path), "in", 5, config=cfg, batch_events=0)
    with pytest.raises(InvalidInput, match="entries"):
        produce_events(str(tmp_path), "in", 5, config=cfg, entries="csv")
