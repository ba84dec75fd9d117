"""`headrace shard ls / inspect / read / verify / gc` on a real local store."""

from __future__ import annotations

import json

from click.testing import CliRunner

from headrace.cli.main import cli
from headrace.persist import PersistClient, make_updates


def test_shard_commands(tmp_path):
    url = str(tmp_path / "store")
    client = PersistClient(url)
    w = client.open_writer("orders")
    w.compare_and_append(make_updates({"k": ["a", "b"]}, [0, 1]), 0, 2)
    client.store.put("persist/shards/orders/parts/leaked.parquet", b"orphan")
    run = CliRunner().invoke
    res = run(cli, ["shard", "ls", url])
    assert res.exit_code == 0 and "orders" in res.output
    res = run(cli, ["shard", "inspect", url, "orders"])
    assert res.exit_code == 0 and json.loads(res.output)["upper"] == 2
    res = run(cli, ["shard", "read", url, "orders", "--as-of", "0"])
    assert res.exit_code == 0 and "a" in res.output and "1 rows" in res.output
    res = run(cli, ["shard", "verify", url, "orders"])
    assert res.exit_code == 0 and "1 parts verified" in res.output
    res = run(cli, ["shard", "gc", url, "--grace-s", "0"])
    assert res.exit_code == 0 and "deleted 1 parts" in res.output
    key = client.state("orders").parts[0].key
    client.store.put(key, b"corrupt")
    res = run(cli, ["shard", "verify", url, "orders"])
    assert res.exit_code != 0 and key in res.output + str(res.exception)
