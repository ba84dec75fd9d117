"""Runs the examples and the docs' python blocks as a newcomer would, in one process.

    python run_docs.py JOBS_JSON

JOBS_JSON is a list of {"name", "kind": "example" | "doc", "path", "arg"}: an example runs as
``python PATH ARG`` would (``runpy`` as ``__main__``, ``sys.argv = [PATH, ARG]``); a doc's
```` ```python ```` blocks run in order in one namespace with ARG as the working directory.
One process, so one JVM for all (each example stops its SparkSession; the next ``session()``
starts another in the same JVM in well under a second, where a new JVM takes 10 s or more).
Each job's stdout follows a line ``=== NAME``; a job that raises (``SystemExit`` with a
non-zero code included) prints its traceback and ``=== FAILED NAME``, and the next job runs.
Tracebacks point at the Markdown file's own line numbers.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
import time
import traceback
from pathlib import Path

BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def python_blocks(md: Path) -> list[tuple[int, str]]:
    """(first code line, code) of every ```python block of ``md``."""
    text = md.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def run_doc(md: Path, cwd: str) -> None:
    namespace: dict = {"__name__": "__main__"}
    here = os.getcwd()
    os.chdir(cwd)
    try:
        for line, code in python_blocks(md):
            print(f"--- {md.name}:{line}", flush=True)
            # padded so that a traceback names the guide's own line
            exec(compile("\n" * (line - 1) + code, str(md), "exec"), namespace)
    finally:
        os.chdir(here)


def run_example(path: Path, arg: str) -> None:
    argv = sys.argv
    sys.argv = [str(path), arg]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        sys.argv = argv


def main() -> None:
    for job in json.loads(sys.argv[1]):
        print(f"=== {job['name']}", flush=True)
        start = time.monotonic()
        try:
            if job["kind"] == "doc":
                run_doc(Path(job["path"]), job["arg"])
            else:
                run_example(Path(job["path"]), job["arg"])
        except BaseException:
            traceback.print_exc(file=sys.stdout)
            print(f"=== FAILED {job['name']}", flush=True)
        print(f"run_docs: {job['name']} took {time.monotonic() - start:.1f} s", file=sys.stderr,
              flush=True)


if __name__ == "__main__":
    main()
    # every job's outcome is on stdout ("=== FAILED ..."); skip the interpreter's teardown, where
    # a native thread still alive once aborted this process after all six jobs had passed
    # ("terminate called without an active exception", rc -6; seen once in ~10 suite runs,
    # not reproduced). The examples' own exit is what a user sees; this harness runs them all
    # in one process, which no user does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
