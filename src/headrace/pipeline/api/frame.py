"""The fluent, PySpark-shaped query API: ``Frame`` is a node of the pipeline's plan.

Stateless steps (filter, select, with_column, drop, union, windows) are Spark expressions applied
to the micro-batch's delta with the weight carried along; stateful ones (group_by().agg, join,
distinct) are Z-set operator kernels with state in the store. Every step is analysed by Spark on
an empty DataFrame when it is defined, so an unknown column, a bad expression or a type the
pipeline cannot carry fails there, never in a micro-batch. Methods are snake_case, with
PySpark's camelCase names as aliases (``withColumn``, ``groupBy``, ...); ``frame["col"]`` and
``frame.col`` are Columns as in PySpark. Differences from PySpark (docs/coming-from-spark.md): a
window is two columns ``window_start``/``window_end`` instead of a struct, ``schema`` is Arrow's
(``spark_schema`` is Spark's), ``union`` refuses columns in another order.
"""

from __future__ import annotations

import re

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.pipeline.api.agg_spec import check_types, plan_aggregate
from headrace.pipeline.api.join_condition import condition_of, equi_keys
from headrace.pipeline.api.over_spec import plan_over
from headrace.pipeline.api.session_spec import plan_session
from headrace.pipeline.encoding.types import spark_ddl, spark_type, weighted_ddl
from headrace.pipeline.names import PREFIX, W
from headrace.pipeline.plan.nodes import Map, Node

_WINDOW = re.compile(r"^Column<'window\((.+), '([^']*)', '([^']*)', '([^']*)'\)'>$")
_DURATION = re.compile(r"^\s*(\d+)\s*(microseconds?|milliseconds?|seconds?|minutes?|hours?|"
                       r"days?|weeks?)\s*$", re.IGNORECASE)
_UNIT_US = {"microsecond": 1, "millisecond": 1000, "second": 10**6, "minute": 60 * 10**6,
            "hour": 3600 * 10**6, "day": 86400 * 10**6, "week": 7 * 86400 * 10**6}


def duration_us(text: str, what: str) -> int:
    """'10 seconds' -> 10_000_000 (the interval strings Spark's window/withWatermark take)."""
    m = _DURATION.match(text) if isinstance(text, str) else None
    if not m:
        raise InvalidInput(f"{what}: {text!r} is not a duration like '10 seconds' or "
                           "'5 minutes'")
    return int(m.group(1)) * _UNIT_US[m.group(2).lower().rstrip("s")]


def _col(c):
    from pyspark.sql import functions as F

    return F.col(f"`{c}`") if isinstance(c, str) else c


def _text(c) -> str:
    return c if isinstance(c, str) else str(c)


class UnknownColumn(InvalidInput, AttributeError):
    """``frame.nope``: not a column (an AttributeError too, so ``hasattr`` and copies work)."""


