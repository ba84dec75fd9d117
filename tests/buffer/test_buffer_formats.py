"""Batch and manifest formats: hand vectors from the RFC, round trips, fuzzing, corruption."""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.buffer import manifest_format as mf
from headrace.buffer.batch_format import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    decode_batch,
    decode_block,
    encode_batch,
)
from headrace.buffer.manifest_format import (
    EMPTY_MANIFEST,
    Manifest,
    append_entry,
    decode_manifest,
    drop_through,
    encode_manifest,
    read_footer,
)
from headrace.buffer.types import ManifestEntry, Metadata
from headrace.errors import FormatError

# -- hand vectors (computed from the RFC's layout) ---------------------------------------------


def test_empty_manifest_is_22_bytes():
    assert EMPTY_MANIFEST == bytes.fromhex("00000000" "0000000000000000" "0000000000000000" "0100")
    m = decode_manifest(EMPTY_MANIFEST)
    assert m.entries == [] and m.next_sequence == 0 and m.epoch == 0


def test_empty_uncompressed_batch_is_7_bytes():
    assert encode_batch([]) == bytes.fromhex("00" "00000000" "0100")
    assert decode_batch(bytes.fromhex("00000000000100")) == []


def test_hello_world_foo_batch_is_32_bytes():
    data = encode_batch([b"hello", b"world", b"foo"])
    expected = (b"\x05\x00\x00\x00hello" b"\x05\x00\x00\x00world" b"\x03\x00\x00\x00foo"
                + bytes.fromhex("00" "03000000" "0100"))
    assert len(data) == 32 and data == expected
    assert decode_batch(data) == [b"hello", b"world", b"foo"]


def test_one_entry_manifest_is_58_bytes():
    buf = bytearray(EMPTY_MANIFEST)
    seq = append_entry(buf, "a", [Metadata(0, 1, b"x")])
    assert seq == 0
    entry = (struct.pack("<I", 32) + struct.pack("<Q", 0) + struct.pack("<H", 1) + b"a"
             + struct.pack("<I", 1) + struct.pack("<I", 0) + struct.pack("<q", 1)
             + struct.pack("<I", 1) + b"x")
    footer = struct.pack("<IQQH", 1, 1, 0, 1)
    assert len(entry) == 36 and len(buf) == 58
    assert bytes(buf) == entry + footer
    assert decode_manifest(bytes(buf)).entries == [ManifestEntry(0, "a", (Metadata(0, 1, b"x"),))]


def test_zstd_batch_round_trip_and_footer_uncompressed():
    entries = [b"abc" * 100, b"", b"z" * 1000]
    data = encode_batch(entries, COMPRESSION_ZSTD)
    assert data[-7:] == bytes.fromhex("01" "03000000" "0100")
    assert decode_batch(data) == entries
    assert len(data) < sum(map(len, entries))


@pytest.mark.parametrize("entries", [[b"a", b"", b"bcd", b"ef"], [b"abc"] * 5, [b""] * 3,
                                     [b"x" * 3, b"y" * 3, b"zz"]])
def test_entry_array_matches_entries(entries):
    block = decode_block(encode_batch(entries))
    assert block.entry_array().to_pylist() == entries == block.entries()


# -- refusals ---------------------------------------------------------------------------------


def test_unknown_versions_and_compressions_are_refused():
    with pytest.raises(FormatError, match="version"):
        decode_batch(bytes.fromhex("00000000000200"), key="k")
    with pytest.raises(FormatError, match="compression"):
        decode_batch(bytes.fromhex("02000000000100"), key="k")
    with pytest.raises(FormatError, match="version") as ei:
        decode_manifest(EMPTY_MANIFEST[:-2] + b"\x02\x00", key="ingest/manifest")
    assert ei.value.key == "ingest/manifest" and ei.value.offset == 20


def test_manifest_keeps_a_bad_location_for_its_readers_to_refuse():
    # one hostile entry must not make the whole manifest undecodable (GC, inspect, skip need
    # it); readers refuse the entry itself (test_buffer_safety)
    data = mf.encode_entry(0, "../escape", []) + mf.encode_footer(1, 1, 0)
    assert decode_manifest(data, key="m").entries[0].location == "../escape"
    bad_utf8 = struct.pack("<IQH", 8 + 2 + 1 + 4, 0, 1) + b"\xff" + struct.pack("<I", 0)
    with pytest.raises(FormatError, match="UTF-8"):
        decode_manifest(bad_utf8 + mf.encode_footer(1, 1, 0), key="m")


def test_manifest_refuses_gap_in_sequences():
    data = (mf.encode_entry(0, "a", []) + mf.encode_entry(2, "b", [])
            + mf.encode_footer(2, 3, 0))
    with pytest.raises(FormatError, match="does not follow"):
        decode_manifest(data, key="m")


def test_huge_counts_are_refused_before_allocation():
    # record_count 2**32-1 in a 7-byte file, metadata_count 2**32-1 in a tiny entry
    with pytest.raises(FormatError, match="record_count"):
        decode_batch(bytes.fromhex("00ffffffff0100"))
    body = struct.pack("<QH", 0, 1) + b"a" + struct.pack("<I", 0xFFFFFFFF)
    data = struct.pack("<I", len(body)) + body + mf.encode_footer(1, 1, 0)
    with pytest.raises(FormatError, match="metadata_count"):
        decode_manifest(data)


