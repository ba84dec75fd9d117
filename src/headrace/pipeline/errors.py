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


class NegativeMultiplicity(HeadraceError, ValueError):
    """The batch would leave a multiplicity in the kernel's state below zero — a retraction of
    a row that was never inserted, which Spark SQL cannot express. Raised before the kernel
    writes any state (like ArithmeticOverflow), so the task can leave its state unwritten.

    ``keys``: every offending key, encoded as the kernel's input rows are bucketed (its
    ``bucket_columns``, normalised: ``rowkeys.RowCodec(schema, columns, normalize=True)``), so
    the driver can find the entries of the batch that carry it (driver/negative.py);
    ``what``: the first one, in words."""

    def __init__(self, what: str, keys: list[bytes]):
        super().__init__(what)
        self.what = what
        self.keys = list(dict.fromkeys(keys))


class ImpossibleRetraction(BadEntry):
    """A queue entry retracts a row that was never inserted (on_bad_entry="fail"); names the
    entry (queue, sequence, index), the operator that saw it and the key."""

    def __init__(self, message: str, *, queue: str | None = None, sequence: int | None = None,
                 index: int | None = None, operator: str | None = None, key=None):
        super().__init__(message)
        self.queue, self.sequence, self.index = queue, sequence, index
        self.operator, self.key = operator, key


class ColumnarEntryError(InvalidInput):
    """A columnar entry that does not decode: ``table`` / ``field`` name what was wrong where
    known (None otherwise), ``reason`` says what."""

    def __init__(self, reason: str, table: str | None = None, field: str | None = None):
        where = f"table {table!r}" + (f", field {field!r}" if field else "") if table else ""
        super().__init__(f"columnar entry{' (' + where + ')' if where else ''}: {reason}")
        self.table, self.field, self.reason = table, field, reason
