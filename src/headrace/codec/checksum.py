"""CRC32 (IEEE 802.3, as zlib) and CRC64 (ECMA-182, as fastcrc) over bytes-like objects."""

from __future__ import annotations

import zlib

from fastcrc import crc64 as _crc64

from headrace.errors import ChecksumMismatch

CRC64_CHECK_VALUE = 0x6C40DF5F0B497347  # crc64_ecma_182(b"123456789")


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """IEEE CRC32; pass the previous result as ``value`` to continue a running checksum."""
    return zlib.crc32(data, value) & 0xFFFFFFFF


def crc64(data: bytes | bytearray | memoryview) -> int:
    """CRC-64/ECMA-182 (the variant with check value 0x6C40DF5F0B497347)."""
    if not isinstance(data, bytes):
        data = bytes(data)  # fastcrc takes bytes only
    return _crc64.ecma_182(data)


def verify_crc32(data, expected: int, *, key: str | None, offset: int | None, what: str) -> None:
    actual = crc32(data)
    if actual != expected:
        raise ChecksumMismatch(key, offset, f"crc32 of {what}", expected=expected, actual=actual)


def verify_crc64(data, expected: int, *, key: str | None, offset: int | None, what: str) -> None:
    actual = crc64(data)
    if actual != expected:
        raise ChecksumMismatch(key, offset, f"crc64 of {what}", expected=expected, actual=actual)
