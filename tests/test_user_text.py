"""The text a user reads — README.md, docs/, examples/, and src/ (docstrings, comments, CLI
help) — describes the product as it is: no development history (work sessions, issue numbers,
seed document numbers, dates of runs, commit ids). History lives in git."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

HISTORY = {
    "a work session": re.compile(r"\bsessions? [0-9]+", re.I),
    "an issue number": re.compile(r"\bissues? #?[0-9]+", re.I),
    "a seed document number": re.compile(r"\bseeds? 0[0-9]{2}\b", re.I),
    # a date alone (a run's); a timestamp such as 2026-11-24T10:00:00Z is data and passes
    "a date": re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b(?!T)"),
    # 7 to 40 hex digits with a letter and a digit: how git names a commit
    "a commit id": re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?!\w)"),
}
# Markdown code (fenced blocks and `spans`) may hold hex dumps of a format's bytes
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.M | re.S)


def user_text_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "examples").rglob("*.py")), *sorted((REPO / "src").rglob("*.py"))]
    return [f for f in files if "__pycache__" not in f.parts]


def history_in(path: Path) -> list[str]:
    """'file:line: what: the matched text' for each piece of history in ``path``."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":  # blank out code, keeping line numbers
        text = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    found = []
    for what, pattern in HISTORY.items():
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(REPO)}:{line}: {what}: {m.group()!r}")
    return found


def test_the_patterns_catch_history_and_pass_the_product():
    """The test cannot pass vacuously: each pattern matches what it is for, and not a
    timestamp in an example, a hex dump in code or a word such as `session()`."""
    history = ("after session 14", "Issue 15 asks", "seed 004's recipe", "run on 2026-11-27",
               "in commit 5b3e308")
    assert [what for what, p in HISTORY.items() for h in history if p.search(h)] == list(HISTORY)
    product = ("spark = session()", "a SparkSession", "issues a GET", "timestamp "
               "2026-11-24T10:00:00.5Z", "crc 0x1edc6f41", "ULID 01JD8X7Q", "seed=7",
               "1234567 rows", "deadline")
    assert [h for h in product for p in HISTORY.values() if p.search(h)] == []


@pytest.mark.parametrize("part", ["README.md", "docs", "examples", "src"])
def test_user_text_has_no_history(part):
    files = [f for f in user_text_files() if f.relative_to(REPO).parts[0] == part]
    assert files, f"no files under {part}"
    found = [hit for f in files for hit in history_in(f)]
    assert not found, "history in user-facing text (say what the product is):\n" + \
        "\n".join(found)
