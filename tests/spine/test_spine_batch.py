"""Batch: consolidation, lookups, ranges, the HRSB format (fuzz, corruption)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import ChecksumMismatch, FormatError, InvalidInput
from headrace.spine import Batch
from headrace.spine.bloom import bloom_build, bloom_may_contain, hash_keys
from headrace.spine.format import FOOTER

KINDS = ["int", "str", "bytes"]


def make(kind: str, k, v, w) -> pa.Table:
    if kind == "int":
        keys = pa.array(np.asarray(k, dtype=np.int64))
    elif kind == "str":
        keys = pa.array([f"k{x:05d}" for x in k], pa.large_string())
    else:
        keys = pa.array([int(x).to_bytes(3, "big") for x in k], pa.large_binary())
    return pa.table({"key": keys, "val": pa.array(np.asarray(v, dtype=np.int64)),
                     "w": pa.array(np.asarray(w, dtype=np.int64))})


def model_of(table: pa.Table) -> dict:
    m: dict = defaultdict(int)
    for k, v, w in zip(*(table.column(c).to_pylist() for c in ("key", "val", "w")), strict=True):
        m[(k, v)] += w
    return {x: y for x, y in m.items() if y}


def as_dict(table: pa.Table) -> dict:
    return {(k, v): w for k, v, w in
            zip(*(table.column(c).to_pylist() for c in ("key", "val", "w")), strict=True)}


def random_table(kind: str, seed: int, n: int = 5000, keys: int = 800) -> pa.Table:
    rng = np.random.default_rng(seed)
    return make(kind, rng.integers(0, keys, n), rng.integers(0, 4, n), rng.choice([-2, -1, 1], n))


@pytest.mark.parametrize("kind", KINDS)
def test_from_arrow_sorts_and_consolidates(kind):
    t = random_table(kind, 1)
    b = Batch.from_arrow(t)
    out = b.to_table()
    assert as_dict(out) == model_of(t)
    pairs = list(zip(out.column("key").to_pylist(), out.column("val").to_pylist(), strict=True))
    assert pairs == sorted(pairs) and len(set(pairs)) == len(pairs)
    assert 0 not in out.column("w").to_pylist()


@pytest.mark.parametrize("val_type,vals", [
    (pa.float64(), [1.5, -2.0, 1.5]), (pa.large_string(), ["a", "b", "a"]),
    (pa.large_binary(), [b"\x00", b"\xff", b"\x00"]), (pa.string(), ["x", "y", "x"])])
def test_value_types(val_type, vals):
    b = Batch.from_arrow(pa.table({"key": pa.array([3, 1, 3]), "val": pa.array(vals, val_type),
                                   "w": pa.array([1, 1, 1])}))
    assert len(b) == 2 and b.to_table().column("w").to_pylist() == [1, 2]
    again = Batch.from_bytes(b.to_bytes())
    assert again.to_table().equals(b.to_table())


def test_from_record_batches_and_merge():
    t = random_table("int", 2)
    parts = t.to_batches(max_chunksize=700)
    b = Batch.from_arrow(parts)
    assert as_dict(b.to_table()) == model_of(t)
    halves = [Batch.from_arrow(t.slice(0, 2000)), Batch.from_arrow(t.slice(2000))]
    assert Batch.merge(halves).to_table().equals(b.to_table())
    cut = Batch.merge(halves, lower_bound=400)
    assert as_dict(cut.to_table()) == {k: w for k, w in model_of(t).items() if k[0] >= 400}


def test_bad_input_is_refused():
    with pytest.raises(InvalidInput, match="nulls"):
        Batch.from_arrow(pa.table({"key": pa.array([1, None]), "val": [1, 2], "w": [1, 1]}))
    with pytest.raises(InvalidInput, match="missing"):
        Batch.from_arrow(pa.table({"key": [1], "w": [1]}))
    with pytest.raises(InvalidInput, match="type"):
        Batch.from_arrow(pa.table({"key": pa.array([1.5]), "val": [1], "w": [1]}))
    with pytest.raises(InvalidInput):
        Batch.from_arrow([])


def test_all_zero_weights_give_an_empty_batch_that_roundtrips():
    b = Batch.from_arrow(pa.table({"key": [1, 1], "val": [2, 2], "w": [1, -1]}))
    assert len(b) == 0
    again = Batch.from_bytes(b.to_bytes())
    assert len(again) == 0 and again.schema.equals(b.schema)
    assert again.lookup_many(pa.array([1])).num_rows == 0


@pytest.mark.parametrize("kind", KINDS)
def test_lookup_many_and_range_match_the_model(kind, tmp_path):
    t = random_table(kind, 3, n=20000, keys=3000)
    b = Batch.from_arrow(t)
    path = tmp_path / "b.batch"
    path.write_bytes(b.to_bytes(block_bytes=2048))
    on_disk = Batch.open_file(path)
    model = model_of(t)
    rng = np.random.default_rng(4)
    probe_ints = rng.integers(0, 3500, 700)
    probe = make(kind, probe_ints, probe_ints, probe_ints).column("key").combine_chunks()
    wanted = set(probe.to_pylist())
    expect = {k: w for k, w in model.items() if k[0] in wanted}
    for batch in (b, on_disk):
        hashes = hash_keys(probe)
        assert as_dict(batch.lookup_many(probe)) == expect
        assert as_dict(batch.lookup_many(probe, hashes=hashes)) == expect
    lo, hi = sorted(make(kind, [500, 1700], [0, 0], [1, 1]).column("key").to_pylist())
    expect_range = {k: w for k, w in model.items() if lo <= k[0] < hi}
    assert as_dict(on_disk.range(lo, hi)) == expect_range
    assert as_dict(b.range(lo, hi)) == expect_range
    assert on_disk.key_bounds() == b.key_bounds()


def test_bloom_has_no_false_negatives_and_few_false_positives():
    keys = pa.array(np.arange(0, 200000, 2, dtype=np.int64))
    bits, k = bloom_build(hash_keys(keys))
    assert bloom_may_contain(bits, k, hash_keys(keys)).all()
    absent = bloom_may_contain(bits, k, hash_keys(pa.array(np.arange(1, 200000, 2))))
    assert absent.mean() < 0.03
    sk = pa.array([f"key-{i}" for i in range(5000)] + [""], pa.large_string())
    sbits, sk_k = bloom_build(hash_keys(sk))
    assert bloom_may_contain(sbits, sk_k, hash_keys(sk)).all()
    assert hash_keys(pa.array(["ab"]))[0] == hash_keys(pa.array(["ab"], pa.large_string()))[0]
    assert hash_keys(pa.array(["ab"]))[0] != hash_keys(pa.array(["ba"]))[0]


@pytest.mark.parametrize("kind", ["int", "str"])
def test_flipped_byte_in_any_block_is_a_checksum_mismatch(kind, tmp_path):
    b = Batch.from_arrow(random_table(kind, 5, n=3000))
    raw = bytearray(b.to_bytes(block_bytes=4096))
    clean = Batch.from_bytes(bytes(raw))
    nblocks = len(clean._check.crcs)
    assert nblocks > 4
    bounds = clean._check.bounds
    for block in range(nblocks):
        r0 = int(bounds[block])
        # a byte of the w column of the block's first row
        at = clean._check.layouts[2].values_off + 8 * r0
        bad = bytearray(raw)
        bad[at] ^= 0x40
        path = tmp_path / f"flip{block}.batch"
        path.write_bytes(bytes(bad))
        on_disk = Batch.open_file(path)
        with pytest.raises(ChecksumMismatch) as ei:
            on_disk.lookup_many(clean.to_table().column("key").slice(r0, 1))
        assert f"block {block} " in str(ei.value) and str(path.name) in str(ei.value)
        with pytest.raises(ChecksumMismatch):
            Batch.from_bytes(bytes(bad))


def test_truncated_or_foreign_files_fail_loudly(tmp_path):
    raw = Batch.from_arrow(random_table("int", 6, n=2000)).to_bytes()
    for cut in (0, 10, len(raw) // 2, len(raw) - 1):
        with pytest.raises(FormatError):
            Batch.from_bytes(raw[:cut])
    with pytest.raises(FormatError, match="magic"):
        Batch.from_bytes(b"PK" + raw[2:])
    bad = bytearray(raw)
    bad[-FOOTER.size + 1] ^= 1
    with pytest.raises(ChecksumMismatch, match="footer"):
        Batch.from_bytes(bytes(bad))


_FUZZ_BASE = {kind: Batch.from_arrow(random_table(kind, 7, n=300, keys=60)).to_bytes(1024)
              for kind in ("int", "str")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["int", "str"]), data=st.data())
def test_fuzz_mutation_and_truncation(kind, data):
    raw = bytearray(_FUZZ_BASE[kind])
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)),
                               max_size=4))
    for pos, x in edits:
        raw[pos] ^= x
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    if cut is not None:
        del raw[cut:]
    try:
        got = Batch.from_bytes(bytes(raw))
    except FormatError:
        return
    expect = Batch.from_bytes(_FUZZ_BASE[kind])
    assert got.to_table().equals(expect.to_table())
