"""Helpers of the newcomer suite: the installed `headrace` command run as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HEADRACE = str(Path(sys.executable).with_name("headrace"))  # .venv/bin/headrace
REPO = Path(__file__).resolve().parents[2]
# Markdown files whose ```python blocks must run (the guide first: test_guide.py reads DOCS[0])
DOCS = [REPO / "docs" / "guide.md", REPO / "README.md"]
LONG_SHARD = "a-shard-with-a-name-long-enough-that-an-80-column-table-would-cut-or-wrap-it-" \
             "0123456789-0123456789"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """One `headrace` process with stdout and stderr captured (so neither is a terminal)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run([HEADRACE, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def run_all(argvs: list[list[str]], workers: int = 3) -> list[subprocess.CompletedProcess]:
    """Several processes at once: each spends most of its second importing."""
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda a: run(*a), argvs))


def tree(root: Path) -> set[str]:
    """Every file and folder under root (hidden ones too): what a command may not add to."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def job_failure(runnable_docs: dict, name: str) -> str:
    """A failed example's or doc's output for the assertion message, JVM stack frames left out
    (they would push the Python traceback out of view)."""
    lines = [ln for ln in runnable_docs[name]["out"].splitlines()
             if not ln.lstrip().startswith("at ") and not ln.lstrip().startswith("... ")]
    return "\n".join(lines)[-6000:]
