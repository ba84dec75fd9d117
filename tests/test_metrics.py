"""Prometheus text exposition: format rules, and every component's ``prometheus()``."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from headrace.backup import BackupManager, RestoreManager
from headrace.metrics import metric_name, prometheus_text
from headrace.reservoir import ReservoirReader, ReservoirStorage
from headrace.spine import Spine, SpineConfig
from headrace.spine.batchstore import LocalBatchStore
from headrace.store import LocalStore, MemoryStore

LINE = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? '
                  r'(-?[0-9.e+-]+|[+-]Inf|NaN)', re.S)


def test_flattens_nested_skips_non_numeric_and_escapes_labels():
    text = prometheus_text({"puts": 3, "cache": {"hits": 2, "ratio": 0.5}, "ok": True,
                            "name": "x", "ids": [1, 2]}, "headrace_t",
                           {"stream": 'a"b\\c\nd'})
    assert text.splitlines() == [
        'headrace_t_cache_hits{stream="a\\"b\\\\c\\nd"} 2',
        'headrace_t_cache_ratio{stream="a\\"b\\\\c\\nd"} 0.5',
        'headrace_t_ok{stream="a\\"b\\\\c\\nd"} 1',
        'headrace_t_puts{stream="a\\"b\\\\c\\nd"} 3',
    ]


@given(st.dictionaries(st.text(min_size=1, max_size=12),
                       st.one_of(st.integers(-2**63, 2**63), st.floats(),
                                 st.booleans(), st.text(max_size=5)), max_size=8),
       st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3))
def test_any_metrics_dict_renders_valid_lines(metrics, labels):
    for line in prometheus_text(metrics, "headrace_x", labels).split("\n")[:-1]:
        assert LINE.fullmatch(line), line
    assert metric_name("9lives", "a-b") == "_9lives_a_b"


def test_every_component_exports_its_metrics(tmp_path):
    store = LocalStore(tmp_path / "s", fsync=False)
    with ReservoirStorage.open(store) as hr:
        s = hr.session()
        s.write(1, b"x" * 100)
        s.commit()
        hr.checkpoint()
        assert 'headrace_reservoir_checkpoints{stream="default/v/default"} 1' in hr.prometheus()
    with ReservoirReader.open(store) as r:
        r.read(1)
        assert "headrace_reservoir_reader_reads 1\n" in r.prometheus()
    src = tmp_path / "dir"
    src.mkdir()
    (src / "f").write_bytes(b"data")
    with BackupManager(MemoryStore()) as bm:
        index = bm.upload(src, "c1")
        assert re.search(r"^headrace_backup_\w+ \d+$", bm.prometheus(), re.M)
        with RestoreManager(bm.store) as rm:
            rm.restore(index, tmp_path / "out")
            assert re.search(r"^headrace_restore_\w+ [1-9]\d*$", rm.prometheus(), re.M)
    bs = LocalBatchStore(tmp_path / "spine")
    with Spine(pa.int64(), pa.int64(), store=bs,
               config=SpineConfig(background_merge=False)) as sp:
        sp.insert(pa.table({"key": np.arange(10), "val": np.zeros(10, np.int64),
                            "w": np.ones(10, np.int64)}))
        assert "headrace_spine_rows 10\n" in sp.prometheus()
    assert bs.prometheus().startswith("headrace_spine_batchstore_")
