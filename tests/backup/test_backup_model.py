"""Model-based test: random directory changes, commits, abandoned uploads, restores and sweeps.

The model is simple: the last committed snapshot must restore to exactly the directory as it was
when it was uploaded, and after a sweep past the TTL the store holds exactly the blobs of the
committed snapshot.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from backup_testlib import read_tree
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.backup import BackupConfig, BackupManager, RestoreManager
from headrace.codec import ManualClock
from headrace.retry import RetryPolicy
from headrace.store import LocalStore

HOUR_MS = 3_600_000
NAMES = st.sampled_from(["a.sst", "b.sst", "c.batch", "MANIFEST", "CURRENT", "x.log"])
DIRS = st.sampled_from(["", "d1", "d1/d2", "e"])


class BackupMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="hr-backup-model-"))
        self.src = self.tmp / "src"
        self.src.mkdir()
        self.clock = ManualClock()
        self.store = LocalStore(self.tmp / "store", fsync=False)
        retry = RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0, clock=self.clock)
        self.cfg = BackupConfig(chunk_size=4096, pack_below=1024, ttl_ms=HOUR_MS, retry=retry,
                                upload_workers=2, download_workers=2)
        self.bm = BackupManager(self.store, config=self.cfg, clock=self.clock)
        self.committed: str | None = None
        self.committed_tree: dict = {}
        self.restores = 0

    def teardown(self):
        self.bm.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(folder=DIRS, name=NAMES, size=st.integers(0, 10_000), fill=st.integers(0, 255))
    def write_file(self, folder, name, size, fill):
        d = self.src / folder
        if d.exists() and not d.is_dir():
            return
        d.mkdir(parents=True, exist_ok=True)
        if (d / name).is_dir():
            return
        (d / name).write_bytes(bytes([fill]) * size)

    @rule(folder=DIRS, name=NAMES)
    def remove_file(self, folder, name):
        p = self.src / folder / name
        if p.is_file():
            p.unlink()

    @rule(folder=st.sampled_from(["d1", "d1/d2", "e"]))
    def remove_dir(self, folder):
        shutil.rmtree(self.src / folder, ignore_errors=True)

    @rule(folder=st.sampled_from(["empty", "d1/empty"]))
    def make_empty_dir(self, folder):
        if (self.src / folder).parent.is_dir() or "/" not in folder:
            (self.src / folder).mkdir(parents=True, exist_ok=True)

    @rule()
    def commit(self):
        index_id = self.bm.upload(self.src, f"c{self.clock.now_ms()}")
        self.committed, self.committed_tree = index_id, read_tree(self.src)
        self.bm.cleanup(index_id)
        self.clock.advance(1)

    @rule()
    def abandoned_upload(self):
        self.bm.upload(self.src, "abandoned")  # the caller dies before recording it
        self.clock.advance(1)

    @precondition(lambda self: self.committed is not None)
    @rule(reuse=st.booleans())
    def restore(self, reuse):
        target = self.tmp / ("restored" if reuse else f"restored-{self.restores}")
        self.restores += 1
        with RestoreManager(self.store, config=self.cfg, clock=self.clock) as rm:
            rm.restore(self.committed, target)
        assert read_tree(target) == self.committed_tree

    @rule()
    def sweep_after_ttl(self):
        self.clock.advance(2 * HOUR_MS / 1000)
        self.bm.sweep()
        blobs = set(self.bm.blobs.list_ids("blobs"))
        if self.committed is None:
            assert blobs == set()
        else:
            index = self.bm.blobs.get_index(self.committed)
            assert blobs == index.dir_index.present_blob_ids()
            assert set(self.bm.blobs.list_ids("index")) == {self.committed}

    @invariant()
    def committed_blobs_exist(self):
        if self.committed is not None:
            index = self.bm.blobs.get_index(self.committed)
            assert index.dir_index.present_blob_ids() <= set(self.bm.blobs.list_ids("blobs"))


BackupMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=20,
                                           deadline=None)
TestBackupModel = BackupMachine.TestCase
