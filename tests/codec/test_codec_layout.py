"""ByteReader: every read is bounds-checked; bad bytes give FormatError, never a crash or garbage."""

from __future__ import annotations

import struct

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from headrace.codec import I64, U16, U32, U64, ByteReader, FormatError, check_bound


def test_reads_little_endian_fields_in_order():
    buf = struct.pack("<BHIQq", 7, 0x1234, 0xDEADBEEF, 2**63 + 5, -42) + b"tail"
    r = ByteReader(buf, key="k")
    assert (r.u8(), r.u16(), r.u32(), r.u64(), r.i64()) == (7, 0x1234, 0xDEADBEEF, 2**63 + 5, -42)
    assert bytes(r.take(4)) == b"tail"
    assert r.remaining() == 0
    assert U16.size + U32.size + U64.size + I64.size == 22


def test_short_read_names_key_offset_and_field():
    r = ByteReader(b"\x01\x02\x03", key="manifest", base=100)
    r.u16("version")
    with pytest.raises(FormatError) as ei:
        r.u32("count")
    e = ei.value
    assert (e.key, e.offset) == ("manifest", 102)
    assert "count" in str(e) and "needs 4 bytes, 1 present" in str(e)
    assert r.pos == 2  # a failed read does not move the cursor


def test_array_is_a_zero_copy_view_and_checks_the_count_first():
    values = np.arange(10, dtype="<u4")
    buf = bytearray(values.tobytes())
    r = ByteReader(buf)
    arr = r.array("<u4", 10, "ids")
    assert arr.tolist() == list(range(10))
    buf[0] = 99
    assert arr[0] == 99  # a view over the buffer, not a copy
    r = ByteReader(values.tobytes())
    with pytest.raises(FormatError, match="ids"):
        r.array("<u8", 2**40, "ids")  # a hostile count: refused, nothing allocated
    with pytest.raises(FormatError, match="negative count"):
        r.array("<u4", -1, "ids")


def test_end_limits_the_reader_to_a_window():
    r = ByteReader(b"abcdefgh", end=4)
    assert bytes(r.take(4)) == b"abcd"
    with pytest.raises(FormatError):
        r.u8()
    with pytest.raises(FormatError):
        r.seek(5)
    r.seek(2)
    assert r.u8() == ord("c")


def test_check_bound():
    assert check_bound(10, 10, key=None, offset=None, what="count") == 10
    with pytest.raises(FormatError, match="count 11 out of bounds"):
        check_bound(11, 10, key="k", offset=0, what="count")
    with pytest.raises(FormatError):
        check_bound(-1, 10, key="k", offset=0, what="count")


_OPS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["u8", "u16", "u32", "u64", "i64"])),
    st.tuples(st.just("take"), st.integers(-3, 40)),
    st.tuples(st.just("array"), st.sampled_from(["<u2", "<i8", "<f4"]), st.integers(-2, 12)),
    st.tuples(st.just("seek"), st.integers(-5, 60)),
), max_size=25)
_FMT = {"u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q", "i64": "<q"}


@given(st.binary(max_size=48), _OPS)
def test_any_sequence_of_reads_is_correct_or_a_format_error(buf, ops):
    r = ByteReader(buf, key="fuzz")
    for op in ops:
        pos = r.pos
        try:
            if op[0] in _FMT:
                got = getattr(r, op[0])()
                assert got == struct.unpack_from(_FMT[op[0]], buf, pos)[0]
            elif op[0] == "take":
                got = r.take(op[1])
                assert bytes(got) == buf[pos : pos + op[1]] and len(got) == op[1]
            elif op[0] == "array":
                arr = r.array(op[1], op[2])
                assert arr.tobytes() == buf[pos : pos + arr.nbytes]
                assert len(arr) == op[2]
            else:
                r.seek(op[1])
                assert r.pos == op[1]
        except FormatError as e:
            assert e.key == "fuzz"
            assert r.pos == pos  # refused reads leave the cursor where it was
        assert 0 <= r.pos <= len(buf)
