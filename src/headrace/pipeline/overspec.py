"""PySpark window-function Columns (``F.row_number().over(w)``) -> the ``over`` kernel's
parameters, through Spark's analyser.

As for aggregates (aggspec.py), a Column's text is not trusted: the column is added to an empty
DataFrame with ``withColumn`` and the analysed plan's ``Window`` node is read — the function,
its argument, the frame, the PARTITION BY and ORDER BY columns with their directions and NULL
placement. What the kernel cannot do exactly is refused here, at definition time, naming it:
RANGE frames (Spark's default frame when ``orderBy`` is given and no ``rowsBetween``), frames
that end after the current row, offset functions (lag, lead, nth_value), expressions as
partition or order keys or arguments (add them with ``with_column`` first).
"""

from __future__ import annotations

from headrace.errors import InvalidInput

_RANKING = {"RowNumber": "row_number", "Rank": "rank", "DenseRank": "dense_rank"}
_AGGS = {"count": "count", "sum": "sum", "avg": "avg", "mean": "avg", "min": "min",
         "max": "max"}


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
    from headrace.pipeline.plan import arrow_schema

    p = frame.pipeline
    where = f"with_column {name!r}"
    probe = p.spark.createDataFrame([], p._spark_struct(frame.schema))
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
    if kind in _RANKING:
        func, column = _RANKING[kind], None
    elif kind == "AggregateExpression":
        agg = fn.aggregateFunction()
        func = _AGGS.get(agg.prettyName().lower())
        if func is None:
            raise InvalidInput(f"{where}: {agg.prettyName()} over a window is not supported; "
                               f"have row_number, rank, dense_rank and {sorted(set(_AGGS))}")
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
                           f"row_number, rank, dense_rank and {sorted(set(_AGGS))} over "
                           "rowsBetween(-n or Window.unboundedPreceding, 0)")
    preceding = None
    if func not in ("row_number", "rank", "dense_rank"):
        preceding = _rows_frame(wexpr.windowSpec().frameSpecification(), where)
    node = windows[0]
    parts, orders = node.partitionSpec(), node.orderSpec()
    partition_by = [_column(parts.apply(i), "partition key", where, inputs) for i in range(parts.size())]
    order_by = []
    for i in range(orders.size()):
        o = orders.apply(i)
        order_by.append([_column(o.child(), "order key", where, inputs), o.direction().sql().lower(),
                         o.nullOrdering().sql().lower().replace(" ", "_")])
    params = {"partition_by": partition_by, "order_by": order_by,
              "funcs": [[name, func, column, preceding]]}
    from pyspark.sql.types import StructType

    from headrace.pipeline.names import W

    struct = StructType([f for f in out.schema.fields if f.name != W])
    return params, arrow_schema(struct, where)


def _rows_frame(frame, where: str) -> int | None:
    """The n of ``ROWS BETWEEN n PRECEDING AND CURRENT ROW`` (None: UNBOUNDED PRECEDING)."""
    text = frame.sql()
    if _cls(frame) != "SpecifiedWindowFrame" or _cls(frame.frameType()) != "RowFrame$":
        raise InvalidInput(f"{where}: the frame {text} is not supported: only ROWS frames, as "
                           "w.rowsBetween(-10, 0) or rowsBetween(Window.unboundedPreceding, 0) "
                           "(an orderBy without rowsBetween is Spark's RANGE frame)")
    lower, upper = frame.lower(), frame.upper()
    if _cls(upper) != "CurrentRow$":
        raise InvalidInput(f"{where}: the frame {text} ends after the current row; only frames "
                           "ending at the current row are supported (rowsBetween(-n, 0))")
    if _cls(lower) == "UnboundedPreceding$":
        return None
    if _cls(lower) == "CurrentRow$":
        return 0
    value = lower.value() if _cls(lower) == "Literal" else None
    if not isinstance(value, int) or value > 0:
        raise InvalidInput(f"{where}: the frame {text} does not start at or before the current "
                           "row")
    return -value
