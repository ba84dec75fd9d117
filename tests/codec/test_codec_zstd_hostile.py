"""Hostile zstd: bombs are refused with bounded memory, corruption that decodes is caught.

Peak memory is measured as ru_maxrss growth in a fresh subprocess (tracemalloc does not see
libzstd's allocations), with the address space capped so that a regression fails the test with a
MemoryError instead of taking the machine's memory.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest
import zstandard

from headrace.codec import zstd_compress, zstd_decompress
from headrace.errors import ChecksumMismatch, FormatError

MIB = 1 << 20


def rle_bomb(blocks: int, declared: int | None = None) -> bytes:
    """A hand-made frame of ``blocks`` RLE blocks of 128 KiB: 4 bytes of input each."""
    if declared is None:
        head = struct.pack("<IBB", 0xFD2FB528, 0, (17 - 10) << 3)  # no content size, 128 KiB window
    else:
        head = struct.pack("<IBBI", 0xFD2FB528, 2 << 6, (17 - 10) << 3, declared)
    block = ((128 * 1024) << 3) | (1 << 1)
    return head + (block.to_bytes(3, "little") + b"\0") * (blocks - 1) \
        + (block | 1).to_bytes(3, "little") + b"\0"


_PROBE = textwrap.dedent("""
    import json, resource, sys
    from headrace.codec import zstd_decompress
    from headrace.errors import FormatError
    data = open(sys.argv[1], "rb").read()
    max_size = int(sys.argv[2])
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + 768 * 2**20, resource.RLIM_INFINITY))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        zstd_decompress(data, max_size, key="hostile/obj", offset=16)
        outcome = "decoded"
    except FormatError as e:
        outcome = "FormatError: " + str(e)
    except MemoryError:
        outcome = "MemoryError"
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"outcome": outcome, "growth_mib": (after - before) / 1024}))
""")


def _probe(tmp_path, data: bytes, max_size: int) -> dict:
    path = tmp_path / "frame.zst"
    path.write_bytes(data)
    res = subprocess.run([sys.executable, "-c", _PROBE, str(path), str(max_size)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_98_kb_bomb_is_refused_without_inflating_it(tmp_path):
    bomb = rle_bomb(24_500)  # 98 KB standing for 3 GiB, no declared size
    assert len(bomb) < 100_000
    got = _probe(tmp_path, bomb, 1 << 30)  # a generous caller bound of 1 GiB
    assert got["outcome"].startswith("FormatError"), got
    assert "'hostile/obj'" in got["outcome"] and "exceeds the bound" in got["outcome"]
    assert got["growth_mib"] < 16, got


def test_a_frame_lying_about_its_size_is_refused_before_inflating(tmp_path):
    bomb = rle_bomb(24_500, declared=100)
    got = _probe(tmp_path, bomb, 1 << 30)
    assert got["outcome"].startswith("FormatError"), got
    assert "declares 100 bytes" in got["outcome"]
    assert got["growth_mib"] < 16, got


def test_a_compressed_block_bomb_is_cut_off_within_one_step_of_the_bound(tmp_path):
    buf = io.BytesIO()
    pattern = bytes(range(256)) * 4096  # 1 MiB, not RLE: compressed blocks of a few bytes
    with zstandard.ZstdCompressor(write_content_size=False).stream_writer(buf, closefd=False) as w:
        for _ in range(512):
            w.write(pattern)
    bomb = buf.getvalue()
    assert len(bomb) < 200_000
    got = _probe(tmp_path, bomb, 32 * MIB)
    assert got["outcome"].startswith("FormatError") and "exceeds the bound" in got["outcome"], got
    assert got["growth_mib"] < 32 + 3 * 8 + 16, got  # bound + a step (and its copy) + slack


def test_bounds_hold_across_concatenated_frames():
    frames = zstd_compress(bytes(MIB)) + rle_bomb(64)  # 1 MiB + 8 MiB undeclared
    with pytest.raises(FormatError, match="exceeds the bound"):
        zstd_decompress(frames, 4 * MIB)
    assert zstd_decompress(frames, 9 * MIB) == bytes(9 * MIB)


def test_frames_carry_the_content_checksum_and_a_flip_that_decodes_is_caught():
    data = os.urandom(4000)  # incompressible: stored as a raw block, any flip still decodes
    frame = bytearray(zstd_compress(data))
    assert zstandard.get_frame_parameters(bytes(frame)).has_checksum
    frame[len(frame) // 2] ^= 0x01
    with pytest.raises(ChecksumMismatch, match="checksum") as ei:
        zstd_decompress(bytes(frame), 4000, key="obj", offset=8)
    assert ei.value.key == "obj"


def test_frames_without_checksum_or_size_still_read():
    data = os.urandom(1000) * 50
    old = zstandard.ZstdCompressor(write_checksum=False).compress(data)
    assert not zstandard.get_frame_parameters(old).has_checksum
    assert zstd_decompress(old, len(data)) == data
    undeclared = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    raw = undeclared.compress(data) + undeclared.flush()
    assert zstd_decompress(raw, len(data)) == data


@pytest.mark.parametrize("bad, what", [
    (struct.pack("<IBB", 0xFD2FB528, 0, 7 << 3) + b"\x07\x00\x00", "reserved block type"),
    (struct.pack("<IBB", 0xFD2FB528, 0, 7 << 3) + ((200_000 << 3) | 1).to_bytes(3, "little"),
     "block of 200000 bytes"),
    (rle_bomb(3)[:-5], "truncated"),
    (struct.pack("<II", 0x184D2A50, 100) + b"x", "truncated zstd skippable frame"),
])
def test_malformed_block_structure_is_a_format_error_with_an_offset(bad, what):
    with pytest.raises(FormatError, match=what) as ei:
        zstd_decompress(bad, MIB, key="k", offset=100)
    assert ei.value.offset is not None and ei.value.offset >= 100


def test_skippable_frames_are_skipped():
    skip = struct.pack("<II", 0x184D2A50, 3) + b"abc"
    assert zstd_decompress(skip + zstd_compress(b"hello") + skip, 5) == b"hello"


@pytest.mark.parametrize("bad", [-1, 1.5, None, True])
def test_a_bad_bound_is_invalid_input(bad):
    with pytest.raises(ValueError, match="max_size"):
        zstd_decompress(zstd_compress(b"x"), bad)
