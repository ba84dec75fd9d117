"""zstd with a hard bound on decompressed size, so a hostile frame cannot exhaust memory."""

from __future__ import annotations

import zstandard

from headrace.errors import FormatError

DEFAULT_LEVEL = 3


def zstd_compress(data: bytes | bytearray | memoryview, level: int = DEFAULT_LEVEL) -> bytes:
    """Compress to one zstd frame that records its content size."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def zstd_decompress(
    data: bytes | bytearray | memoryview,
    max_output_size: int,
    *,
    key: str | None = None,
    offset: int | None = None,
) -> bytes:
    """Decompress one or more zstd frames, refusing anything larger than ``max_output_size``.

    The declared content size is checked before any allocation; frames without one are streamed
    and cut off at the bound.
    """
    if max_output_size < 0:
        raise ValueError("max_output_size must be >= 0")
    data = bytes(data) if not isinstance(data, bytes) else data
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as e:
        raise FormatError(key, offset, f"not a zstd frame: {e}") from e
    if declared > max_output_size:
        raise FormatError(
            key, offset, f"zstd frame declares {declared} bytes, above the bound {max_output_size}"
        )
    dobj = zstandard.ZstdDecompressor().decompressobj()
    out = bytearray()
    try:
        # feed in slices so that output is produced (and checked) incrementally
        step = 1 << 20
        for i in range(0, len(data), step):
            out += dobj.decompress(data[i : i + step])
            if len(out) > max_output_size:
                raise FormatError(
                    key, offset, f"zstd output exceeds the bound of {max_output_size} bytes"
                )
    except zstandard.ZstdError as e:
        raise FormatError(key, offset, f"corrupt zstd data: {e}") from e
    if not dobj.eof:
        raise FormatError(key, offset, "truncated zstd frame")
    if declared >= 0 and len(out) != declared:
        raise FormatError(key, offset, f"zstd frame declared {declared} bytes, produced {len(out)}")
    return bytes(out)