@pytest.mark.parametrize("kind", ["batch", "batch-zstd", "manifest"])
def test_every_truncation_fails_loudly(kind):
    if kind == "manifest":
        m = Manifest([ManifestEntry(5, "ingest/x.batch", (Metadata(0, 7, b"p"),)),
                      ManifestEntry(6, "ingest/y.batch", ())], 7, 3)
        data, decode = encode_manifest(m), decode_manifest
    else:
        comp = COMPRESSION_ZSTD if kind == "batch-zstd" else COMPRESSION_NONE
        data, decode = encode_batch([b"one", b"two", b"three"], comp), decode_batch
    for cut in range(len(data)):
        with pytest.raises(FormatError):
            decode(data[:cut], key="obj")


# -- hypothesis: round trip and mutation ------------------------------------------------------

entries_st = st.lists(st.binary(max_size=40), max_size=20)
metadata_st = st.builds(Metadata, st.integers(0, 2**32 - 1), st.integers(-(2**63), 2**63 - 1),
                        st.binary(max_size=12))
location_st = st.lists(st.text("abcxyz0189", min_size=1, max_size=8), min_size=1,
                       max_size=3).map(lambda parts: "/".join(parts) + ".batch")


@st.composite
def manifests(draw):
    first = draw(st.integers(0, 2**40))
    n = draw(st.integers(0, 6))
    entries = [ManifestEntry(first + i, draw(location_st),
                             tuple(draw(st.lists(metadata_st, max_size=3))))
               for i in range(n)]
    return Manifest(entries, first + n, draw(st.integers(0, 2**64 - 1)))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries_st, st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD]))
def test_batch_round_trip(entries, comp):
    block = decode_block(encode_batch(entries, comp))
    assert block.entries() == entries == block.entry_array().to_pylist()


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_manifest_round_trip_and_append_equivalence(m):
    data = encode_manifest(m)
    assert decode_manifest(data) == m
    # appending one by one produces the same bytes as encoding the whole list
    if m.entries:
        buf = bytearray(mf.encode_footer(0, m.entries[0].sequence, m.epoch))
        for e in m.entries:
            assert append_entry(buf, e.location, e.metadata) == e.sequence
        assert bytes(buf) == data


def _mutate(data: bytes, draw_ops) -> bytes:
    b = bytearray(data)
    for op, pos, val in draw_ops:
        if not b:
            break
        pos %= len(b)
        if op == "flip":
            b[pos] ^= val or 1
        elif op == "set":
            b[pos] = val
        elif op == "cut":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = bytes([val])
        else:
            del b[pos]
    return bytes(b)


ops_st = st.lists(st.tuples(st.sampled_from(["flip", "set", "cut", "insert", "delete"]),
                            st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(entries_st, st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD]), ops_st)
def test_batch_mutation_decodes_canonically_or_raises_format_error(entries, comp, ops):
    mutated = _mutate(encode_batch(entries, comp), ops)
    try:
        out = decode_batch(mutated, key="b")
    except FormatError:
        return
    if mutated[-7] == COMPRESSION_NONE:  # uncompressed: decoding is exact, so re-encode matches
        assert encode_batch(out) == mutated


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(manifests(), ops_st)
def test_manifest_mutation_decodes_canonically_or_raises_format_error(m, ops):
    mutated = _mutate(encode_manifest(m), ops)
    try:
        out = decode_manifest(mutated, key="m")
    except FormatError:
        return
    assert encode_manifest(out) == mutated


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.integers(0, 2**41))
def test_drop_through_keeps_exactly_the_later_entries(m, through):
    new, dropped = drop_through(encode_manifest(m), through)
    out = decode_manifest(new)
    assert out.entries == [e for e in m.entries if e.sequence > through]
    assert dropped == len(m.entries) - len(out.entries)
    assert (out.next_sequence, out.epoch) == (m.next_sequence, m.epoch)


# -- O(1) append --------------------------------------------------------------------------------


def _append_cost(n_entries: int) -> float:
    buf = bytearray(EMPTY_MANIFEST)
    entry_md = [Metadata(0, 1, b"payload")]
    for _ in range(n_entries):
        append_entry(buf, "ingest/01ARZ3NDEKTSV4RRFFQ69G5FAV.batch", entry_md)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            append_entry(buf, "ingest/01ARZ3NDEKTSV4RRFFQ69G5FAV.batch", entry_md)
        best = min(best, time.perf_counter() - t0)
    assert read_footer(buf).entry_count == n_entries + 1000
    return best


def test_append_is_constant_in_the_number_of_entries(monkeypatch):
    # appending never decodes an existing entry ...
    def boom(*a, **k):
        raise AssertionError("append decoded existing entries")

    monkeypatch.setattr(mf, "_decode_entry", boom)
    monkeypatch.setattr(mf, "_entry_heads", boom)
    small, large = _append_cost(10), _append_cost(100_000)
    # ... and costs the same at 10 and 100,000 entries (a decode would be ~10,000x slower)
    assert large < 5 * small + 0.002, (small, large)
