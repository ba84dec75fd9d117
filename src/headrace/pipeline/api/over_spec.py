"""PySpark window-function Columns (``F.row_number().over(w)``) -> the ``over`` kernel's
parameters, through Spark's analyser.

As for aggregates (agg_spec.py), a Column's text is not trusted: the column is added to an empty
DataFrame with ``withColumn`` and the analysed plan's ``Window`` node is read — the function,
its argument, the frame, the PARTITION BY and ORDER BY columns with their directions and NULL
placement. Built: row_number, rank, dense_rank, ntile(n), percent_rank, cume_dist;
count/sum/avg/min/max and first/last (``ignorenulls`` either way; ``first_value``/
``last_value``) and nth_value(col, n[, ignoreNulls]) over any ROWS frame (``rowsBetween(a,
b)``, unbounded either side) and RANGE frame: UNBOUNDED, CURRENT ROW (Spark's default frame
when ``orderBy`` is given without a frame is RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT
ROW, the current row's peers included) or value offsets (``rangeBetween(-5, 0)``) over one
integer, float or date order column, or a day-time interval (``INTERVAL 10 SECONDS
PRECEDING``, SQL text) over a timestamp; an aggregate over ``Window.partitionBy(...)`` without
orderBy (Spark's frame: the whole partition); lag and lead with a literal n >= 1 and a literal
default. What the kernel cannot do exactly is refused here, at definition time, naming it:
value offsets over decimal order columns, year-month intervals, other functions
(percentile_approx, collect_list, ...), lag/lead IGNORE NULLS, first/last/nth_value or a
bounded frame without orderBy, expressions as partition or order keys or arguments (add them
with ``with_column`` first).
"""

from __future__ import annotations

from headrace.errors import InvalidInput
from headrace.pipeline.encoding.types import arrow_schema
from headrace.pipeline.names import W

_RANKING = {"RowNumber": "row_number", "Rank": "rank", "DenseRank": "dense_rank",
            "NTile": "ntile", "PercentRank": "percent_rank", "CumeDist": "cume_dist"}
_AGGS = {"count": "count", "sum": "sum", "avg": "avg", "mean": "avg", "min": "min",
         "max": "max"}
_VALUES = {"first": "first", "first_value": "first", "last": "last", "last_value": "last"}
_BUILT = ("row_number, rank, dense_rank, ntile, percent_rank, cume_dist, lag, lead, first, "
          "last, nth_value, count, sum, avg, min, max")
_OFFSETS = {"Lag": "lag", "Lead": "lead"}
#: Spark types of a lag/lead default carried as a plain (JSON-able) value
_DEFAULT_TYPES = {"long", "integer", "short", "byte", "double", "float", "string", "boolean"}


def _cls(obj) -> str:
    return obj.getClass().getSimpleName()


def _window_nodes(plan) -> list:
    out, todo = [], [plan]
    while todo:
        node = todo.pop()
        if _cls(node) == "Window":
            out.append(node)
        kids = node.children()
        todo += [kids.apply(i) for i in range(kids.size())]
    return out


def has_window(df) -> bool:
    """Whether a DataFrame's analysed plan computes a window function."""
    return bool(_window_nodes(df._jdf.queryExecution().analyzed()))


def _column(expr, what: str, where: str, inputs: set[int]) -> str:
    """The input column ``expr`` is (Spark projects an expression key to a new attribute)."""
    if _cls(expr) != "AttributeReference" or expr.exprId().id() not in inputs:
        raise InvalidInput(f"{where}: {what} {expr.sql()} is an expression; add it as a column "
                           "with with_column first, then use the column")
    return expr.name()


