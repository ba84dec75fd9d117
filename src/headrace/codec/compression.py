"""zstd with a hard bound on decompressed size, enforced while the output grows.

Why: four bytes of zstd (an RLE block) may inflate to 128 KiB, so a 98 KB frame can stand for
4 GiB. A bound checked only after a decompress call is too late: that call has already taken the
memory. So every frame is first *walked*, block header by block header, without inflating
anything: the walk finds where the frame ends (trailing garbage and truncation are caught before
any work), sums the sizes raw and RLE blocks declare exactly, and refuses the frame when that sum
alone passes the bound. Then the frame is inflated in steps of whole blocks whose output can
total at most ``STEP_BYTES`` (a compressed block yields at most 128 KiB), checking the bound
after each step. So peak memory while refusing is at most the bound plus one step, whatever the
frame claims, and a frame's declared content size (when present) is itself a bound. The usual
input, one frame declaring a size within the bound (what ``zstd_compress`` writes), skips the
walk: libzstd inflates it into one buffer of exactly that size and refuses to go past it.

Frames are written with their content size and the zstd content checksum (XXH64 of the output),
so corruption that still decodes is caught. Frames without either (older files, other writers)
still read.
"""

from __future__ import annotations

import struct

import zstandard

from headrace.errors import ChecksumMismatch, FormatError, InvalidInput

DEFAULT_LEVEL = 3
BLOCK_MAX = 128 * 1024  # zstd's largest block output (and largest block)
STEP_BYTES = 8 << 20  # most output one streaming step may produce
_MAGIC = 0xFD2FB528
_SKIPPABLE = 0x184D2A50  # ... through 0x184D2A5F
_U32 = struct.Struct("<I")
_HEADER_MAX = 18  # magic + the largest frame header


