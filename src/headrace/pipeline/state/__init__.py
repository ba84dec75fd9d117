"""Operator state: per (operator, side, bucket) a paged LSM of sorted runs in the reservoir
(lsm, with the task-level view in task), or a local spine backed up (local_backup). Implements
the state interfaces of operators/kernel.py; imports operators and below.

See docs/pipeline-state.md (design) and docs/formats/pipeline-state.md (bytes).
"""

from headrace.pipeline.state.layout import page_id, split_page_id
from headrace.pipeline.state.lsm import BucketLSM, LSMConfig, WriteStats

__all__ = ["BucketLSM", "LSMConfig", "WriteStats", "page_id", "split_page_id"]
