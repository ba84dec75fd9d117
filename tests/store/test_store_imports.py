"""The import rule of DESIGN.md for the foundation: store and codec use nothing of headrace but
themselves and headrace.errors (retry: codec.clock too). A violation would let a higher layer's
import cycle or heavy dependency leak into every component."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "headrace"
ALLOWED = {
    "store": ("headrace.store", "headrace.errors"),
    "codec": ("headrace.codec", "headrace.errors"),
    "retry.py": ("headrace.codec", "headrace.errors"),
    "errors.py": (),
}


def _headrace_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
    return [n for n in names if n == "headrace" or n.startswith("headrace.")]


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_foundation_imports_point_down_only(part):
    target = SRC / part
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    assert files
    bad = [(f.name, m) for f in files for m in _headrace_imports(f)
           if not any(m == a or m.startswith(a + ".") for a in ALLOWED[part])]
    assert bad == []
