"""What the driver reads from Spark's streaming checkpoint: a batch's end offsets, and the batch
a crash interrupted (planned in the offset log, absent from the commit log).

Spark writes ``offsets/<batch id>`` (a version line, a metadata line, then one JSON offset per
source in the order of the query's union) before it runs a batch, and ``commits/<batch id>``
after. A headrace queue source's offset is ``{"sequence": next sequence to read}``.
"""

from __future__ import annotations

import json
import os


def offset_log_ends(checkpoint_dir: str, queues: list[str], batch_id: int) -> dict[str, int] | None:
    """The last sequence per queue in batch ``batch_id`` (``queues`` in the union's order), or
    None when the log entry is missing or unreadable."""
    path = os.path.join(checkpoint_dir, "offsets", str(batch_id))
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        offsets = lines[-len(queues):]
        if len(lines) < len(queues) + 2:  # version line, metadata line, sources
            raise ValueError("fewer sources than queues")
        return {q: int(json.loads(o)["sequence"]) - 1
                for q, o in zip(queues, offsets, strict=True)}
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def interrupted_batch(checkpoint_dir: str) -> int | None:
    """The id of the last planned batch when Spark did not commit it, else None."""
    try:
        planned = max((int(n) for n in os.listdir(os.path.join(checkpoint_dir, "offsets"))
                       if n.isdigit()), default=None)
    except OSError:
        return None
    if planned is None or os.path.exists(os.path.join(checkpoint_dir, "commits", str(planned))):
        return None
    return planned
