"""Every error the pipeline engine raises, in one tree under :class:`headrace.HeadraceError`.

One module, imported by every layer and importing nothing of the engine, so no layer needs a
higher one to raise or catch an error. Each class also inherits the builtin it stands for
where one fits (``ValueError`` for bad input, ``LookupError`` for a range that is gone).
"""

from __future__ import annotations

from headrace.errors import HeadraceError, InvalidInput


class PipelineError(HeadraceError):
    """The pipeline cannot continue safely (e.g. its stored progress is inconsistent)."""


class BadEntry(PipelineError, ValueError):
    """A queue entry that does not decode into its table (on_bad_entry="fail")."""


class RangeGone(PipelineError, LookupError):
    """The queue no longer holds a range recovery needs."""


class NotDirect(PipelineError):
    """The range holds entries only the static plan reads (the reason is the message): the
    direct job of a restart falls back to the static plan."""


class GraphChanged(PipelineError, ValueError):
    """The current graph cannot continue from the stored progress."""


class RescaleError(PipelineError):
    """The stored state cannot be re-bucketed (an unknown state layout, a key in the wrong
    bucket)."""


class StreamIngestError(PipelineError, RuntimeError):
    """The ingest of a stream cannot continue without risking a lost or duplicated row."""


class StreamCheckpointLost(StreamIngestError):
    """The side query's Spark checkpoint is not the one that wrote the queue: Spark would read
    the source again from its start, duplicating (or, by batch id, skipping) rows."""


class ArithmeticOverflow(HeadraceError, ArithmeticError):
    """A result does not fit its type (a long ``sum`` past int64), as Spark's ANSI mode raises.

    Raised before the kernel writes any state, so the batch can fail without losing anything."""


class ColumnarEntryError(InvalidInput):
    """A columnar entry that does not decode: ``table`` / ``field`` name what was wrong where
    known (None otherwise), ``reason`` says what."""

    def __init__(self, reason: str, table: str | None = None, field: str | None = None):
        where = f"table {table!r}" + (f", field {field!r}" if field else "") if table else ""
        super().__init__(f"columnar entry{' (' + where + ')' if where else ''}: {reason}")
        self.table, self.field, self.reason = table, field, reason
