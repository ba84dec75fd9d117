"""`headrace shard verify` exits cleanly every time (it aborted with 134 in about half the runs:
pyarrow's thread pool still tearing down at interpreter exit)."""

from __future__ import annotations

from newcomer_lib import run_all


def test_shard_verify_exits_cleanly_20_times(many_parts):
    results = run_all([["shard", "verify", str(many_parts), "big"]] * 20)
    codes = [r.returncode for r in results]
    assert codes == [0] * 20, (codes, {r.stderr for r in results if r.returncode})
    assert all(r.stdout.startswith("ok: big seqno ") and ", 16 parts verified" in r.stdout
               for r in results)
    assert all(r.stderr == "" for r in results)
