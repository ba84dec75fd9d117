"""zstd with a hard bound on decompressed size, so a hostile frame cannot exhaust memory."""

from __future__ import annotations

import zstandard

from headrace.errors import FormatError

DEFAULT_LEVEL = 3
_BLOCK_MAX = 128 * 1024  # zstd's largest block
_FEED_MAX = 1 << 20


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
    """Decompress one or more concatenated zstd frames, refusing more than ``max_output_size``.

    Each frame's declared content size is checked before it is inflated; frames without one are
    streamed and cut off at the bound. Bytes after the last frame that are not a frame, a
    truncated frame, or a frame producing other than its declared size raise FormatError.
    """
    if max_output_size < 0:
        raise ValueError("max_output_size must be >= 0")
    view = memoryview(data).cast("B")
    out = bytearray()
    pos = 0
    while True:  # one pass per frame; a frame's declared size is checked before it is inflated
        frame = view[pos:]
        try:
            declared = zstandard.frame_content_size(frame)
        except zstandard.ZstdError as e:
            raise FormatError(key, _at(offset, pos), f"not a zstd frame: {e}") from e
        if declared >= 0 and len(out) + declared > max_output_size:
            raise FormatError(key, _at(offset, pos),
                              f"zstd frame declares {declared} bytes, above the bound "
                              f"{max_output_size}")
        if declared >= 0 and pos == 0:
            # the usual case, one frame of known size: one call, one allocation of that size
            try:
                return zstandard.ZstdDecompressor().decompress(view, allow_extra_data=False)
            except zstandard.ZstdError:
                pass  # several frames, or corrupt: the frame-by-frame path below says which
        start = len(out)
        dobj = zstandard.ZstdDecompressor().decompressobj()
        try:
            consumed = i = 0
            while i < len(frame):
                # libzstd refuses to produce more than a frame declares (checked against the
                # bound above), so only frames of unknown size need the cautious feed
                step = _FEED_MAX if declared >= 0 else _feed_size(max_output_size - len(out))
                chunk = frame[i : i + step]
                out += dobj.decompress(chunk)
                if len(out) > max_output_size:
                    raise FormatError(key, _at(offset, pos),
                                      f"zstd output exceeds the bound of {max_output_size} bytes")
                if dobj.eof:
                    consumed = i + len(chunk) - len(dobj.unused_data)
                    break
                i += len(chunk)
        except zstandard.ZstdError as e:
            raise FormatError(key, _at(offset, pos), f"corrupt zstd data: {e}") from e
        if not dobj.eof:
            raise FormatError(key, _at(offset, pos), "truncated zstd frame")
        if declared >= 0 and len(out) - start != declared:
            raise FormatError(key, _at(offset, pos),
                              f"zstd frame declared {declared} bytes, produced {len(out) - start}")
        pos += consumed
        if pos == len(view):
            return bytes(out)
        # another frame follows (or trailing bytes, which the next pass refuses)


def _feed_size(budget: int) -> int:
    """How many compressed bytes to feed next so one call cannot inflate far past ``budget``.

    A zstd block produces at most 128 KiB and costs at least 4 bytes of input (3-byte header
    plus content), so ``n`` input bytes complete at most ``n / 4 + 1`` blocks. Feeding
    ``4 * budget / 128 KiB`` bytes (at least 256) keeps the output of one call within the budget
    plus ~8 MiB, whatever the frame claims: a bomb is refused before it can take memory.
    """
    return min(_FEED_MAX, max(256, 4 * (max(budget, 0) // _BLOCK_MAX)))


def _at(offset: int | None, pos: int) -> int | None:
    return None if offset is None else offset + pos
