"""`headrace queue inspect|verify|stats|gc` against a real local queue."""

from __future__ import annotations

import json

from click.testing import CliRunner

from headrace.buffer import Producer, ProducerConfig
from headrace.cli.main import cli
from headrace.store import open_store


def test_queue_commands(tmp_path):
    url = str(tmp_path / "q")
    with Producer(ProducerConfig(url=url, flush_size_bytes=1)) as p:
        p.produce([b"a", b"b"], b"meta")
        p.produce([b"c"])
    store = open_store(url)
    before = store.get("ingest/manifest").data
    runner = CliRunner()
    res = runner.invoke(cli, ["queue", "inspect", url, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["epoch"] == 0 and doc["next_sequence"] == 2
    assert doc["entries"][0]["metadata"][0]["payload"] == "meta"
    assert store.get("ingest/manifest").data == before  # inspect never bumps the epoch
    res = runner.invoke(cli, ["queue", "inspect", url])
    assert res.exit_code == 0 and "2 entries, next_sequence 2, epoch 0" in res.output
    res = runner.invoke(cli, ["queue", "verify", url])
    assert res.exit_code == 0 and "3 records" in res.output
    res = runner.invoke(cli, ["queue", "stats", url])
    assert res.exit_code == 0 and "queue_length" in res.output
    res = runner.invoke(cli, ["queue", "gc", url, "--grace-period-s", "0"])
    assert res.exit_code == 0 and "deleted 0" in res.output  # both files still referenced
    # a corrupted batch file makes verify fail loudly, naming the object
    loc = doc["entries"][1]["location"]
    store.put(loc, store.get(loc).data[:-3])
    res = runner.invoke(cli, ["queue", "verify", url])
    assert res.exit_code == 1 and loc in res.output
