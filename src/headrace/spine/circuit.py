"""Circuit: a named group of spines checkpointed together (the DBSP control-plane API).

``Circuit.open(path, fingerprint)`` resumes at the latest checkpoint (or a given one) and refuses
a checkpoint taken by a different operator graph. ``commit(step)`` persists every spine's
in-memory batches, writes one manifest per spine into a fresh checkpoint folder, then atomically
replaces the catalog: all spines or none. A merge in progress is not waited for (its inputs are
recorded). ``gc_checkpoint`` drops the oldest checkpoints, always keeping at least two.
"""

from __future__ import annotations

import logging
import os
import threading

import pyarrow as pa

from headrace.errors import InvalidInput
from headrace.metrics import PrometheusExport
from headrace.spine.batch import Batch
from headrace.spine.batchstore import BatchStore, LocalBatchStore
from headrace.spine.catalog import (
    TYPE_NAMES,
    CheckpointInfo,
    SpineManifest,
    check_spine_name,
    type_name,
)
from headrace.spine.errors import CheckpointNotFound, FingerprintMismatch
from headrace.spine.spine import Spine, SpineConfig

log = logging.getLogger("headrace.spine.circuit")
MIN_KEPT_CHECKPOINTS = 2


class Circuit(PrometheusExport):
    """Spines of one operator graph sharing a BatchStore and a checkpoint history."""

    metrics_prefix = "headrace_spine_circuit"

    def __init__(self, store: BatchStore, fingerprint: str, *, checkpoint: str | None = None,
                 config: SpineConfig | None = None):
        if not isinstance(fingerprint, str) or not fingerprint:
            raise InvalidInput("fingerprint must be a non-empty string")
        self.store = store
        self.fingerprint = fingerprint
        self.config = config or SpineConfig()
        self.spines: dict[str, Spine] = {}
        self._mu = threading.Lock()
        self.resumed_from: CheckpointInfo | None = None
        self._manifests: dict[str, SpineManifest] = {}
        entries = store.checkpoints()
        if checkpoint is not None:
            match = [e for e in entries if e.id == checkpoint]
            if not match:
                raise CheckpointNotFound(f"checkpoint {checkpoint!r} is not in the catalog")
            self.resumed_from = match[0]
        elif entries:
            self.resumed_from = entries[-1]
        if self.resumed_from is not None:
            if self.resumed_from.fingerprint != fingerprint:
                raise FingerprintMismatch(self.resumed_from.id, self.resumed_from.fingerprint,
                                          fingerprint)
            self._manifests = store.read_manifests(self.resumed_from.id)
        self.step = self.resumed_from.step if self.resumed_from else 0

    @classmethod
    def open(cls, path, fingerprint: str, checkpoint: str | None = None,
             config: SpineConfig | None = None) -> Circuit:
        """Open (lock) a storage directory or wrap a BatchStore; resume its checkpoint."""
        store = path if isinstance(path, BatchStore) else LocalBatchStore(os.fspath(path))
        try:
            return cls(store, fingerprint, checkpoint=checkpoint, config=config)
        except BaseException:
            if store is not path:
                store.close()
            raise

    def spine(self, name: str, key_type: pa.DataType | None = None,
              val_type: pa.DataType | None = None) -> Spine:
        """The spine ``name``: restored from the checkpoint if it holds one, else empty."""
        check_spine_name(name)
        with self._mu:
            if name in self.spines:
                return self.spines[name]
            m = self._manifests.get(name)
            if m is not None:
                kt, vt = TYPE_NAMES[m.key_type], TYPE_NAMES[m.val_type]
                if key_type is not None:
                    want = Batch.empty(key_type, val_type or vt).schema
                    if not want.equals(Batch.empty(kt, vt).schema):
                        raise InvalidInput(f"spine {name!r} was checkpointed as ({m.key_type}, "
                                           f"{m.val_type}), asked for ({key_type}, {val_type})")
                batches = [self.store.open_batch(b) for b in m.batches]
                sp = Spine(kt, vt, name=name, config=self.config, store=self.store,
                           batches=batches, lower_bound=m.lower_bound)
            else:
                if key_type is None or val_type is None:
                    raise InvalidInput(f"spine {name!r} is new: give key_type and val_type")
                sp = Spine(key_type, val_type, name=name, config=self.config, store=self.store)
            self.spines[name] = sp
            return sp

    def commit(self, step: int | None = None, identifier: str = "") -> str:
        """Checkpoint every spine (all or none); returns the checkpoint id."""
        with self._mu:
            step = self.step + 1 if step is None else step
            manifests = {}
            for name, sp in self.spines.items():
                names = sp.persist_all()
                kt, vt = sp.schema.field("key").type, sp.schema.field("val").type
                manifests[name] = SpineManifest(name, type_name(kt), type_name(vt), names,
                                                sp.lower_bound)
            info = self.store.commit_checkpoint(step, self.fingerprint, manifests, identifier)
            self.step = step  # only once committed: a failed commit can simply be retried
            log.info("checkpoint %s at step %d (%d spines)", info.id, info.step, len(manifests))
            return info.id

    def checkpoints(self) -> list[CheckpointInfo]:
        return self.store.checkpoints()

    def gc_checkpoint(self, keep: int = MIN_KEPT_CHECKPOINTS) -> list[str]:
        """Remove the oldest checkpoints so ``keep`` (>= 2) remain; their ids."""
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < MIN_KEPT_CHECKPOINTS:
            raise InvalidInput(f"gc_checkpoint keep must be an int >= {MIN_KEPT_CHECKPOINTS}, "
                               f"got {keep!r}")
        entries = self.store.checkpoints()
        removed = [e.id for e in entries[: max(0, len(entries) - keep)]]
        self.store.remove_checkpoints(removed)
        return removed

    def metrics(self) -> dict:
        out = {f"spine_{n}_{k}": v for n, sp in self.spines.items()
               for k, v in sp.metrics().items()}
        out.update({f"store_{k}": v for k, v in self.store.metrics().items()})
        out["step"] = self.step
        return out

    def close(self) -> None:
        """Stop every spine's merge thread and release the store (its lock)."""
        errors = []
        for sp in self.spines.values():
            try:
                sp.close()
            except Exception as e:  # noqa: BLE001 - collected, re-raised below
                errors.append(e)
        self.store.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> Circuit:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
