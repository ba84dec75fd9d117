"""BatchStoreTests: the spine BatchStore contract as tests.

Subclass it and provide a ``batch_store_factory`` fixture: a callable that opens the store on the
same storage location each time it is called (the test closes one before opening the next).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from headrace.errors import NotFound
from headrace.spine import Batch, CheckpointNotFound, SpineManifest


def _batch(seed: int, n: int = 500) -> Batch:
    import numpy as np

    rng = np.random.default_rng(seed)
    return Batch.from_arrow(pa.table({"key": rng.integers(0, 200, n),
                                      "val": rng.integers(0, 4, n),
                                      "w": rng.choice([-1, 1, 2], n)}))


def _manifest(name: str, batches: list[str]) -> SpineManifest:
    return SpineManifest(name, "int64", "int64", batches, None)


class BatchStoreTests:
    """Every BatchStore verb, persistence across reopen, and garbage collection."""

    def test_write_then_open_roundtrip(self, batch_store_factory):
        with batch_store_factory() as store:
            b = _batch(1)
            p = store.write_batch(b, 1024)
            assert p.name and p.persistent
            assert p.to_table().equals(b.to_table())
            again = store.open_batch(p.name)
            assert again.to_table().equals(b.to_table())
            assert p.name in store.batch_names()

    def test_open_missing_batch_raises_not_found(self, batch_store_factory):
        with batch_store_factory() as store, pytest.raises(NotFound):
            store.open_batch("01ARZ3NDEKTSV4RRFFQ69G5FAV.batch")

    def test_checkpoint_survives_reopen(self, batch_store_factory):
        with batch_store_factory() as store:
            a, b = store.write_batch(_batch(1)), store.write_batch(_batch(2))
            store.pin([a.name, b.name])
            info = store.commit_checkpoint(7, "fp", {"s1": _manifest("s1", [a.name]),
                                                     "s2": _manifest("s2", [b.name])}, "first")
        with batch_store_factory() as store:
            (got,) = store.checkpoints()
            assert (got.id, got.step, got.fingerprint, got.identifier) == \
                (info.id, 7, "fp", "first")
            ms = store.read_manifests(info.id)
            assert ms["s1"].batches == [a.name] and ms["s2"].batches == [b.name]
            assert store.open_batch(a.name).to_table().equals(_batch(1).to_table())

    def test_checkpoints_are_ordered_oldest_first(self, batch_store_factory):
        with batch_store_factory() as store:
            ids = [store.commit_checkpoint(i, "fp", {}).id for i in range(3)]
            assert [c.id for c in store.checkpoints()] == ids

    def test_discard_deletes_unreferenced_only(self, batch_store_factory):
        with batch_store_factory() as store:
            kept, dropped = store.write_batch(_batch(1)), store.write_batch(_batch(2))
            store.pin([kept.name])
            store.commit_checkpoint(1, "fp", {"s": _manifest("s", [kept.name])})
            store.discard([kept.name, dropped.name])
            names = store.batch_names()
            assert kept.name in names and dropped.name not in names

    def test_pinned_batch_survives_discard(self, batch_store_factory):
        with batch_store_factory() as store:
            b = store.write_batch(_batch(3))
            store.pin([b.name])
            store.discard([b.name])
            assert b.name in store.batch_names()

    def test_remove_checkpoint_collects_its_batches(self, batch_store_factory):
        with batch_store_factory() as store:
            a, b = store.write_batch(_batch(1)), store.write_batch(_batch(2))
            c1 = store.commit_checkpoint(1, "fp", {"s": _manifest("s", [a.name])})
            c2 = store.commit_checkpoint(2, "fp", {"s": _manifest("s", [b.name])})
            store.discard([a.name, b.name])
            assert set(store.batch_names()) == {a.name, b.name}
            store.remove_checkpoint(c1.id)
            assert store.batch_names() == [b.name]
            assert [c.id for c in store.checkpoints()] == [c2.id]
            with pytest.raises(CheckpointNotFound):
                store.read_manifests(c1.id)

    def test_removed_checkpoints_stay_removed_after_reopen(self, batch_store_factory):
        with batch_store_factory() as store:
            made = []
            for i in range(5):
                b = store.write_batch(_batch(i))
                made.append((store.commit_checkpoint(i, "fp", {"s": _manifest("s", [b.name])}),
                             b.name))
                store.discard([b.name])
            store.remove_checkpoints([c.id for c, _ in made[:3]])
        with batch_store_factory() as store:
            assert [c.id for c in store.checkpoints()] == [c.id for c, _ in made[3:]]
            assert store.batch_names() == sorted(n for _, n in made[3:])
            with pytest.raises(CheckpointNotFound):
                store.remove_checkpoints([made[0][0].id])

    def test_unreferenced_batches_are_collected_on_reopen(self, batch_store_factory):
        with batch_store_factory() as store:
            a = store.write_batch(_batch(1))
            store.write_batch(_batch(2))  # never committed: garbage after a restart
            store.commit_checkpoint(1, "fp", {"s": _manifest("s", [a.name])})
        with batch_store_factory() as store:
            assert store.batch_names() == [a.name]

    def test_gc_keeps_live_batches(self, batch_store_factory):
        with batch_store_factory() as store:
            live = store.write_batch(_batch(1))
            assert store.gc() == []
            assert live.name in store.batch_names()
