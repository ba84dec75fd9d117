"""crc32_combine: the CRC32 of A+B from crc(A), crc(B) and len(B).

Chunks of a large file are read, checksummed and uploaded (or downloaded and written) in parallel;
the whole-file CRC32 the index records is then combined from the per-chunk CRCs without a second
pass over the bytes. This is zlib's ``crc32_combine`` (GF(2) matrix squaring), which Python's
zlib module does not expose.
"""

from __future__ import annotations

_POLY = 0xEDB88320  # reflected IEEE 802.3 polynomial, as zlib


def _gf2_times(mat: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32 of the concatenation A+B, where crc1 = crc32(A), crc2 = crc32(B), len2 = len(B)."""
    if len2 < 0:
        raise ValueError("len2 must be >= 0")
    if len2 == 0:
        return crc1 & 0xFFFFFFFF
    odd = [_POLY] + [1 << n for n in range(31)]  # operator for one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    while True:
        even = _gf2_square(odd)  # first pass: one zero byte
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return (crc1 ^ crc2) & 0xFFFFFFFF
