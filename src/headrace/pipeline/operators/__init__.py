"""Operator kernels. ``build(kind, input_schemas, params)`` makes the kernel of a plan node;
operators/kernel.py holds the interfaces of kernels and of the state they run on. Imports
encoding and below.

Params are plain JSON-able values (they are part of the pipeline's fingerprint and travel to
executors): aggregate ``{"by": [...], "aggs": {out: "count" | "count(col)" | "sum(col)" |
"avg(col)" | "min(col)" | "max(col)" | "count_distinct(col)" | "sum_distinct(col)" |
"avg_distinct(col)" | [func, col] | [func, [col, ...]]}}`` (the list forms take any column
name; several columns only for count and count_distinct: rows where none is NULL); join
``{"how": ..., "on": [...]}`` or ``{"how": ..., "left_on": [...], "right_on": [...]}``,
plus ``"interval": {"left": lt, "right": rt, "lower_us": n, "upper_us": m}`` for an interval
join; distinct ``{}``; window
functions (``over``) ``{"partition_by": [...], "order_by": [[col, "asc" | "desc",
"nulls_first" | "nulls_last" | None]], "funcs": [[out, func, col | None, frame]]}``
(func: row_number, rank, dense_rank, count, sum, avg, min, max, lag, lead; frame: None = ROWS
UNBOUNDED PRECEDING..CURRENT ROW, n = ROWS n PRECEDING..CURRENT ROW, ``["rows" | "range",
lower, upper]`` otherwise, ``[n, default]`` for lag/lead); session windows (``session``)
``{"by": [...], "time": col, "gap_us": n, "name": "session_window", "aggs": {...} (as
aggregate's), "expiring": bool}``.
"""

from __future__ import annotations

import re

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline.operators.kernel import Kernel

_AGG = re.compile(r"^\s*([a-z_]+)\s*(?:\(\s*(\*|[^()]*?)\s*\))?\s*$", re.IGNORECASE)


def parse_agg(name: str, text: str):
    """'sum(amount)' -> Agg("sum", "amount", name); 'count' and 'count(*)' count rows."""
    from headrace.pipeline.operators.aggregate import FUNCS, Agg

    m = _AGG.match(text) if isinstance(text, str) else None
    if not m or m.group(1).lower() not in FUNCS:
        raise InvalidInput(f"aggregate {name!r}: {text!r} is not one of "
                           f"{[f + '(col)' for f in FUNCS]} or 'count'")
    func, col = m.group(1).lower(), m.group(2)
    if col in (None, "", "*"):
        if func != "count":
            raise InvalidInput(f"aggregate {name!r}: {func} needs a column, as {func}(amount)")
        col = None
    return Agg(func, col.strip("`") if col else None, name)


def _aggs(params: dict) -> list:
    """"sum(col)" text, or [func, column | [columns]] (any column name; the fluent API's)."""
    from headrace.pipeline.operators.aggregate import Agg

    return [parse_agg(n, t) if isinstance(t, str)
            else Agg(t[0], tuple(t[1]) if isinstance(t[1], list | tuple) else t[1], n)
            for n, t in params["aggs"].items()]


def build(kind: str, schemas: list[pa.Schema], params: dict) -> Kernel:
    """The kernel of a plan node of ``kind`` over inputs of ``schemas``; what else it can do it
    declares (operators.kernel: RoutesKeys, Expires, Rebucketable). Each kind's module is
    imported when first built: a Spark worker loads only the kernels its tasks run."""
    if kind == "aggregate":
        from headrace.pipeline.operators.aggregate import AggregateKernel

        return AggregateKernel(schemas[0], params["by"], _aggs(params))
    if kind == "session":
        from headrace.pipeline.operators.session import RoutedSessionKernel, SessionKernel

        cls: type[SessionKernel] = (SessionKernel if params.get("expiring", False)
                                    else RoutedSessionKernel)
        return cls(schemas[0], params["by"], params["time"], params["gap_us"], _aggs(params),
                   name=params.get("name", "session_window"))
    if kind == "join":
        from headrace.pipeline.operators.join import JoinKernel

        keys = ({"on": params["on"]} if "on" in params
                else {"left_on": params["left_on"], "right_on": params["right_on"]})
        if "interval" in params:
            from headrace.pipeline.operators.interval import IntervalJoinKernel

            return IntervalJoinKernel(schemas[0], schemas[1], params.get("how", "inner"),
                                      interval=params["interval"], **keys)
        return JoinKernel(schemas[0], schemas[1], params.get("how", "inner"), **keys)
    if kind == "distinct":
        from headrace.pipeline.operators.distinct import DistinctKernel

        return DistinctKernel(schemas[0])
    if kind == "over":
        from headrace.pipeline.operators.over import OrderKey, OverKernel, WindowFn

        order = []
        for col, direction, nulls in params["order_by"]:
            if direction not in ("asc", "desc") or nulls not in ("nulls_first", "nulls_last",
                                                                 None):
                raise InvalidInput(f"window order key {col!r}: {direction!r} {nulls!r} is not "
                                   "asc/desc with nulls_first/nulls_last/None")
            order.append(OrderKey(col, direction == "desc",
                                  None if nulls is None else nulls == "nulls_first"))
        funcs = [WindowFn(f, c, n, p) for n, f, c, p in params["funcs"]]
        return OverKernel(schemas[0], params["partition_by"], order, funcs)
    if kind == "identity":
        from headrace.pipeline.operators.identity import IdentityKernel

        return IdentityKernel(schemas[0])
    raise InvalidInput(f"unknown operator kind {kind!r}")
