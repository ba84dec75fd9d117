"""Hostile manifests and bad caller values: FormatError / InvalidInput naming file and field."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest

from headrace.codec import crc32
from headrace.errors import FormatError, InvalidInput
from headrace.spine import Batch, Circuit, Spine, SpineConfig
from headrace.spine.catalog import MANIFEST_MAGIC, VERSION, decode_manifest

GOOD = {"name": "s", "key_type": "int64", "val_type": "int64",
        "batches": [], "lower_bound": None}


def manifest_bytes(body: bytes) -> bytes:
    """An HRSM file around ``body`` with a correct CRC: only the JSON is hostile."""
    return struct.pack("<4sHHI", MANIFEST_MAGIC, VERSION, 0, len(body)) \
        + struct.pack("<I", crc32(body)) + body


def _checkpoint(tmp_path) -> str:
    with Circuit.open(tmp_path, "fp") as c:
        c.spine("s", pa.int64(), pa.int64()).insert(Batch.from_pydict([1, 5], [0, 0], [1, 1]))
        return c.commit()


def test_deeply_nested_manifest_on_disk_is_a_format_error_naming_the_file(tmp_path):
    ck = _checkpoint(tmp_path)
    man = tmp_path / ck / "spine-s.dat"
    man.write_bytes(manifest_bytes(b"[" * 200_000 + b"]" * 200_000))
    with pytest.raises(FormatError, match=r"spine-s\.dat.*nested 200000 deep") as ei:
        Circuit.open(tmp_path, "fp")
    assert str(man) == ei.value.key


@pytest.mark.parametrize("patch, field", [
    ({"key_type": ["int64"]}, "key_type"),
    ({"val_type": {"x": 1}}, "val_type"),
    ({"batches": 7}, "batches"),
    ({"batches": [7]}, "batches"),
    ({"name": None}, "name"),
    ({"lower_bound": [1]}, "lower_bound"),
    ({"lower_bound": {"str": "k"}}, "lower_bound"),  # a str bound on int64 keys
    ({"lower_bound": {"int": True}}, "lower_bound"),
    ({"lower_bound": {"int": 2**70}}, "lower_bound"),
    ({"lower_bound": {"int": 1, "str": "x"}}, "lower_bound"),
])
def test_a_field_of_the_wrong_type_is_a_format_error_naming_the_field(patch, field):
    body = json.dumps({**GOOD, **patch}).encode()
    with pytest.raises(FormatError, match=f"field '{field}'") as ei:
        decode_manifest(manifest_bytes(body), "ck/spine-s.dat")
    assert ei.value.key == "ck/spine-s.dat"


@pytest.mark.parametrize("body, what", [
    (b'{"name": NaN}', "NaN"),
    (b"[1, 2", "not JSON"),
    (b'"\xff"', "not UTF-8"),
    (b"[1]", "expected a JSON object"),
])
def test_malformed_json_is_a_format_error(body, what):
    with pytest.raises(FormatError, match=what):
        decode_manifest(manifest_bytes(body), "m")


def test_a_lower_bound_of_the_wrong_type_on_disk_fails_open_not_a_later_read(tmp_path):
    ck = _checkpoint(tmp_path)
    man = tmp_path / ck / "spine-s.dat"
    man.write_bytes(manifest_bytes(json.dumps({**GOOD, "lower_bound": {"str": "x"}}).encode()))
    with pytest.raises(FormatError, match="lower_bound"):
        Circuit.open(tmp_path, "fp")


def test_an_older_float_bound_on_int_keys_still_reads():
    body = json.dumps({**GOOD, "lower_bound": {"float": 2.5}}).encode()
    assert decode_manifest(manifest_bytes(body), "m").lower_bound == 3


def test_bad_bounds_and_ranges_from_callers_are_invalid_input():
    sp = Spine.from_batches([Batch.from_pydict([1, 2, 3], [0, 0, 0], [1, 1, 1])])
    for bad in ("x", 2.5, True, None):
        with pytest.raises(InvalidInput, match="truncate_below|lower bound"):
            sp.truncate_below(bad)
    with pytest.raises(InvalidInput, match="range"):
        sp.range("a", None)
    with pytest.raises(InvalidInput, match="range"):
        list(sp.cursor(lo=b"x"))
    with pytest.raises(InvalidInput, match="lower bound"):
        Spine(pa.large_string(), pa.int64(), lower_bound=5)
    sp.truncate_below(2)
    assert sp.to_table().column("key").to_pylist() == [2, 3]


@pytest.mark.parametrize("kwargs, field", [
    ({"merge_fanout": 1}, "merge_fanout"),
    ({"base_rows": 0}, "base_rows"),
    ({"memory_budget_bytes": -1}, "memory_budget_bytes"),
    ({"block_bytes": 100}, "block_bytes"),
    ({"merge_fanout": "4"}, "merge_fanout"),
    ({"background_merge": "yes"}, "background_merge"),
])
def test_config_errors_are_invalid_input_naming_the_field(kwargs, field):
    with pytest.raises(InvalidInput, match=f"SpineConfig.{field}"):
        SpineConfig(**kwargs)


def test_gc_keep_below_two_is_invalid_input(tmp_path):
    with Circuit.open(tmp_path, "fp") as c, pytest.raises(InvalidInput, match="keep"):
        c.gc_checkpoint(keep=1)


def test_a_merge_bound_of_the_wrong_type_is_invalid_input_naming_it():
    """Torture case spine_lower_bound_wrong_type: raised ArrowNotImplementedError."""
    ints = Batch.from_pydict([1, 2, 3], [0, 0, 0], [1, 1, 1])
    for bad in ("x", b"x", 2.5, True):
        with pytest.raises(InvalidInput, match=r"Batch\.merge: lower bound") as ei:
            Batch.merge([ints], lower_bound=bad)
        assert repr(bad) in str(ei.value)
    strs = Batch.from_arrow(pa.table({"key": pa.array(["a", "b"], pa.large_string()),
                                      "val": pa.array([0, 0], pa.int64()),
                                      "w": pa.array([1, 1], pa.int64())}))
    with pytest.raises(InvalidInput, match="lower bound 5"):
        Batch.merge([strs], lower_bound=5)
    assert Batch.merge([ints], lower_bound=2).to_table().column("key").to_pylist() == [2, 3]
    assert Batch.merge([strs], lower_bound="b").to_table().column("key").to_pylist() == ["b"]


def test_reservoir_batch_store_arguments_are_invalid_input(tmp_path, monkeypatch):
    from headrace.spine import reservoir_store
    from headrace.spine.reservoir_store import ReservoirBatchStore

    for bad in (100, "4096", 4096.0):
        with pytest.raises(InvalidInput, match="page_bytes"):
            ReservoirBatchStore(str(tmp_path / "r"), page_bytes=bad)
    with pytest.raises(InvalidInput, match=r"'\.\./x'"):
        ReservoirBatchStore(str(tmp_path / "r"), stream="../x")
    assert not (tmp_path / "x").exists()
    monkeypatch.setattr(reservoir_store, "MAX_PAGES_PER_BATCH", 1)
    bs = ReservoirBatchStore(str(tmp_path / "r"), page_bytes=4096)
    try:
        big = Batch.from_pydict(list(range(5000)), [0] * 5000, [1] * 5000)
        with pytest.raises(InvalidInput, match="raise page_bytes"):
            bs.write_batch(big)
    finally:
        bs.close()
