"""`headrace status` against a real S3 endpoint (moto): on S3 an empty prefix is a missing store,
and credentials given in the URL never appear in what the command prints."""

from __future__ import annotations

import json

from newcomer_lib import run

from headrace.buffer import Producer, ProducerConfig
from headrace.persist import PersistClient, make_updates


def test_status_on_s3(s3_url):
    empty = run("status", s3_url)
    assert empty.returncode == 2 and empty.stdout == ""
    lines = empty.stderr.strip().splitlines()
    assert len(lines) == 1 and "no store 's3://" in lines[0] and "nothing is stored" in lines[0]
    client = PersistClient(s3_url, auto_compact_at=None)
    client.open_writer("totals").compare_and_append(make_updates({"k": ["a", "b"]}, [0, 1]),
                                                    0, 2)
    with Producer(ProducerConfig(url=s3_url, flush_size_bytes=1)) as p:
        p.produce([b"{}"]).watcher.await_durable(timeout=10)
    res = run("status", s3_url, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [(s["shard"], s["upper"], s["rows"]) for s in doc["shards"]] == [("totals", 2, 2)]
    assert [(q["queue"], q["length"]) for q in doc["queues"]] == [("ingest", 1)]
    for out in (empty.stderr, res.stdout, res.stderr):
        assert "secret_access_key=testing" not in out and "access_key_id=testing" not in out


def test_a_missing_bucket_is_exit_2_and_one_line_naming_it(moto_server):
    url = moto_server.url("no-such-bucket-newcomer")
    argvs = [("status", url), ("queue", "inspect", url), ("shard", "ls", url, "--json")]
    for argv in argvs:
        res = run(*argv)
        assert res.returncode == 2, (argv, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "bucket 'no-such-bucket-newcomer' does not exist" in lines[0]
        assert "<" not in lines[0] and "testing" not in lines[0] and res.stdout == ""
