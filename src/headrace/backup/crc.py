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


def _zero_operators() -> list[list[int]]:
    """_ZEROS[k]: the operator that appends 2**k zero bytes to a CRC (computed once)."""
    op = [_POLY] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):  # 2, 4, 8 zero bits = one zero byte
        op = _gf2_square(op)
    out = [op]
    for _ in range(63):
        op = _gf2_square(op)
        out.append(op)
    return out


_ZEROS = _zero_operators()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32 of the concatenation A+B, where crc1 = crc32(A), crc2 = crc32(B), len2 = len(B)."""
    if len2 < 0 or len2 >= 1 << 64:
        raise ValueError("len2 must be in [0, 2**64)")
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(_ZEROS[k], crc1)
        len2 >>= 1
        k += 1
    return (crc1 ^ crc2) & 0xFFFFFFFF


def combine_chunks(chunks) -> int:
    """Whole-file CRC32 from (crc32, size) of consecutive chunks."""
    value = 0
    for i, (crc, size) in enumerate(chunks):
        value = crc if i == 0 else crc32_combine(value, crc, size)
    return value
