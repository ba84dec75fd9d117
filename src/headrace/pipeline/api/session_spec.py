"""``F.session_window(time, gap)`` as a group key -> the session kernel's time column, gap and
output name, through Spark's analyser.

As for aggregates (agg_spec.py) a Column's text is not trusted: the grouping is analysed on an
empty DataFrame, where Spark rewrites the session window into a projection
``named_struct(start, <time>, end, <time> + cast(<gap> as interval))`` marked as a session
window (metadata ``spark.sessionWindow``). The time column and the gap are read from it; what
the kernel cannot do exactly is refused here, naming it: a time that is an expression (add it
as a column first), a gap that is not a constant (Spark's dynamic gaps), a gap in months (not
a fixed duration), a gap that is not positive, two session windows.
"""

from __future__ import annotations

from headrace.errors import InvalidInput

MARKER = "spark.sessionWindow"


def _cls(obj) -> str:
    return obj.getClass().getSimpleName()


def _find(expr, pred) -> list:
    out, todo = [], [expr]
    while todo:
        e = todo.pop()
        if pred(e):
            out.append(e)
        kids = e.children()
        todo += [kids.apply(i) for i in range(kids.size())]
    return out


def _is_session(attr) -> bool:
    return _cls(attr) == "AttributeReference" and attr.metadata().contains(MARKER)


def _plan_nodes(plan) -> list:
    out, todo = [], [plan]
    while todo:
        node = todo.pop()
        out.append(node)
        kids = node.children()
        todo += [kids.apply(i) for i in range(kids.size())]
    return out


def maybe_session(key) -> bool:
    """A cheap filter before analysing: could this group key be a session window?"""
    return not isinstance(key, str) and "session_window" in str(key).lower()


def plan_session(frame, keys: list) -> tuple[int, dict] | None:
    """(position of the session window among ``keys``, {"time", "gap_us", "name"}) when one
    of the group keys is ``F.session_window(...)``, else None."""
    from py4j.java_gateway import get_field
    from pyspark.sql import functions as F

    if not any(maybe_session(k) for k in keys):
        return None
    probe = frame.probe()  # aliased: frame["col"] Columns resolve on it
    cols = [F.col(f"`{k}`") if isinstance(k, str) else k for k in keys]
    try:
        grouped = probe.groupBy(*cols).agg(F.count(F.lit(1)))
    except Exception as e:  # AnalysisException: unknown column, a bad gap, two windows
        raise InvalidInput(f"group_by: Spark cannot analyse it: {str(e).splitlines()[0]}") from e
    plan = grouped._jdf.queryExecution().analyzed()
    nodes = _plan_nodes(plan)
    agg = next((n for n in nodes if _cls(n) == "Aggregate"), None)
    if agg is None:
        return None
    grouping = agg.groupingExpressions()
    found = [i for i in range(grouping.size()) if _is_session(grouping.apply(i))]
    if not found:
        return None
    if len(found) > 1:
        raise InvalidInput("group_by: more than one session window; group by one")
    pos = found[0]
    attr = grouping.apply(pos)
    name = agg.aggregateExpressions().apply(pos).name()
    struct = None
    for n in nodes:
        if _cls(n) != "Project":
            continue
        plist = n.projectList()
        for i in range(plist.size()):
            e = plist.apply(i)
            if _cls(e) == "Alias" and e.exprId().id() == attr.exprId().id():
                struct = e.child()
    if struct is None or _cls(struct) != "CreateNamedStruct":
        raise InvalidInput("group_by: could not read the session window's plan")
    values = struct.valExprs()
    start, end = values.apply(0), values.apply(1)
    attrs = probe._jdf.queryExecution().analyzed().output()
    inputs = {attrs.apply(i).exprId().id(): attrs.apply(i).name() for i in range(attrs.size())}
    inner = start
    while _cls(inner) == "PreciseTimestampConversion":
        inner = inner.child()
    if _cls(inner) != "AttributeReference" or inner.exprId().id() not in inputs:
        raise InvalidInput(f"group_by: the session window's time {inner.sql()} is an "
                           "expression; add it as a column with with_column first")
    casts = _find(end, lambda e: _cls(e) == "Cast"
                  and e.dataType().typeName() == "interval")
    if len(casts) != 1:
        raise InvalidInput(f"group_by: the session window's gap in {end.sql()} is not a "
                           "duration like '5 minutes'")
    gap = casts[0]
    if not gap.foldable():
        raise InvalidInput(f"group_by: the session window's gap {gap.child().sql()} is not a "
                           "constant; a gap per row (Spark's dynamic gap) is not supported")
    interval = gap.eval(None)
    if interval is None:
        raise InvalidInput(f"group_by: the session window's gap {gap.child().sql()} is NULL")
    months, days, micros = (get_field(interval, f) for f in ("months", "days", "microseconds"))
    if months:
        raise InvalidInput(f"group_by: the session window's gap {gap.child().sql()} is in "
                           "months, not a fixed duration; give days or less")
    gap_us = int(days) * 86_400_000_000 + int(micros)
    if gap_us <= 0:
        raise InvalidInput(f"group_by: the session window's gap {gap.child().sql()} is not "
                           "positive")
    return pos, {"time": inputs[inner.exprId().id()], "gap_us": gap_us, "name": name}