class Frame:
    """A pipeline table: the output of a source or an operator, as a stream of weighted
    changes. Build on it like a PySpark DataFrame; nothing runs until ``Pipeline.run``."""

    TAG = f"{PREFIX}f_"  # qualifies frame["col"]: which frame a column belongs to

    def __init__(self, pipeline, node: Node):
        self.pipeline = pipeline
        self.node = node

    # ---- what it holds ----------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        """The columns as an Arrow schema (what the shards and kernels carry; the planning
        code reads it). PySpark's StructType is :attr:`spark_schema`."""
        return self.node.schema

    @property
    def spark_schema(self):
        """The columns as a Spark ``StructType`` (what ``df.schema`` is in PySpark)."""
        return self.pipeline.spark.createDataFrame([], spark_ddl(self.schema)).schema

    @property
    def dtypes(self) -> list[tuple[str, str]]:
        """[(column, Spark type name)], as PySpark's ``df.dtypes``."""
        return [(f.name, spark_type(f.type, f"column {f.name!r}")) for f in self.schema]

    def printSchema(self) -> None:  # noqa: N802 — PySpark's name
        """Print the Spark schema tree, as PySpark's ``df.printSchema()``."""
        print(self.spark_schema.treeString(), end="")

    print_schema = printSchema

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def columns(self) -> list[str]:
        return list(self.node.schema.names)

    def __repr__(self) -> str:
        cols = ", ".join(f"{f.name}: {f.type}" for f in self.schema)
        return f"Frame[{self.node.name}]({cols})"

    # ---- columns as PySpark Columns ---------------------------------------------------
    @property
    def tag(self) -> str:
        """The qualifier of this frame's Columns: one per chain of stateless steps (a filter
        or select keeps its input's columns, as in PySpark), new after a stateful step."""
        node = self.node
        while isinstance(node, Map):
            node = node.source
        return self.TAG + re.sub(r"\W", "_", node.name)

    def probe(self):
        """An empty Spark DataFrame of this frame's columns and weight, aliased by its tag:
        steps and aggregates are analysed on it when they are defined."""
        return self.pipeline.spark.createDataFrame([], weighted_ddl(self.schema)).alias(self.tag)

    def __getitem__(self, item):
        """``frame["col"]``: that column (a Column); ``frame[0]`` by position;
        ``frame[["a", "b"]]`` selects; ``frame[condition]`` filters — as PySpark's ``df[...]``."""
        from pyspark.sql import Column
        from pyspark.sql import functions as F

        if isinstance(item, str):
            if item not in self.columns:
                raise InvalidInput(f"frame {self.name!r} has no column {item!r}; its columns: "
                                   f"{self.columns}")
            return F.col(f"`{self.tag}`.`{item}`")
        if isinstance(item, int) and not isinstance(item, bool):
            if not -len(self.columns) <= item < len(self.columns):
                raise InvalidInput(f"frame {self.name!r} has {len(self.columns)} columns, no "
                                   f"column {item}")
            return self[self.columns[item]]
        if isinstance(item, list | tuple):
            return self.select(*item)
        if isinstance(item, Column):
            return self.filter(item)
        raise InvalidInput(f"frame[{item!r}]: index by a column name, a position, a list of "
                           "names or a Column condition")

    def __getattr__(self, name: str):
        """``frame.price`` = ``frame["price"]``; methods and properties come first (a column
        named like one, e.g. ``name``, is ``frame["name"]``)."""
        node = self.__dict__.get("node")
        if name.startswith("_") or node is None:
            raise AttributeError(name)
        if name in node.schema.names:
            return self[name]
        raise UnknownColumn(f"frame {node.name!r} has no attribute or column {name!r}; its "
                            f"columns: {list(node.schema.names)}")

    # ---- stateless steps --------------------------------------------------------------
    def _map(self, fn, text: str, *, event_time: str | None = None,
             delay_us: int | None = None, window: tuple[str, int] | None = None) -> Frame:
        tag, step = self.tag, fn
        foreign = sorted(set(re.findall(rf"{self.TAG}\w+", text)) - {tag})
        if foreign:
            raise InvalidInput(f"{text}: a frame[\"col\"] of frame "
                               f"{foreign[0][len(self.TAG):]!r} is used on {self.name!r}, which "
                               "does not come from it by stateless steps; use F.col(\"col\") or "
                               "this frame's own frame[\"col\"]")
        if tag in text:  # the step uses frame["col"]: its input answers to the frame's tag
            def step(df):
                return fn(df.alias(tag))

        return Frame(self.pipeline, self.pipeline._add_map(self.node, step, text, event_time,
                                                           delay_us, window))

    def filter(self, condition) -> Frame:
        """Rows where ``condition`` (a Column or a SQL string) is true; NULL drops the row."""
        return self._map(lambda df: df.filter(condition), f"filter {_text(condition)}")

    where = filter

    def select(self, *cols) -> Frame:
        """Column names or Columns (``F.col("p") * 2).alias("q")``), as DataFrame.select."""
        from pyspark.sql import functions as F

        cols = [c for group in cols for c in (group if isinstance(group, list | tuple)
                                              else [group])]
        return self._map(lambda df: df.select(*[_col(c) for c in cols], F.col(W)),
                         f"select {[_text(c) for c in cols]}")

    def select_expr(self, *exprs: str) -> Frame:
        """SQL expressions, as DataFrame.selectExpr."""
        return self._map(lambda df: df.selectExpr(*exprs, f"`{W}`"), f"select_expr {exprs}")

    selectExpr = select_expr  # noqa: N815 — PySpark's spelling

    def with_column(self, name: str, col) -> Frame:
        """Add or replace column ``name`` (a Column or a SQL string). A window function
        (``F.row_number().over(Window.partitionBy(...).orderBy(...))``, ``F.avg(c).over(
        w.rowsBetween(-10, 0))``) becomes a stateful ``over`` operator (docs/queries.md)."""
        from pyspark.sql import functions as F

        expr = F.expr(col) if isinstance(col, str) else col
        over = plan_over(self, name, expr)
        if over is not None:
            return self._over(name, *over)
        return self._map(lambda df: df.withColumn(name, expr), f"with_column {name} {expr}")

    withColumn = with_column  # noqa: N815 — PySpark's spelling

    def _over(self, name: str, params: dict, expected: pa.Schema) -> Frame:
        """The window-function operator; a replaced column is computed beside the old one
        (the kernel only appends), then takes its place, as Spark's withColumn does."""
        p = self.pipeline
        out_name = name
        if name in self.columns:
            out_name = f"{name}_over"
            while out_name in self.columns:
                out_name += "_"
            params["funcs"][0][0] = out_name
        out = Frame(p, p._add("over", p._auto_name("over"), [self.node], params))
        if out_name != name:
            from pyspark.sql import functions as F

            out = out.select(*[F.col(f"`{out_name}`").alias(name) if c == name else c
                               for c in self.columns])
        check_types(out.schema, expected, f"with_column {name!r}")
        return out

    def with_column_renamed(self, old: str, new: str) -> Frame:
        if old not in self.columns:
            raise InvalidInput(f"with_column_renamed: no column {old!r} in {self.columns}")
        return self._map(lambda df: df.withColumnRenamed(old, new), f"rename {old} {new}")

    withColumnRenamed = with_column_renamed  # noqa: N815 — PySpark's spelling

    def drop(self, *names: str) -> Frame:
        missing = [n for n in names if n not in self.columns]
        if missing:
            raise InvalidInput(f"drop: no column(s) {missing} in {self.columns}")
        return self._map(lambda df: df.drop(*names), f"drop {names}")

    def with_window(self, time_column: str, size: str, slide: str | None = None,
                    start: str | None = None) -> Frame:
        """Add ``window_start``/``window_end``: the tumbling (no ``slide``) or hopping windows
        that hold ``time_column``; a hopping window repeats the row once per window."""
        from pyspark.sql import functions as F

        size_us = duration_us(size, "window size")
        if slide is not None:
            duration_us(slide, "window slide")
        tmp = f"{PREFIX}window"

        def fn(df):
            w = F.window(_col(time_column), size, slide, start)
            return df.select("*", w.alias(tmp)).select(
                *[_col(c) for c in df.columns], F.col(f"{tmp}.start").alias("window_start"),
                F.col(f"{tmp}.end").alias("window_end"))

        return self._map(fn, f"window {time_column} {size} {slide} {start}",
                         window=(time_column, size_us))

    def with_watermark(self, column: str, delay: str) -> Frame:
        """Declare ``column`` as event time, complete up to (max seen - ``delay``)."""
        if column not in self.columns:
            raise InvalidInput(f"with_watermark: no column {column!r} in {self.columns}")
        if not pa.types.is_timestamp(self.schema.field(column).type):
            raise InvalidInput(f"with_watermark: {column!r} is {self.schema.field(column).type}"
                               ", not a timestamp")
        return self._map(lambda df: df, f"watermark {column} {delay}", event_time=column,
                         delay_us=duration_us(delay, "watermark delay"))

    withWatermark = with_watermark  # noqa: N815 — PySpark's spelling

    def union(self, other: Frame) -> Frame:
        """UNION ALL: both inputs' changes, added up. Both need the same columns in the same
        order: PySpark's ``union`` pairs columns by position, so another order is refused
        rather than read by name (that is :meth:`unionByName`)."""
        if set(other.columns) == set(self.columns) and other.columns != self.columns:
            raise InvalidInput(f"union: the columns {self.columns} and {other.columns} are in "
                               "another order; PySpark's union pairs them by position: use "
                               "unionByName (by name) or select them in the same order")
        return Frame(self.pipeline, self.pipeline._add_union([self.node, other.node]))

    union_all = unionAll = union  # noqa: N815 — PySpark's spelling

    def union_by_name(self, other: Frame, allowMissingColumns: bool = False) -> Frame:  # noqa: N803
        """UNION ALL matching columns by name (the result has this frame's order), as
        PySpark's ``unionByName``; ``allowMissingColumns=True`` fills a column only one side
        has with NULL (its columns come after this frame's)."""
        from pyspark.sql import functions as F

        mine, theirs = self.columns, other.columns
        missing, extra = [c for c in mine if c not in theirs], [c for c in theirs if c not in mine]
        if (missing or extra) and not allowMissingColumns:
            raise InvalidInput(f"unionByName: {other.name!r} lacks column(s) {missing} and has "
                               f"extra column(s) {extra} against {mine}; select the same "
                               "columns or pass allowMissingColumns=True (NULL where missing)")
        for c in [c for c in mine if c in theirs]:
            a, b = self.schema.field(c).type, other.schema.field(c).type
            if a != b:
                raise InvalidInput(f"unionByName: column {c!r} is {a} on one side and {b} on "
                                   "the other; cast one side first")
        order = mine + extra

        def padded(frame: Frame, like: Frame) -> Frame:
            if frame.columns == order:
                return frame
            cols = [c if c in frame.columns else F.lit(None).cast(
                spark_type(like.schema.field(c).type)).alias(c) for c in order]
            return frame.select(*cols)

        return Frame(self.pipeline, self.pipeline._add_union(
            [padded(self, other).node, padded(other, self).node]))

    unionByName = union_by_name  # noqa: N815 — PySpark's spelling

    # ---- stateful steps ---------------------------------------------------------------
    def group_by(self, *keys) -> GroupedFrame:
        """Group keys: names, Columns, ``F.window(time, size[, slide])`` or
        ``F.session_window(time, gap)``."""
        return GroupedFrame(self, [k for group in keys for k in (
            group if isinstance(group, list | tuple) else [group])])

    groupBy = groupby = group_by  # noqa: N815 — PySpark's spellings

    def agg(self, *aggs) -> Frame:
        """A global aggregate: one row over the whole input (count 0 over no rows)."""
        return GroupedFrame(self, []).agg(*aggs)

    def join(self, other: Frame, on=None, how: str = "inner", *, left_on=None, right_on=None,
             time_columns: tuple[str, str] | None = None,
             within: tuple[str, str] | None = None, name: str | None = None) -> Frame:
        """Equi-join (SQL semantics: NULL keys never match): inner, left, right, full
        (outer), left_semi, left_anti; ``on`` names columns of both sides, or
        ``left_on``/``right_on``. Interval join (any of those): ``time_columns=("lt", "rt"),
        within=("-5 seconds", "10 seconds")`` also requires ``rt BETWEEN lt - 5 s AND lt +
        10 s``; with watermarks on both time columns, rows that are final leave the state, and
        the join may feed an append sink (each row once, when final). ``on`` may also be a
        PySpark Column condition, ``(a["x"] == b["y"]) & (a["k"] == b["k2"])`` (or a list of
        them): equalities between a column of each side, planned as ``left_on``/``right_on``
        (docs/coming-from-spark.md); any other condition is refused."""
        from pyspark.sql import Column

        if isinstance(on, Column) or (isinstance(on, list | tuple) and on
                                      and all(isinstance(c, Column) for c in on)):
            if left_on is not None or right_on is not None:
                raise InvalidInput("join: give a Column condition or left_on/right_on, not both")
            left_on, right_on = equi_keys(self, other, condition_of(on))
            on = None
            if how.lower() not in ("left_semi", "semi", "leftsemi", "left_anti", "anti",
                                   "leftanti"):
                both = [c for c in self.columns if c in other.columns]
                if both:
                    raise InvalidInput(f"join: both sides have column(s) {both}, which Spark "
                                       "would output twice; rename one side first "
                                       "(withColumnRenamed), or, for keys of the same name, "
                                       f"join with on={both} (one column per key)")
        if isinstance(on, str):
            on = [on]
        if isinstance(left_on, str):
            left_on = [left_on]
        if isinstance(right_on, str):
            right_on = [right_on]
        return self.pipeline.join(self.node, other.node, on, name or "", how=how,
                                  left_on=left_on, right_on=right_on,
                                  time_columns=time_columns, within=within)

    def distinct(self, name: str | None = None) -> Frame:
        return self.pipeline.distinct(self.node, name or self.pipeline._auto_name("distinct"))

    def drop_duplicates(self, subset: list[str] | None = None) -> Frame:
        """PySpark's ``dropDuplicates``: over all columns it is :meth:`distinct`. Over a subset
        Spark keeps an arbitrary one of the rows per key (in a stream, the first to arrive),
        which no retraction can maintain, so that is refused."""
        if subset is not None:
            subset = [subset] if isinstance(subset, str) else list(subset)
            unknown = [c for c in subset if c not in self.columns]
            if unknown:
                raise InvalidInput(f"dropDuplicates: no column(s) {unknown} in {self.columns}")
        if subset is None or set(subset) == set(self.columns):
            return self.distinct()
        raise InvalidInput(f"dropDuplicates({subset}) over some of the columns keeps an "
                           "arbitrary row per key, which is not supported; use "
                           f"select({subset}).distinct() for the keys, or "
                           f"groupBy({subset}).agg(F.min(...), F.max(...)) for a chosen row")

    dropDuplicates = drop_duplicates  # noqa: N815 — PySpark's spelling

    # ---- sinks ------------------------------------------------------------------------
    def write_shard(self, shard: str, mode: str = "update", start: str | None = None) -> None:
        """Write this frame's changes to a persist shard: ``update`` (default) writes every
        change (the shard's contents = the query's current result); ``append`` writes each
        window's rows once, when the watermark has passed the window's end. A sink added to a
        pipeline that has run starts from now; ``start="now"`` is needed behind an operator
        with state from before (docs/queries.md, "Adding parts")."""
        self.pipeline.write_shard(self.node, shard, mode=mode, start=start)


