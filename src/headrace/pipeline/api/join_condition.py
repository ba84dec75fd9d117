"""A PySpark join condition (``a["x"] == b["y"]``, ``&``-ed) -> the equi-join's key columns.

``frame["col"]`` is a column qualified by the frame's tag (frame.py), so Spark itself tells the
two sides apart: the condition is analysed on the two frames' empty probes, joined, and the
resolved condition is read from the plan. Only a conjunction of equalities between a column of
each side is an equi-join; anything else (``<``, OR, ``<=>``, an expression, a cast Spark adds
between two key types) is refused when the join is defined, never run with other semantics.
"""

from __future__ import annotations

import re

from headrace.errors import InvalidInput

SUPPORTED = ("a Column join condition must be equalities between one column of each side, "
             "combined with & (e.g. (a['x'] == b['y']) & (a['k'] == b['k2'])); for an interval "
             "join use time_columns=/within=, for another condition filter after the join")


def _cls(obj) -> str:
    return obj.getClass().getSimpleName()


def _join_node(plan):
    while _cls(plan) != "Join":
        kids = plan.children()
        if kids.size() != 1:
            raise InvalidInput("join: could not read the join condition's plan")
        plan = kids.apply(0)
    return plan


def _ids(plan) -> dict[int, str]:
    attrs = plan.output()
    return {attrs.apply(i).exprId().id(): attrs.apply(i).name() for i in range(attrs.size())}


def _conjuncts(expr) -> list:
    if _cls(expr) == "And":
        return _conjuncts(expr.left()) + _conjuncts(expr.right())
    return [expr]


def condition_of(on):
    """A Column, or a list of Columns AND-ed (as PySpark's join takes them)."""
    from functools import reduce

    return reduce(lambda a, b: a & b, on) if isinstance(on, list | tuple) else on


def equi_keys(left, right, condition) -> tuple[list[str], list[str]]:
    """(left_on, right_on) of ``condition`` between Frames ``left`` and ``right``."""
    lt, rt = left.tag, right.tag
    if lt == rt:
        raise InvalidInput("join: both sides are steps of the same frame, so a Column "
                           "condition cannot tell their columns apart; use left_on=/right_on= "
                           "(column names of each side)")
    readable = {lt: "left", rt: "right"}

    def show(text: str) -> str:
        for tag, side in readable.items():
            text = text.replace(f"{tag}.", f"{side}.").replace(f"`{tag}`.", f"{side}.")
        return text

    try:
        joined = left.probe().join(right.probe(), condition, "inner")
    except Exception as e:  # AnalysisException: unknown or ambiguous column, bad types
        foreign = sorted(set(re.findall(rf"({re.escape(left.TAG)}\w+?)\.", str(condition)))
                         - {lt, rt})
        if foreign:
            raise InvalidInput(
                f"join: the condition {show(str(condition))} names a column of another frame "
                f"({foreign[0][len(left.TAG):]}), not of either side; use left['col'] and "
                "right['col'] of the two frames joined") from e
        raise InvalidInput(f"join: Spark cannot analyse the condition {show(str(condition))}: "
                           f"{show(str(e).splitlines()[0])}") from e
    node = _join_node(joined._jdf.queryExecution().analyzed())
    lids, rids = _ids(node.left()), _ids(node.right())
    left_on, right_on = [], []
    for c in _conjuncts(node.condition().get()):
        kind, text = _cls(c), show(c.sql())
        if kind == "EqualNullSafe":
            raise InvalidInput(f"join: {text}: <=> (NULL matches NULL) is not supported; an "
                               f"equi-join never matches NULL keys. {SUPPORTED}")
        if kind != "EqualTo":
            raise InvalidInput(f"join: {text} is not an equality. {SUPPORTED}")
        a, b = c.left(), c.right()
        if "Cast" in (_cls(a), _cls(b)):
            raise InvalidInput(f"join: {text}: the two key columns have different types; cast "
                               "one side first (with_column)")
        if _cls(a) != "AttributeReference" or _cls(b) != "AttributeReference":
            raise InvalidInput(f"join: {text} compares an expression, not two columns; compute "
                               f"it as a column first (with_column). {SUPPORTED}")
        ia, ib = a.exprId().id(), b.exprId().id()
        if ia in lids and ib in rids:
            left_on.append(lids[ia])
            right_on.append(rids[ib])
        elif ib in lids and ia in rids:
            left_on.append(lids[ib])
            right_on.append(rids[ia])
        else:
            raise InvalidInput(f"join: {text} compares two columns of the same side. "
                               f"{SUPPORTED}")
    return left_on, right_on
