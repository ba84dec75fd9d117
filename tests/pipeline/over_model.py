"""A pure-Python model of Spark SQL's window functions, for the OverKernel conformance tests."""

from __future__ import annotations

import datetime as dt
import functools
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
from conformance import NAN, ExpectOverflow, KernelConformance, canon_row, table  # noqa: I001

from headrace.pipeline.encoding import rowkeys as keys


def _cmp_values(a, b) -> int:
    """Spark's order of two non-NULL values: -0.0 = 0.0, NaN = NaN and above every number,
    strings by code point (= UTF-8 bytes)."""
    if isinstance(a, float):
        an, bn = a != a, b != b
        if an or bn:
            return int(an) - int(bn)
    return (a > b) - (a < b)


def _cmp_key(a, b, desc: bool, nulls_first: bool) -> int:
    if a is None or b is None:
        if a is None and b is None:
            return 0
        return (-1 if a is None else 1) * (1 if nulls_first else -1)
    c = _cmp_values(a, b)
    return -c if desc else c


def _norm(v):
    if isinstance(v, float):
        return 0.0 if v == 0 else (NAN if v != v else v)
    return v


class Model:
    """Spark SQL's result of ``SELECT *, f1 OVER w, ...`` over rows (tuples of ``schema``)."""

    def __init__(self, schema: pa.Schema, partition_by, order_by, funcs):
        self.schema, self.funcs = schema, funcs
        self.pidx = [schema.names.index(c) for c in partition_by]
        self.order = [(schema.names.index(o.column), o.descending, o.nulls_go_first)
                      for o in order_by]
        self.codec = keys.RowCodec(schema)

    def _order_cmp(self, a, b) -> int:
        for i, desc, nf in self.order:
            c = _cmp_key(a[i], b[i], desc, nf)
            if c:
                return c
        return 0

    def rows(self, net: list[tuple], overflow_steps: bool = False):
        """Output rows; with ``overflow_steps`` instead True when a long sum's running value
        (Spark's fold) leaves the long range in some frame."""
        parts = defaultdict(list)
        for r in net:
            parts[canon_row(_norm(r[i]) for i in self.pidx)].append(r)
        out: Counter = Counter()
        step_overflow = False
        for rows in parts.values():
            # ties on every order key: by the row's encoding (the kernel's documented rule)
            enc = {r: self.codec.encode(table([r], None, self.schema))[0].as_py()
                   for r in set(rows)}

            def cmp(a, b, enc=enc):
                return self._order_cmp(a, b) or (enc[a] > enc[b]) - (enc[a] < enc[b])

            rows = sorted(rows, key=functools.cmp_to_key(cmp))
            for pos, r in enumerate(rows):
                vals = []
                for fn in self.funcs:
                    if fn.func == "row_number":
                        vals.append(pos + 1)
                    elif fn.func == "rank":
                        vals.append(1 + sum(1 for q in rows[:pos] if self._order_cmp(q, r)))
                    elif fn.func == "dense_rank":
                        keys_before = [q for q in rows[:pos] if self._order_cmp(q, r)]
                        distinct = []
                        for q in keys_before:
                            if not distinct or self._order_cmp(distinct[-1], q):
                                distinct.append(q)
                        vals.append(1 + len(distinct))
                    elif fn.func in ("ntile", "percent_rank", "cume_dist"):
                        vals.append(self._distribution(fn, rows, pos))
                    elif fn.func in ("first", "last", "nth_value"):
                        frame, n, ignore_nulls = fn.frame
                        lo, hi = self._frame(frame, rows, pos)
                        ci = self.schema.names.index(fn.column)
                        xs = [q[ci] for q in rows[lo:hi + 1]
                              if not ignore_nulls or q[ci] is not None]
                        if fn.func == "last":
                            xs = xs[::-1]
                        vals.append(xs[n - 1] if len(xs) >= n else None)
                    elif fn.func in ("lag", "lead"):
                        n, default = fn.frame
                        j = pos - n if fn.func == "lag" else pos + n
                        ci = self.schema.names.index(fn.column)
                        vals.append(rows[j][ci] if 0 <= j < len(rows) else default)
                    else:
                        lo, hi = self._frame(fn.frame, rows, pos)
                        frame = rows[lo:hi + 1]
                        v, over = self._agg(fn, frame)
                        step_overflow |= over
                        vals.append(v)
                out[canon_row((*r, *vals))] += 1
        return step_overflow if overflow_steps else out

    def _distribution(self, fn, rows, pos):
        size = len(rows)
        if fn.func == "ntile":  # Spark's NTile: the first size % n buckets one row larger
            q, r = divmod(size, fn.frame)
            if pos < r * (q + 1):
                return pos // (q + 1) + 1
            return r + (pos - r * (q + 1)) // q + 1
        first, last = pos, pos  # the row's peers are the sorted rows around it
        while first > 0 and not self._order_cmp(rows[first - 1], rows[pos]):
            first -= 1
        while last < size - 1 and not self._order_cmp(rows[last + 1], rows[pos]):
            last += 1
        if fn.func == "percent_rank":  # (rank - 1) / (size - 1)
            return first / (size - 1) if size > 1 else 0.0
        return (last + 1) / size  # the rows up to the row's last peer

    def _frame(self, frame, rows, pos):
        """First and last index of the frame of rows[pos] (lo > hi: empty)."""
        if frame is None or isinstance(frame, int):
            kind, lower, upper = "rows", None if frame is None else -frame, 0
        else:
            kind, lower, upper = frame
        last = len(rows) - 1
        if kind == "rows":
            lo = 0 if lower is None else max(0, pos + lower)
            hi = last if upper is None else min(last, pos + upper)
            return lo, hi
        if lower in (None, 0) and upper in (None, 0):
            peers = [j for j, q in enumerate(rows) if not self._order_cmp(q, rows[pos])]
            return (0 if lower is None else peers[0]), (last if upper is None else peers[-1])
        # a value offset: the rows whose order value v satisfies x + lower <= v <= x + upper
        # (x - upper <= v <= x - lower under DESC); a NULL x only reaches the NULLs
        (i, desc, _), = self.order
        x = rows[pos][i]
        lo_b = None if x is None or lower is None else self._add(x, lower, desc)
        hi_b = None if x is None or upper is None else self._add(x, upper, desc)
        inside = []
        for j, q in enumerate(rows):
            v = q[i]
            if x is None or v is None:  # NULL = NULL; NULL sorts at one end of the values
                before = self._order_cmp(q, rows[pos]) < 0
                after = self._order_cmp(q, rows[pos]) > 0
                ok_lo, ok_hi = lower is None or not before, upper is None or not after
            else:
                ok_lo = lower is None or self._within(v, lo_b, desc, True)
                ok_hi = upper is None or self._within(v, hi_b, desc, False)
            if ok_lo and ok_hi:
                inside.append(j)
        return (inside[0], inside[-1]) if inside else (pos, pos - 1)

    def _add(self, x, offset, desc):
        """Spark's bound value: x + offset (x - offset under DESC) in the column's type."""
        (i, _, _), = self.order
        t = self.schema.field(i).type
        off = -offset if desc else offset
        if pa.types.is_timestamp(t) or pa.types.is_date32(t):
            unit = "microseconds" if pa.types.is_timestamp(t) else "days"
            return x + dt.timedelta(**{unit: off})
        if pa.types.is_floating(t):
            if t == pa.float32():
                return float(np.float32(x) + np.float32(off))
            return x + float(off)
        bits = 32 if pa.types.is_date32(t) else t.bit_width
        y = x + off
        if not -(2 ** (bits - 1)) <= y < 2 ** (bits - 1):
            raise ExpectOverflow
        return y

    @staticmethod
    def _within(v, bound, desc, is_lower):
        """v on the frame's side of ``bound`` in the sort order (NaN above all numbers)."""
        c = _cmp_values(v, bound)
        if desc:
            c = -c
        return c >= 0 if is_lower else c <= 0

    def _agg(self, fn, frame):
        if fn.column is None:
            return len(frame), False
        i = self.schema.names.index(fn.column)
        xs = [r[i] for r in frame if r[i] is not None]
        if fn.func == "count":
            return len(xs), False
        if not xs:
            return None, False
        if fn.func in ("min", "max"):
            best = xs[0]
            for x in xs[1:]:  # the first extreme in frame order stays (greatest/least)
                c = _cmp_values(x, best)
                if (c > 0 and fn.func == "max") or (c < 0 and fn.func == "min"):
                    best = x
            return best, False
        if fn.func == "sum" and pa.types.is_integer(self.schema.field(fn.column).type):
            acc, over = 0, False
            for x in xs:
                acc += x
                over |= not (-(2**63) <= acc < 2**63)
            if not (-(2**63) <= acc < 2**63):
                raise ExpectOverflow
            return acc, over
        acc = 0.0
        for x in xs:
            acc = acc + float(x)
        return (acc / len(xs) if fn.func == "avg" else acc), False


class OverCase(KernelConformance):
    """A window-function conformance class: its kernel and its model are built from one
    ``spec`` = (schema, partition columns, order keys, functions)."""

    spec: tuple

    @functools.cached_property
    def model_(self) -> Model:
        return Model(*self.spec)

    def make_kernel(self):
        from headrace.pipeline.operators.over import OverKernel

        return OverKernel(*self.spec)

    def model(self, net):
        return self.model_.rows(net[0])

    def spark_may_raise(self, net):
        return self.model_.rows(net[0], overflow_steps=True)
