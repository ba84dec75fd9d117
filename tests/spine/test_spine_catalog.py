"""The catalog (HRCK) and manifest (HRSM) formats: roundtrip, fuzz, corruption on disk."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import ChecksumMismatch, FormatError
from headrace.spine import Batch, Circuit, LocalBatchStore
from headrace.spine.catalog import (
    CheckpointInfo,
    SpineManifest,
    decode_catalog,
    decode_manifest,
    encode_catalog,
    encode_manifest,
)

ENTRIES = [CheckpointInfo(uuid.UUID(int=i + 1).hex, i * 10, f"fp-{i}", 1700000000000 + i,
                          "label" if i % 2 else "") for i in range(3)]
MANIFEST = SpineManifest("join.left", "large_string", "float64",
                         ["01ARZ3NDEKTSV4RRFFQ69G5FAV.batch", "01BX5ZZKBKACTAV9WEVGEMMVRZ.batch"],
                         "\x00abc")


def test_roundtrips():
    assert decode_catalog(encode_catalog(ENTRIES)) == ENTRIES
    assert decode_catalog(encode_catalog([])) == []
    m = decode_manifest(encode_manifest(MANIFEST), "m")
    assert m == MANIFEST
    for kt, bound in (("int64", None), ("int64", 7), ("int64", -3), ("large_string", "k"),
                      ("large_binary", b"\xff")):
        mm = SpineManifest("s", kt, "int64", [], bound)
        assert decode_manifest(encode_manifest(mm), "m").lower_bound == bound


def test_manifest_refuses_unsafe_names():
    bad = SpineManifest("ok", "int64", "int64", ["../../etc/passwd"], None)
    with pytest.raises(FormatError, match="batches"):
        decode_manifest(encode_manifest(bad), "m")
    with pytest.raises(FormatError, match="spine name"):
        decode_manifest(encode_manifest(SpineManifest("../x", "int64", "int64", [], None)), "m")


def _fuzz(raw: bytes, data, decode) -> None:
    buf = bytearray(raw)
    for pos, x in data.draw(st.lists(st.tuples(st.integers(0, len(buf) - 1),
                                               st.integers(1, 255)), max_size=3)):
        buf[pos] ^= x
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(buf))))
    if cut is not None:
        del buf[cut:]
    try:
        got = decode(bytes(buf))
    except FormatError:
        return
    assert got == decode(raw)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_catalog(data):
    _fuzz(encode_catalog(ENTRIES), data, decode_catalog)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_manifest(data):
    _fuzz(encode_manifest(MANIFEST), data, lambda b: decode_manifest(b, "m"))


def _state(tmp_path):
    with Circuit.open(tmp_path, "fp") as c:
        c.spine("s", pa.int64(), pa.int64()).insert(Batch.from_pydict([1, 2], [3, 4], [1, 1]))
        return c.commit(step=1)


def test_corrupt_catalog_on_disk_fails_open_and_keeps_files(tmp_path):
    _state(tmp_path)
    cat = tmp_path / "checkpoints.headrace"
    raw = bytearray(cat.read_bytes())
    raw[10] ^= 0x01
    cat.write_bytes(bytes(raw))
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ChecksumMismatch, match="checkpoints.headrace"):
        Circuit.open(tmp_path, "fp")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # gc did not run on bad state
    cat.write_bytes(bytes(raw[:7]))
    with pytest.raises(FormatError):
        LocalBatchStore(tmp_path)


def test_corrupt_manifest_on_disk_fails_open(tmp_path):
    ckpt = _state(tmp_path)
    (man,) = (tmp_path / ckpt).glob("spine-*.dat")
    raw = bytearray(man.read_bytes())
    raw[-2] ^= 0x20
    man.write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatch, match="spine-s.dat"):
        Circuit.open(tmp_path, "fp")
