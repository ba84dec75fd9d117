"""JSON from untrusted bytes: bounded size and nesting, typed fields, FormatError naming where.

Why: ``json.loads`` recurses once per nesting level, so ``[[[[...]]]]`` from a hostile or
corrupt file raises RecursionError (or exhausts the C stack) instead of a format error; and code
that indexes a decoded object trusts its types, so ``{"batches": 7}`` surfaces as a TypeError far
from the file. ``loads_bounded`` measures the nesting with a linear, non-recursive scan before the
parser sees the bytes; ``field`` checks one member's type and names it in the error.
"""

from __future__ import annotations

import json

import numpy as np

from headrace.errors import FormatError, InvalidInput

DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_BYTES = 64 << 20
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1
_MISSING = object()
_CHUNK = 1 << 20


def nesting_depth(data: bytes | bytearray | memoryview) -> int:
    """The deepest array/object nesting in JSON text: vectorised, linear, no recursion.

    A quote is escaped when an odd run of backslashes precedes it; brackets between an opening
    and a closing unescaped quote are string content and do not count. Runs over 1 MiB chunks
    (carrying depth, in-string parity and the trailing backslash run), so scratch memory stays
    small whatever the input size.
    """
    view = memoryview(data).cast("B")
    deepest = depth = 0
    inside = 0  # 1 while within a string
    carried_run = 0  # backslashes ending the previous chunk
    for start in range(0, len(view), _CHUNK):
        arr = np.frombuffer(view[start: start + _CHUNK], dtype=np.uint8)
        idx = np.arange(len(arr), dtype=np.int32)
        backslash = arr == ord("\\")
        # the backslash run ending at each position (a run continuing from the previous chunk
        # counts from before this chunk's start)
        last_other = np.maximum.accumulate(np.where(backslash, np.int32(-1 - carried_run), idx))
        run = idx - last_other
        before = np.empty(len(arr), dtype=np.int32)
        before[0] = carried_run
        before[1:] = run[:-1]
        real_quote = (arr == ord('"')) & (before % 2 == 0)
        quotes = np.cumsum(real_quote, dtype=np.int32) + inside
        outside = (quotes % 2 == 0) & ~real_quote
        levels = np.cumsum(np.where(outside, _OPEN[arr], 0), dtype=np.int64) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
        inside = int(quotes[-1]) % 2
        carried_run = int(run[-1])
    return deepest


def loads_bounded(data: bytes | bytearray | memoryview | str, where: str | None, *,
                  max_depth: int = DEFAULT_MAX_DEPTH, max_bytes: int = DEFAULT_MAX_BYTES,
                  offset: int | None = None):
    """Parse JSON, refusing more than ``max_bytes``, nesting deeper than ``max_depth``, invalid
    UTF-8 and the non-standard constants NaN/Infinity. Errors are FormatError naming ``where``
    (an object key or file) and the byte offset (``offset`` = where ``data`` starts in it)."""
    if max_depth < 1 or max_bytes < 0:
        raise InvalidInput(f"max_depth must be >= 1 and max_bytes >= 0, got {max_depth}, "
                           f"{max_bytes}")
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise FormatError(where, offset, f"JSON of {len(raw)} bytes, above the limit {max_bytes}")
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise FormatError(where, offset, f"JSON nested {depth} deep, above the limit {max_depth}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(where, _at(offset, e.start), "JSON is not UTF-8") from e
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        at = len(text[: e.pos].encode())
        raise FormatError(where, _at(offset, at), f"not JSON: {e.msg}") from e
    except ValueError as e:  # a refused constant
        raise FormatError(where, offset, str(e)) from e
    except RecursionError as e:  # a caller already deep in its own stack: still a format error
        raise FormatError(where, offset, "JSON nested too deep to parse") from e


def field(obj: dict, name: str, types: type | tuple[type, ...], where: str | None, *,
          default=_MISSING, offset: int | None = None):
    """``obj[name]`` if it has one of ``types`` (bool is never an int here); FormatError naming
    the field otherwise. With ``default``, a missing field gives the default."""
    if not isinstance(obj, dict):
        raise FormatError(where, offset, f"expected a JSON object, got {_kind(obj)}")
    if name not in obj:
        if default is not _MISSING:
            return default
        raise FormatError(where, offset, f"field {name!r} is missing")
    value = obj[name]
    want = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in want) or not isinstance(value, want):
        names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in want)
        raise FormatError(where, offset, f"field {name!r} must be {names}, got {_kind(value)}")
    return value


_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer",
               float: "a number", bool: "a boolean", type(None): "null"}


def _kind(value) -> str:
    for t in (bool, dict, list, str, int, float, type(None)):
        if isinstance(value, t):
            return _TYPE_NAMES[t]
    return type(value).__name__


def _refuse_constant(name: str):
    raise ValueError(f"JSON constant {name} is not allowed")


def _at(offset: int | None, pos: int) -> int | None:
    return pos if offset is None else offset + pos