def plan_over(frame, name: str, col) -> tuple[dict, object] | None:
    """(kernel params, Spark's output schema) when ``col`` is a window function, else None."""
    if "OVER" not in str(col).upper():
        return None
    where = f"with_column {name!r}"
    probe = frame.probe()  # aliased: frame["col"] Columns resolve on it
    try:
        out = probe.withColumn(name, col)
    except Exception as e:  # AnalysisException: unknown column, unordered row_number, ...
        raise InvalidInput(f"{where}: Spark cannot analyse it: {str(e).splitlines()[0]}") from e
    plan = out._jdf.queryExecution().analyzed()
    windows = _window_nodes(plan)
    if not windows:
        return None
    exprs = windows[0].windowExpressions()
    if len(windows) != 1 or exprs.size() != 1 or exprs.apply(0).name() != name:
        raise InvalidInput(f"{where}: a window function must be the whole column, as "
                           "F.avg('x').over(w); compute on its result in a later step")
    attrs = probe._jdf.queryExecution().analyzed().output()
    inputs = {attrs.apply(i).exprId().id() for i in range(attrs.size())}
    wexpr = exprs.apply(0).child()
    fn = wexpr.windowFunction()
    kind = _cls(fn)
    frame_or_offset = None
    if kind in _RANKING:
        func, column = _RANKING[kind], None
        if func == "ntile":
            frame_or_offset = _literal_int(fn.buckets(), "ntile's number of buckets", where)
    elif kind == "NthValue":
        func = "nth_value"
        column = _column(fn.input(), "the argument", where, inputs)
        n = _literal_int(fn.offset(), "nth_value's n", where)
        frame_or_offset = [None, n, bool(fn.ignoreNulls())]
    elif kind in _OFFSETS:
        func = _OFFSETS[kind]
        column = _column(fn.children().apply(0), "the argument", where, inputs)
        frame_or_offset = _offset(fn, func, where)
    elif kind == "AggregateExpression":
        agg = fn.aggregateFunction()
        pretty = agg.prettyName().lower()
        func = _AGGS.get(pretty) or _VALUES.get(pretty)
        if func is None:
            raise InvalidInput(f"{where}: {agg.prettyName()} over a window is not supported; "
                               f"have {_BUILT}")
        if func in ("first", "last"):
            frame_or_offset = [None, 1, bool(agg.ignoreNulls())]
        if fn.isDistinct() or fn.filter().isDefined():
            raise InvalidInput(f"{where}: DISTINCT or FILTER in a window function is not "
                               "supported")
        args = agg.children()
        if args.size() != 1:
            raise InvalidInput(f"{where}: {func} over {args.size()} arguments is not supported")
        arg = args.apply(0)
        if func == "count" and _cls(arg) == "Literal" and not arg.nullable():
            column = None  # count(*), count(1)
        else:
            column = _column(arg, "the argument", where, inputs)
    else:
        raise InvalidInput(f"{where}: {fn.prettyName()} is not supported over a window; have "
                           f"{_BUILT}")
    node = windows[0]
    if func in _AGGS.values() or func in ("first", "last", "nth_value"):
        frame = _frame(wexpr.windowSpec().frameSpecification(), node.orderSpec(), where)
        if func in _AGGS.values():
            frame_or_offset = frame
        else:
            frame_or_offset[0] = frame
    parts, orders = node.partitionSpec(), node.orderSpec()
    partition_by = [_column(parts.apply(i), "partition key", where, inputs) for i in range(parts.size())]
    order_by = []
    for i in range(orders.size()):
        o = orders.apply(i)
        order_by.append([_column(o.child(), "order key", where, inputs), o.direction().sql().lower(),
                         o.nullOrdering().sql().lower().replace(" ", "_")])
    params = {"partition_by": partition_by, "order_by": order_by,
              "funcs": [[name, func, column, frame_or_offset]]}
    from pyspark.sql.types import StructType

    struct = StructType([f for f in out.schema.fields if f.name != W])
    return params, arrow_schema(struct, where)


