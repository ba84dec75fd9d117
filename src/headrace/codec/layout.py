"""Little-endian fixed-layout reading with bounds checks.

Every length or count read from bytes is checked against the bytes actually present before
anything is allocated from it; a failure is a FormatError naming the object key and offset.
Arrays come back as zero-copy numpy views (``np.frombuffer``) over the source buffer.
"""

from __future__ import annotations

import struct

import numpy as np

from headrace.errors import FormatError

U8 = struct.Struct("<B")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
I64 = struct.Struct("<q")


class ByteReader:
    """A bounds-checked cursor over a buffer (bytes, bytearray, memoryview or mmap)."""

    __slots__ = ("buf", "key", "pos", "end", "base")

    def __init__(self, buf, key: str | None = None, pos: int = 0, end: int | None = None,
                 base: int = 0):
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
        self.key = key
        self.pos = pos
        self.end = len(self.buf) if end is None else end
        self.base = base  # added to offsets in errors, when buf is a slice of a larger object

    def remaining(self) -> int:
        return self.end - self.pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise FormatError(
                self.key, self.base + self.pos,
                f"{what}: needs {n} bytes, {self.end - self.pos} present",
            )

    def _unpack(self, st: struct.Struct, what: str) -> int:
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def u8(self, what: str = "u8") -> int:
        return self._unpack(U8, what)

    def u16(self, what: str = "u16") -> int:
        return self._unpack(U16, what)

    def u32(self, what: str = "u32") -> int:
        return self._unpack(U32, what)

    def u64(self, what: str = "u64") -> int:
        return self._unpack(U64, what)

    def i64(self, what: str = "i64") -> int:
        return self._unpack(I64, what)

    def take(self, n: int, what: str = "bytes") -> memoryview:
        """The next ``n`` bytes as a zero-copy view."""
        self.need(n, what)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def array(self, dtype: str | np.dtype, count: int, what: str = "array") -> np.ndarray:
        """The next ``count`` little-endian values of ``dtype`` (e.g. '<u4') as a read-only view."""
        dt = np.dtype(dtype)
        if count < 0:
            raise FormatError(self.key, self.base + self.pos, f"{what}: negative count {count}")
        self.need(count * dt.itemsize, what)
        arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
        self.pos += count * dt.itemsize
        return arr

    def seek(self, pos: int, what: str = "offset") -> None:
        if pos < 0 or pos > self.end:
            raise FormatError(self.key, self.base + self.pos,
                              f"{what} {pos} outside the {self.end} bytes present")
        self.pos = pos


def check_bound(value: int, limit: int, *, key: str | None, offset: int | None, what: str) -> int:
    """Refuse a size/count read from bytes that exceeds ``limit`` before allocating from it."""
    if value < 0 or value > limit:
        raise FormatError(key, offset, f"{what} {value} out of bounds (limit {limit})")
    return value