class GroupedFrame:
    def __init__(self, frame: Frame, keys: list):
        self.frame = frame
        self.keys = keys

    def agg(self, *aggs, name: str | None = None) -> Frame:
        """Aggregate columns as PySpark builds them: F.count("*"), F.count(c), F.sum, F.avg,
        F.min, F.max, F.count_distinct, each optionally ``.alias(...)`` and over expressions.
        A ``F.session_window(t, gap)`` group key makes session windows (docs/queries.md)."""
        if not aggs:
            raise InvalidInput("agg needs at least one aggregate column, e.g. F.count('*')")
        aggs = [a for group in aggs for a in (group if isinstance(group, list | tuple)
                                              else [group])]
        session = plan_session(self.frame, self.keys)
        if session is not None:
            return self._session_agg(*session, aggs, name)
        frame, by = self._keyed()
        pre, params, expected = plan_aggregate(frame, by, aggs)
        if pre is not None:
            frame = frame._map(pre[0], pre[1])
        expiry, times = _expiry(frame.node, by)
        if expiry is not None:  # the event-time column first: closed groups are a key prefix
            first = expiry["columns"][0]
            params["by"] = [first] + [c for c in by if c != first]
        p = self.frame.pipeline
        node = p._add("aggregate", name or p._auto_name("aggregate"), [frame.node], params)
        p._set_expiry(node, expiry, times)
        check_types(node.schema, expected, f"aggregate {node.name!r}")
        out = Frame(p, node)
        if expected.names != out.columns:  # Spark's column order when the kernel's differs
            out = out.select(*expected.names)
        return out

    def count(self) -> Frame:
        from pyspark.sql import functions as F

        return self.agg(F.count("*").alias("count"))

    def _each(self, func: str, cols: tuple) -> Frame:
        from pyspark.sql import functions as F

        if not cols:
            raise InvalidInput(f"{func}() needs the columns to aggregate, e.g. {func}('price')")
        return self.agg(*[getattr(F, func)(c) for c in cols])

    def sum(self, *cols: str) -> Frame:
        """PySpark's ``GroupedData.sum("a", ...)``: columns ``sum(a)``, ...; so are
        ``avg``/``mean``, ``min``, ``max``."""
        return self._each("sum", cols)

    def avg(self, *cols: str) -> Frame:
        return self._each("avg", cols)

    mean = avg

    def min(self, *cols: str) -> Frame:
        return self._each("min", cols)

    def max(self, *cols: str) -> Frame:
        return self._each("max", cols)

    def _session_agg(self, pos: int, spec: dict, aggs: list, name: str | None) -> Frame:
        """``group_by(F.session_window(t, gap), keys).agg(...)``: the session kernel
        (operators/session.py). The session comes out as ``<name>_start``/``<name>_end`` in
        the session window's place; with ``t`` event time, closed sessions leave the state."""
        frame, before = GroupedFrame(self.frame, self.keys[:pos])._keyed()
        frame, after = GroupedFrame(frame, self.keys[pos + 1:])._keyed()
        by = before + after
        pre, params, expected = plan_aggregate(frame, by, aggs)
        if pre is not None:
            frame = frame._map(pre[0], pre[1])
        time, gap = spec["time"], spec["gap_us"]
        times = getattr(frame.node, "times", {})
        expiring = time in times
        params.update(time=time, gap_us=gap, name=spec["name"], expiring=expiring)
        p = self.frame.pipeline
        node = p._add("session", name or p._auto_name("session"), [frame.node], params)
        # late: t + gap <= watermark (the row's own session has ended), as Spark
        expiry = {"columns": [time], "offsets_us": [times[time] + gap]} if expiring else None
        p._set_expiry(node, expiry, {})  # no time columns out: a retraction may shorten one
        check_types(node.schema, expected, f"session window {node.name!r}")
        out = Frame(p, node)
        start, end = f"{spec['name']}_start", f"{spec['name']}_end"
        order = before + [start, end] + after + expected.names[len(by):]
        if order != out.columns:  # Spark's column order: the session in its key's place
            out = out.select(*order)
        return out

    def _keyed(self) -> tuple[Frame, list[str]]:
        """The frame with every group key as a column (windows expanded), and their names."""
        frame, names = self.frame, []
        for k in self.keys:
            if isinstance(k, str):
                if k not in frame.columns:
                    raise InvalidInput(f"group_by: no column {k!r} in {frame.columns}")
                names.append(k)
                continue
            m = _WINDOW.match(str(k))
            if m:
                time_col = m.group(1).strip("`")
                if time_col.startswith(f"{frame.tag}."):  # F.window(frame["t"], ...)
                    time_col = time_col[len(frame.tag) + 1:].strip("`")
                frame = frame.with_window(time_col, m.group(2), m.group(3), m.group(4))
                names += ["window_start", "window_end"]
                continue
            kname = frame.probe().select(k).columns[0]
            frame = frame.with_column(kname, k) if kname not in frame.columns else frame
            names.append(kname)
        return frame, names


def _expiry(node: Node, by: list[str]) -> tuple[dict | None, dict]:
    """How the groups of an aggregate over ``node`` become final, if they do — grouped by a
    time column (a window of the watermarked column: final when window_end <= watermark; the
    column itself: when the value <= watermark; an upstream aggregate's or join's window) —
    and the time columns of its output: that group column, and ``window_end`` beside
    ``window_start`` (one window's two ends)."""
    times = getattr(node, "times", {})
    keyed = [c for c in by if c in times]
    if not keyed:
        return None, {}
    out = {keyed[0]: times[keyed[0]]}
    if keyed[0] == "window_start" and "window_end" in keyed:
        out["window_end"] = times["window_end"]
    return {"columns": [keyed[0]], "offsets_us": [times[keyed[0]]]}, out
