"""zstd with a bound: round trips, and a decompression bomb is refused before it takes memory."""

from __future__ import annotations

import io
import os
import tracemalloc

import hypothesis.strategies as st
import pytest
import zstandard
from hypothesis import given, settings

from headrace.codec import FormatError, zstd_compress, zstd_decompress

MIB = 1 << 20


def _undeclared(data: bytes) -> bytes:
    """A frame without a content size, as a streaming writer produces."""
    buf = io.BytesIO()
    with zstandard.ZstdCompressor(write_content_size=False).stream_writer(buf, closefd=False) as w:
        w.write(data)
    return buf.getvalue()


def _zero_bomb(size: int) -> bytes:
    buf = io.BytesIO()
    chunk = bytes(16 * MIB)
    with zstandard.ZstdCompressor(write_content_size=False).stream_writer(buf, closefd=False) as w:
        for _ in range(size // len(chunk)):
            w.write(chunk)
    return buf.getvalue()


@settings(max_examples=50)
@given(st.binary(max_size=5000), st.integers(1, 9))
def test_round_trip(data, level):
    frame = zstd_compress(data, level)
    assert zstandard.frame_content_size(frame) == len(data)
    assert zstd_decompress(frame, len(data)) == data


def test_round_trip_of_a_large_buffer_and_buffer_types():
    data = os.urandom(MIB) + bytes(3 * MIB)
    frame = zstd_compress(memoryview(data))
    assert len(frame) < 2 * MIB
    assert zstd_decompress(bytearray(frame), len(data)) == data
    assert zstd_decompress(memoryview(frame), len(data)) == data


def test_declared_size_above_the_bound_is_refused_up_front():
    frame = zstd_compress(bytes(10 * MIB))
    with pytest.raises(FormatError, match="declares 10485760 bytes") as ei:
        zstd_decompress(frame, MIB, key="cp/1", offset=8)
    assert (ei.value.key, ei.value.offset) == ("cp/1", 8)
    assert zstd_decompress(frame, 10 * MIB) == bytes(10 * MIB)  # exactly at the bound is fine


def test_undeclared_bomb_is_cut_off_without_inflating_it():
    bomb = _zero_bomb(512 * MIB)  # ~16 KB that would inflate to 512 MiB
    assert len(bomb) < 64 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="exceeds the bound of 1048576"):
            zstd_decompress(bomb, MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * MIB, f"peak {peak / MIB:.0f} MiB while refusing a bomb"


def test_undeclared_frame_within_the_bound_decodes():
    data = os.urandom(300_000) * 3
    assert zstd_decompress(_undeclared(data), len(data)) == data
    with pytest.raises(FormatError, match="exceeds the bound"):
        zstd_decompress(_undeclared(data), len(data) - 1)


def test_concatenated_frames_all_decode_and_share_the_bound():
    a, b = os.urandom(2 * MIB), b"tail" * 10
    frames = zstd_compress(a) + _undeclared(b) + zstd_compress(b"") + zstd_compress(a)
    assert zstd_decompress(frames, 4 * MIB + 40) == a + b + a
    with pytest.raises(FormatError):
        zstd_decompress(frames, 4 * MIB)


@pytest.mark.parametrize("bad, what", [
    (b"", "not a zstd frame"),
    (b"definitely not zstd", "not a zstd frame"),
    (zstd_compress(b"x" * 1000 + os.urandom(1000))[:-7], "truncated"),
    (zstd_compress(b"abc") + b"trailing", "not a zstd frame"),
])
def test_malformed_input_is_a_format_error(bad, what):
    with pytest.raises(FormatError, match=what):
        zstd_decompress(bad, MIB, key="obj")


def test_corrupted_body_is_a_format_error():
    frame = bytearray(zstd_compress(os.urandom(4000) + bytes(4000)))
    frame[len(frame) // 2] ^= 0xFF
    frame[len(frame) // 2 + 1] ^= 0xFF
    try:
        out = zstd_decompress(bytes(frame), 8000)
    except FormatError:
        return
    # zstd has no checksum by default: a flip may decode, but never to the declared size + more
    assert len(out) == 8000


def test_negative_bound_is_a_programming_error():
    with pytest.raises(ValueError):
        zstd_decompress(zstd_compress(b"x"), -1)