def _offset(fn, func: str, where: str) -> list:
    """lag/lead's ``[n, default]``: n a literal >= 1, the default a literal (cast by Spark to
    the column's type) of a plain type, or NULL."""
    if fn.ignoreNulls():
        raise InvalidInput(f"{where}: {func} IGNORE NULLS is not supported")
    n_expr, default = fn.children().apply(1), fn.children().apply(2)
    n = n_expr.value() if _cls(n_expr) == "Literal" else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidInput(f"{where}: {func}'s offset {n_expr.sql()} is not a literal >= 1 "
                           f"(use {'lead' if func == 'lag' else 'lag'} to look the other way)")
    if not default.foldable():
        raise InvalidInput(f"{where}: {func}'s default {default.sql()} is not a literal")
    try:
        value = default.eval(None)
    except Exception as e:  # an ANSI cast of the default to the column's type failed
        raise InvalidInput(f"{where}: {func}'s default {default.sql()} cannot be evaluated: "
                           f"{str(e).splitlines()[0]}") from e
    if value is not None:
        type_name = default.dataType().typeName()
        if type_name not in _DEFAULT_TYPES:
            raise InvalidInput(f"{where}: a {func} default of type {type_name} is not "
                               "supported (numbers, strings, booleans or NULL are)")
        if type_name == "string":
            value = value.toString()
    return [n, value]


def _literal_int(expr, what: str, where: str) -> int:
    value = expr.eval(None) if expr.foldable() else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInput(f"{where}: {what} {expr.sql()} is not a literal int >= 1")
    return value


def _bound(b, where: str):
    """A frame bound as an offset from the current row (None: unbounded): a ROWS bound a row
    count, a RANGE bound a value (a day-time interval in microseconds)."""
    kind = _cls(b)
    if kind in ("UnboundedPreceding$", "UnboundedFollowing$"):
        return None
    if kind == "CurrentRow$":
        return 0
    if not b.foldable():
        raise InvalidInput(f"{where}: the frame bound {b.sql()} is not a literal")
    type_name = b.dataType().typeName()
    try:
        value = b.eval(None)
    except Exception as e:  # an ANSI cast of the offset to the order column's type failed
        raise InvalidInput(f"{where}: the frame bound {b.sql()} cannot be evaluated: "
                           f"{str(e).splitlines()[0]}") from e
    if type_name.startswith("interval") and not any(
            u in type_name for u in ("day", "hour", "minute", "second")):
        raise InvalidInput(f"{where}: the frame bound {b.sql()} is a {type_name}; only "
                           "day-time intervals (days .. seconds) are supported")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{where}: the frame bound {b.sql()} of type {type_name} is not "
                           "supported (integers, floats and day-time intervals are)")
    return value, type_name.startswith("interval")


def _frame(frame, orders, where: str):
    """The kernel's frame of an aggregate or value function: None / n (ROWS UNBOUNDED or n
    PRECEDING .. CURRENT ROW, the form pipelines defined before other frames were built keep)
    or [kind, lower, upper]; a RANGE frame's value offsets as numbers (microseconds for a
    timestamp order column, days for a date)."""
    text = frame.sql()
    if _cls(frame) != "SpecifiedWindowFrame":
        raise InvalidInput(f"{where}: the frame {text} is not supported")
    kind = "rows" if _cls(frame.frameType()) == "RowFrame$" else "range"
    bounds = []
    for b in (frame.lower(), frame.upper()):
        got = _bound(b, where)
        if isinstance(got, tuple):
            value, interval = got
            if kind == "rows" and not isinstance(value, int):
                raise InvalidInput(f"{where}: the frame {text} has a bound that is not a "
                                   "literal row count")
            if kind == "range" and value != 0:
                order_type = orders.apply(0).child().dataType().typeName()
                if interval != (order_type in ("timestamp", "timestamp_ntz")):
                    raise InvalidInput(
                        f"{where}: the RANGE frame {text} over an order column of type "
                        f"{order_type} is not supported with a bound of type "
                        f"{b.dataType().typeName()} (a timestamp takes day-time intervals, "
                        "a number or date a number)")
            got = value
        bounds.append(got)
    lower, upper = bounds
    if kind == "rows" and upper == 0 and (lower is None or lower <= 0):
        return None if lower is None else -lower
    return [kind, lower, upper]
