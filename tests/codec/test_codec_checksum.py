"""CRC32 (IEEE) and CRC64 (ECMA-182): standard check values, any buffer type, clear mismatches."""

from __future__ import annotations

import zlib

import hypothesis.strategies as st
import pytest
from hypothesis import given

from headrace.codec import (
    CRC64_CHECK_VALUE,
    ChecksumMismatch,
    FormatError,
    crc32,
    crc64,
    verify_crc32,
    verify_crc64,
)


def test_crc64_check_value():
    assert CRC64_CHECK_VALUE == 0x6C40DF5F0B497347
    assert crc64(b"123456789") == 0x6C40DF5F0B497347


def test_crc32_check_value():
    assert crc32(b"123456789") == 0xCBF43926  # CRC-32/ISO-HDLC, as zlib


def test_empty_input():
    assert crc32(b"") == 0
    assert crc64(b"") == 0


@given(st.binary(max_size=2000), st.integers(0, 2000))
def test_running_crc32_equals_whole(data, cut):
    cut = min(cut, len(data))
    assert crc32(data[cut:], crc32(data[:cut])) == crc32(data) == zlib.crc32(data)


@given(st.binary(max_size=2000), st.integers(0, 2000))
def test_running_crc64_equals_whole(data, cut):
    """A file's CRC64 is computed over its parts (header, page area) without joining them."""
    cut = min(cut, len(data))
    assert crc64(memoryview(data)[cut:], crc64(data[:cut])) == crc64(data)


@given(st.binary(max_size=500))
def test_any_buffer_type_gives_the_same_checksum(data):
    for buf in (bytearray(data), memoryview(data)):
        assert crc32(buf) == crc32(data)
        assert crc64(buf) == crc64(data)


def test_a_single_bit_flip_changes_both():
    data = bytearray(b"headrace" * 100)
    a32, a64 = crc32(data), crc64(data)
    data[417] ^= 0x04
    assert crc32(data) != a32 and crc64(data) != a64


def test_verify_passes_and_mismatch_names_key_offset_and_values():
    data = b"payload"
    verify_crc32(data, crc32(data), key="k", offset=8, what="page")
    verify_crc64(data, crc64(data), key="k", offset=8, what="file")
    with pytest.raises(ChecksumMismatch) as ei:
        verify_crc64(data, crc64(data) ^ 1, key="some/key", offset=4096, what="data file")
    e = ei.value
    assert isinstance(e, FormatError) and isinstance(e, ValueError)
    assert (e.key, e.offset) == ("some/key", 4096)
    assert e.expected == crc64(data) ^ 1 and e.actual == crc64(data)
    assert "some/key" in str(e) and "4096" in str(e) and "crc64 of data file" in str(e)
    with pytest.raises(ChecksumMismatch, match="crc32 of page"):
        verify_crc32(data, 0, key=None, offset=None, what="page")
