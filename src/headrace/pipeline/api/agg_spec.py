"""PySpark aggregate Columns -> the aggregate kernel's parameters, through Spark's analyser.

``F.count_distinct("x")`` prints as ``count(x)`` and ``F.sum(col * 2)`` as ``sum(*(x, 2))``, so
a Column's text cannot be trusted. Instead the aggregate is analysed on an empty DataFrame and
the resolved plan is read: each output's name, function, DISTINCT flag and arguments
(``count(DISTINCT a, b)`` has two; ``F.sum_distinct(x)`` is ``sum`` with the flag). An
argument that is not a plain column is computed by a projection before the aggregate. The
kernel's output types are checked against Spark's, so the result is Spark's value for value.
"""

from __future__ import annotations

from headrace.errors import InvalidInput
from headrace.pipeline.encoding.types import arrow_schema

_FUNCS = {"count", "sum", "avg", "min", "max"}


def _agg_node(plan):
    while plan.getClass().getSimpleName() != "Aggregate":
        kids = plan.children()
        if kids.size() != 1:
            raise InvalidInput("could not read the aggregate's plan")
        plan = kids.apply(0)
    return plan


def _describe(spark_df, n_keys: int) -> list[dict]:
    """[{name, func, distinct, args: [(kind, text)]}] of a grouped aggregate's outputs."""
    agg = _agg_node(spark_df._jdf.queryExecution().analyzed())
    exprs = agg.aggregateExpressions()
    out = []
    for i in range(n_keys, exprs.size()):
        e = exprs.apply(i)
        name = e.name()
        child = e.child() if e.getClass().getSimpleName() == "Alias" else e
        if child.getClass().getSimpleName() != "AggregateExpression":
            raise InvalidInput(f"aggregate {name!r}: {child.sql()} is not one aggregate "
                               "function (compute expressions over aggregates in a select "
                               "after the agg)")
        if child.filter().isDefined():
            raise InvalidInput(f"aggregate {name!r}: FILTER clauses are not supported; filter "
                               "the input first")
        fn = child.aggregateFunction()
        kids = fn.children()
        args = []
        for j in range(kids.size()):
            a = kids.apply(j)
            kind = a.getClass().getSimpleName()
            if kind == "AttributeReference":
                args.append(("column", a.name()))
            elif kind == "Literal" and not a.nullable():
                args.append(("literal", a.sql()))
            else:
                args.append(("expr", a.sql()))
        out.append({"name": name, "func": fn.prettyName().lower(),
                    "distinct": bool(child.isDistinct()), "args": args})
    return out


def plan_aggregate(frame, by: list[str], aggs: list):
    """(pre-projection (fn, text) or None, kernel params, Spark's output column order)."""
    from pyspark.sql import functions as F

    probe = frame.probe()  # aliased: frame["col"] Columns resolve on it
    try:
        grouped = probe.groupBy(*[F.col(f"`{c}`") for c in by]).agg(*aggs)
    except Exception as e:  # AnalysisException: an unknown column, a bad argument type
        raise InvalidInput(f"agg: Spark cannot analyse it: {str(e).splitlines()[0]}") from e
    described = _describe(grouped, len(by))
    expected = arrow_schema(grouped.schema, "agg")
    taken = set(frame.columns)
    pre: list[tuple[str, str]] = []  # (generated column, SQL)
    params: dict[str, list] = {}
    for d in described:
        func, name, args = d["func"], d["name"], d["args"]
        if func not in _FUNCS:
            raise InvalidInput(f"aggregate {name!r}: {func} is not supported (count, "
                               "sum, avg, min, max, each also with DISTINCT)")
        if func == "count" and not d["distinct"] and len(args) == 1 and args[0][0] == "literal":
            params[name] = ["count", None]  # count(*) / count(1)
            continue
        if len(args) != 1 and func != "count":
            raise InvalidInput(f"aggregate {name!r}: {func} over {len(args)} columns is not "
                               "supported")
        if d["distinct"] and func in ("min", "max"):
            d["distinct"] = False  # min/max of the distinct values = min/max
        columns = []
        for kind, text in args:
            if kind == "column":
                columns.append(text)
                continue
            column = _fresh(f"_{func}_arg", taken)  # an expression: computed before the agg
            taken.add(column)
            pre.append((column, text))
            columns.append(column)
        params[name] = [f"{func}_distinct" if d["distinct"] else func,
                        columns[0] if len(columns) == 1 else columns]
    projection = None
    if pre:
        cols = list(pre)

        def fn(df):
            return df.select("*", *[F.expr(sql).alias(c) for c, sql in cols])

        projection = (fn, f"aggregate arguments {cols}")
    return projection, {"by": list(by), "aggs": params}, expected


def check_types(kernel_schema, expected, where: str) -> None:
    """The kernel's output must have Spark's types (value for value, e.g. sum(int) = long)."""
    for f in expected:
        if f.name in kernel_schema.names and kernel_schema.field(f.name).type != f.type:
            raise InvalidInput(f"{where}: {f.name!r} would be {kernel_schema.field(f.name).type}"
                               f" here but {f.type} in Spark; cast the input first")


def _fresh(base: str, taken: set[str]) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}{i}"
    return name
