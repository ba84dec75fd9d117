"""docs/guide.md and the README's quickstart run as written: every ```python block, in order, in
one namespace, in a new working directory (so its local folder store is new), in a subprocess
(see run_docs.py)."""

from __future__ import annotations

import ast

import pytest
from newcomer_lib import DOCS, job_failure
from run_docs import python_blocks

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]  # the fixture runs all examples too

GUIDE, README = DOCS


@pytest.mark.parametrize("md", DOCS, ids=[md.name for md in DOCS])
def test_every_python_block_runs(runnable_docs, md):
    job = runnable_docs[md.name]
    assert job["ok"], job_failure(runnable_docs, md.name)
    ran = [ln for ln in job["out"].splitlines() if ln.startswith(f"--- {md.name}:")]
    assert len(ran) == len(python_blocks(md)) >= 1


def test_the_guide_prints_what_it_shows(runnable_docs):
    """A value shown in a `# [...]` comment line of a block is what the run printed there; the
    guide's pipeline result is one of them."""
    job = runnable_docs[GUIDE.name]
    assert job["ok"], job_failure(runnable_docs, GUIDE.name)
    out = job["out"].splitlines()
    shown = [ln.removeprefix("# ") for _, code in python_blocks(GUIDE)
             for ln in code.splitlines() if ln.startswith("# [")]
    # worked out by hand from the entries of section 2 (order 2 is cancelled)
    assert ("[{'region': 'amer', 'orders': 1, 'revenue': 9}, "
            "{'region': 'emea', 'orders': 2, 'revenue': 32}]") in shown
    for value in shown:
        ast.literal_eval(value)
        assert value in out
    # the guide's store is a local folder in the working directory it was given
    assert (job["dir"] / "guide-data" / "ingest" / "manifest").is_file()


def test_the_readme_quickstart_prints_what_it_shows(runnable_docs):
    """The quickstart's result comment is what it printed: a newcomer's first check."""
    job = runnable_docs[README.name]
    assert job["ok"], job_failure(runnable_docs, README.name)
    shown = [ln.removeprefix("# ") for _, code in python_blocks(README)
             for ln in code.splitlines() if ln.startswith("# [")]
    # worked out by hand: amer has orders 1, 3, 5; emea 2, 4, 6 with order 4 retracted
    assert shown == ["[{'region': 'amer', 'orders': 3, 'revenue': 90}, "
                     "{'region': 'emea', 'orders': 2, 'revenue': 80}]"]
    assert shown[0] in job["out"].splitlines()
    assert (job["dir"] / "quickstart-data" / "ingest" / "manifest").is_file()