def zstd_compress(data: bytes | bytearray | memoryview, level: int = DEFAULT_LEVEL) -> bytes:
    """One zstd frame that records its content size and carries the content checksum."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True,
                                    write_checksum=True).compress(data)


def zstd_decompress(
    data: bytes | bytearray | memoryview,
    max_size: int,
    *,
    key: str | None = None,
    offset: int | None = None,
) -> bytes:
    """Decompress one or more concatenated zstd frames, refusing more than ``max_size`` bytes.

    ``max_size`` is the caller's bound on the output (all frames together); callers derive it
    from what the format allows, never from a size read from the same untrusted bytes without
    bounding that first. A frame whose declared size passes the bound is refused before it is
    inflated; one that would produce more than it declares, or more than the bound, is cut off
    within one step. Skippable frames are skipped. Every failure is a FormatError naming ``key``
    and the byte offset (``offset`` is where ``data`` starts in the object);
    a content-checksum failure is a ChecksumMismatch.
    """
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 0:
        raise InvalidInput(f"max_size must be an int >= 0, got {max_size!r}")
    view = memoryview(data).cast("B")
    fast = _single_declared_frame(view, max_size)
    if fast is not None:
        return fast
    parts: list[bytes] = []
    total = 0
    pos = 0
    while True:
        frame = _walk_frame(view, pos, key, offset)
        if frame.skippable:
            pos = frame.end
        else:
            declared = frame.declared
            left = max_size - total
            if declared >= 0 and declared > left:
                raise FormatError(key, _at(offset, pos),
                                  f"zstd frame declares {declared} bytes, above the bound "
                                  f"{max_size}" + (f" ({total} already produced)" if total else ""))
            limit = left if declared < 0 else declared
            if frame.exact_out > limit:
                raise FormatError(key, _at(offset, pos),
                                  f"zstd output exceeds the bound of {max_size} bytes: its raw "
                                  f"and RLE blocks alone hold {frame.exact_out}" if declared < 0
                                  else f"zstd frame declares {declared} bytes, its raw and RLE "
                                  f"blocks alone hold {frame.exact_out}")
            if declared >= 0:
                # known, bounded size (what zstd_compress writes): libzstd writes straight into
                # one buffer of that size, as the output grows, and refuses to go past it
                out = _one_shot(view[pos:frame.end], declared, key, _at(offset, pos))
                if pos == 0 and frame.end == len(view):
                    return out
            else:
                out = _stream_frame(view, frame, limit, max_size, key, offset)
            parts.append(out)
            total += len(out)
            pos = frame.end
        if pos == len(view):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _single_declared_frame(view: memoryview, max_size: int) -> bytes | None:
    """The usual case in one call: ``view`` is one frame whose declared size is within the
    bound. libzstd then writes into one buffer of that size as the output grows and refuses to
    go past it, so no walk is needed. None when that is not the case (or anything fails): the
    careful path decides, and names the error."""
    if len(view) < 4 or _U32.unpack_from(view, 0)[0] != _MAGIC:
        return None
    try:
        declared = zstandard.frame_content_size(bytes(view[:_HEADER_MAX]))
    except zstandard.ZstdError:
        return None
    if declared < 0 or declared > max_size:
        return None
    try:
        out = zstandard.ZstdDecompressor().decompress(view, max_output_size=declared,
                                                      allow_extra_data=False)
    except zstandard.ZstdError:
        return None
    return out if len(out) == declared else None


class _Frame:
    __slots__ = ("start", "blocks_at", "end", "declared", "exact_out", "skippable")

    def __init__(self, start: int, blocks_at: int, end: int, declared: int, exact_out: int,
                 skippable: bool = False):
        self.start, self.blocks_at, self.end = start, blocks_at, end
        self.declared, self.exact_out, self.skippable = declared, exact_out, skippable


def _walk_frame(view: memoryview, pos: int, key: str | None, offset: int | None) -> _Frame:
    """Locate the frame at ``pos`` from its headers alone: its end, declared and exact sizes."""
    n = len(view)
    if n - pos < 4:
        raise FormatError(key, _at(offset, pos), "not a zstd frame: fewer than 4 bytes")
    (magic,) = _U32.unpack_from(view, pos)
    if magic & 0xFFFFFFF0 == _SKIPPABLE:
        if n - pos < 8:
            raise FormatError(key, _at(offset, pos), "truncated zstd skippable frame")
        (size,) = _U32.unpack_from(view, pos + 4)
        if pos + 8 + size > n:
            raise FormatError(key, _at(offset, pos), "truncated zstd skippable frame")
        return _Frame(pos, pos + 8, pos + 8 + size, 0, 0, skippable=True)
    if magic != _MAGIC:
        raise FormatError(key, _at(offset, pos), f"not a zstd frame: magic {magic:#010x}")
    rest = bytes(view[pos: pos + _HEADER_MAX])  # the header only (the calls may copy it)
    try:
        params = zstandard.get_frame_parameters(rest)
        header = zstandard.frame_header_size(rest)
    except zstandard.ZstdError as e:
        raise FormatError(key, _at(offset, pos), f"not a zstd frame: {e}") from e
    if params.dict_id:
        raise FormatError(key, _at(offset, pos), "zstd frame needs a dictionary")
    declared = params.content_size
    declared = -1 if declared == zstandard.CONTENTSIZE_UNKNOWN else declared
    at = pos + header
    exact = 0
    while True:
        if at + 3 > n:
            raise FormatError(key, _at(offset, at), "truncated zstd frame (block header)")
        h = view[at] | (view[at + 1] << 8) | (view[at + 2] << 16)
        last, btype, size = h & 1, (h >> 1) & 3, h >> 3
        if btype == 3:
            raise FormatError(key, _at(offset, at), "corrupt zstd data: reserved block type")
        if size > BLOCK_MAX:
            raise FormatError(key, _at(offset, at), f"corrupt zstd data: block of {size} bytes")
        if btype == 1:  # RLE: one byte repeated ``size`` times
            exact += size
            at += 4
        else:
            if btype == 0:  # raw: ``size`` bytes copied
                exact += size
            at += 3 + size
        if at > n:
            raise FormatError(key, _at(offset, n), "truncated zstd frame")
        if last:
            break
    if params.has_checksum:
        at += 4
        if at > n:
            raise FormatError(key, _at(offset, n), "truncated zstd frame (checksum)")
    return _Frame(pos, pos + header, at, declared, exact)


def _one_shot(view: memoryview, declared: int, key: str | None, offset: int | None) -> bytes:
    try:
        out = zstandard.ZstdDecompressor().decompress(view, max_output_size=declared,
                                                      allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise _corrupt(e, key, offset, 0) from e
    if len(out) != declared:
        raise FormatError(key, offset, f"zstd frame declared {declared} bytes, produced {len(out)}")
    return out


def _stream_frame(view: memoryview, frame: _Frame, limit: int, max_size: int,
                  key: str | None, offset: int | None) -> bytes:
    """Inflate one walked frame in steps of whole blocks, each producing <= STEP_BYTES."""
    dobj = zstandard.ZstdDecompressor().decompressobj()
    out = bytearray()
    fed = frame.start  # bytes of the frame handed to the decompressor so far
    at = frame.blocks_at
    end = frame.end
    try:
        while fed < end:
            step_bound = 0
            while at < end:  # extend the step block by block (headers were checked by the walk)
                h = view[at] | (view[at + 1] << 8) | (view[at + 2] << 16)
                btype, size = (h >> 1) & 3, h >> 3
                block_out = size if btype != 2 else BLOCK_MAX
                if step_bound and step_bound + block_out > STEP_BYTES:
                    break
                step_bound += block_out
                at += 4 if btype == 1 else 3 + size
                if h & 1:  # the last block: the checksum (if any) goes with it
                    at = end
            out += dobj.decompress(view[fed:at])
            fed = at
            if len(out) > limit:
                what = (f"zstd frame declared {frame.declared} bytes, produced more"
                        if frame.declared >= 0 else
                        f"zstd output exceeds the bound of {max_size} bytes")
                raise FormatError(key, _at(offset, frame.start), what)
    except zstandard.ZstdError as e:
        raise _corrupt(e, key, offset, frame.start) from e
    if not dobj.eof:
        raise FormatError(key, _at(offset, frame.start), "truncated zstd frame")
    if frame.declared >= 0 and len(out) != frame.declared:
        raise FormatError(key, _at(offset, frame.start),
                          f"zstd frame declared {frame.declared} bytes, produced {len(out)}")
    return bytes(out)


def _corrupt(e: zstandard.ZstdError, key: str | None, offset: int | None,
             pos: int) -> FormatError:
    text = str(e)
    if "checksum" in text.lower():
        return ChecksumMismatch(key, _at(offset, pos), f"zstd content checksum: {text}")
    return FormatError(key, _at(offset, pos), f"corrupt zstd data: {text}")


def _at(offset: int | None, pos: int) -> int | None:
    return None if offset is None else offset + pos
