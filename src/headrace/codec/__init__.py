"""Binary helpers shared by every format: checksums, compression, ULIDs, layouts, clocks, and
bounded JSON (``jsonsafe``) for the formats that embed it."""

from headrace.codec.checksum import CRC64_CHECK_VALUE, crc32, crc64, verify_crc32, verify_crc64
from headrace.codec.clock import Clock, ManualClock, SystemClock
from headrace.codec.compression import zstd_compress, zstd_decompress
from headrace.codec.jsonsafe import loads_bounded
from headrace.codec.layout import I64, U8, U16, U32, U64, ByteReader, check_bound
from headrace.codec.ulids import is_ulid, new_ulid, parse_ulid, ulid_timestamp_ms
from headrace.errors import ChecksumMismatch, FormatError

__all__ = [
    "CRC64_CHECK_VALUE", "ByteReader", "ChecksumMismatch", "Clock", "FormatError", "I64",
    "ManualClock", "SystemClock", "U8", "U16", "U32", "U64", "check_bound", "crc32", "crc64",
    "is_ulid", "loads_bounded", "new_ulid", "parse_ulid", "ulid_timestamp_ms", "verify_crc32", "verify_crc64",
    "zstd_compress", "zstd_decompress",
]
