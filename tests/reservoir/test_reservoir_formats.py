"""Byte formats: round trips, hypothesis fuzzing (mutate/truncate → same result or FormatError)."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from headrace.codec import crc64
from headrace.errors import FormatError
from headrace.reservoir.formats import checkpoint as ckfmt
from headrace.reservoir.formats import datafile
from headrace.reservoir.formats import registry as regfmt
from headrace.reservoir.recovery import decode_object, split_object
from headrace.reservoir.state import FileRow
from headrace.reservoir.verify import verify_data_file

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _datafile(n=5, pad=False):
    w = datafile.BlobFileWriter(1 << 20, pad_to_block=pad)
    for i in range(n):
        w.add(i * 3 - 2, bytes([i]) * (10 + i * 7))
    return w, w.finalize()


def _checkpoint(snapshot=False):
    cp = ckfmt.CheckpointData.empty(7, snapshot, 42)
    cp.page_ids = np.array([-5, 1, 9], np.int64)
    cp.page_file_ids = np.array([1, 1, 2], np.uint64)
    cp.page_offsets = np.array([100, 200, 300], np.uint32)
    cp.page_sizes = np.array([10, 20, 30], np.uint32)
    cp.page_crc32s = np.array([7, 8, 9], np.uint32)
    cp.deleted_page_ids = np.array([4], np.int64)
    for name, val in (("file_ids", [1, 2]), ("file_page_counts", [2, 1]),
                      ("file_non_active", [0, 0]), ("file_sizes", [400, 500]),
                      ("file_deleted_sizes", [0, 0]), ("file_added_at", [6, 7]),
                      ("file_crc64s", [11, 12])):
        setattr(cp, name, np.array(val, getattr(cp, name).dtype))
    cp.deleted_file_ids = np.array([3], np.uint64)
    cp.deleted_file_at = np.array([7], np.uint64)
    return cp


def _registry():
    r = regfmt.Registry.empty()
    for v in range(1, 40):
        r = r.appended(v, v % 20 == 0, v % 3 == 0, v * 1000 + 7)
    return r


def _cp_equal(a, b):
    assert (a.version, a.snapshot, a.next_file_id) == (b.version, b.snapshot, b.next_file_id)
    for name in ckfmt.COLUMN_NAMES:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_datafile_round_trip_packed_and_padded():
    for pad in (False, True):
        w, enc = _datafile(pad=pad)
        h, ids, offs = datafile.parse_index(enc.data, "k")
        assert h.page_count == 5 and list(ids) == [-2, 1, 4, 7, 10]
        for i in range(5):
            page = enc.data[offs[i]:offs[i] + enc.sizes[i]]
            assert page == bytes([i]) * (10 + i * 7)
            if pad:
                assert offs[i] % 4096 == 0
        assert enc.crc64 == crc64(enc.data)


def test_checkpoint_and_registry_round_trip():
    for snap in (False, True):
        cp = _checkpoint(snap)
        raw = ckfmt.encode(cp)
        _cp_equal(ckfmt.decode(raw, "k"), cp)
        _cp_equal(ckfmt.decode(ckfmt.decompress(ckfmt.compress(raw), "k", 1 << 20), "k"), cp)
    reg = _registry()
    back = regfmt.decode(regfmt.encode(reg), "r")
    assert back.versions.tolist() == reg.versions.tolist() == list(range(20, 40))
    assert back.snapshot.tolist() == reg.snapshot.tolist()
    assert back.bundle.tolist() == reg.bundle.tolist()
    assert back.crc64s.tolist() == reg.crc64s.tolist()
    assert reg.chain_for(39) == list(range(20))


def test_bundle_crc_chain():
    w = datafile.BlobFileWriter(1 << 20)
    w.add(1, b"a" * 100)
    seen = {}

    def tail(crc, end, offs):
        seen["crc"], seen["end"] = crc, end
        cp = _checkpoint()
        cp.file_crc64s = np.array([crc, 0], np.uint64)
        raw = ckfmt.encode(cp)
        reg = regfmt.Registry.empty().appended(7, False, True, crc64(raw))
        return raw, regfmt.encode(reg)

    enc = encode = datafile.encode_bundle(w, tail)
    assert seen["crc"] == crc64(enc.data[:seen["end"]])
    obj = split_object(encode.data, "b")
    cp = decode_object(obj, int(obj.registry.crc64s[0]), 1 << 20)
    assert int(cp.file_crc64s[0]) == crc64(enc.data[:seen["end"]])


def _mutations():
    return st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
        st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
    )


def _mutate(data: bytes, m) -> bytes:
    kind, pos, val = m
    if not data:
        return data
    pos %= len(data)
    if kind == "flip":
        b = bytearray(data)
        b[pos] ^= val
        return bytes(b)
    if kind == "cut":
        return data[:pos]
    return data[:pos] + bytes([val]) + data[pos:]


@FUZZ
@given(m=_mutations())
def test_fuzz_registry(m):
    good = regfmt.encode(_registry())
    bad = _mutate(good, m)
    try:
        r = regfmt.decode(bad, "r")
    except FormatError:
        return
    assert bad == good or r.versions.tolist() == _registry().versions.tolist()


@FUZZ
@given(m=_mutations(), snap=st.booleans())
def test_fuzz_checkpoint_raw_and_compressed(m, snap):
    raw = ckfmt.encode(_checkpoint(snap))
    for blob, dec in ((raw, lambda b: ckfmt.decode(b, "c")),
                      (ckfmt.compress(raw),
                       lambda b: ckfmt.decode(ckfmt.decompress(b, "c", 1 << 20), "c"))):
        try:
            dec(_mutate(blob, m))  # never anything but FormatError
        except FormatError:
            pass


@FUZZ
@given(m=_mutations(), kind=st.sampled_from(["bundle", "combined", "plain"]))
def test_fuzz_checkpoint_objects_crc_checked(m, kind):
    """Through the CRC chain a mutated object decodes identically or raises FormatError."""
    cp = _checkpoint()
    raw = ckfmt.encode(cp)
    if kind == "bundle":
        w = datafile.BlobFileWriter(1 << 20)
        w.add(3, b"z" * 50)
        reg_holder = {}

        def tail(crc, end, offs):
            reg = regfmt.Registry.empty().appended(7, False, True, crc64(raw))
            reg_holder["crc"] = crc64(raw)
            return raw, regfmt.encode(reg)

        good = datafile.encode_bundle(w, tail).data
        expected = reg_holder["crc"]
    else:
        section = ckfmt.compress(raw)
        expected = crc64(section)
        reg = regfmt.Registry.empty().appended(7, False, False, expected)
        good = ckfmt.encode_combined(False, section, regfmt.encode(reg)) if kind == "combined" \
            else section
    bad = _mutate(good, m)
    try:
        obj = split_object(bad, "obj")
        crc = int(obj.registry.crc64s[-1]) if obj.registry is not None else expected
        got = decode_object(obj, crc, 1 << 20)
    except FormatError as e:
        assert e.key == "obj"
        return
    _cp_equal(got, cp)


@FUZZ
@given(m=_mutations())
def test_fuzz_datafile(m):
    _w, enc = _datafile(8)
    row = FileRow(1, 8, 0, len(enc.data), 0, 1, enc.crc64)
    bad = _mutate(enc.data, m)
    try:
        datafile.parse_index(bad, "d")  # structure alone: FormatError or a result, no crash
    except FormatError:
        pass
    try:
        ids, _offs = verify_data_file(bad, "d", row)
    except FormatError as e:
        assert e.key == "d"
        return
    assert ids.tolist() == enc.page_ids.tolist()


def test_counts_are_bounded_before_allocation():
    raw = bytearray(ckfmt.encode(_checkpoint()))
    raw[8:16] = (1 << 60).to_bytes(8, "little")  # upserted pages: absurd
    with pytest.raises(FormatError, match="exceeds"):
        ckfmt.decode(bytes(raw), "c")
    z = bytearray(ckfmt.compress(bytes(ckfmt.encode(_checkpoint()))))
    z[4:8] = (0xFFFFFFFF).to_bytes(4, "little")
    with pytest.raises(FormatError, match="above"):
        ckfmt.decompress(bytes(z), "c", 1 << 20)
    _w, enc = _datafile()
    d = bytearray(enc.data)
    d[8:12] = (0xFFFFFFF).to_bytes(4, "little")
    with pytest.raises(FormatError, match="page count"):
        datafile.parse_index(bytes(d), "d")
