"""The import rules of DESIGN.md, checked on the source: no import cycle anywhere in
src/headrace, each top-level package imports only the packages below it, and the pipeline's
layers import only themselves and the layers below. Every import counts — at module level or
inside a function — except those under ``if TYPE_CHECKING:``, which never run (annotations
of a class's helper modules). A violation would let a higher layer's import cycle or heavy
dependency leak into every component."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "headrace"

# top-level packages, top first: each may import the ones in later rows, never an earlier or
# the same row's (a package imports itself freely). ``headrace`` is the package's own
# __init__ (it re-exports the errors).
TOP_LAYERS = [
    {"cli", "testing"},
    {"spark", "nexmark"},
    {"pipeline"},
    {"persist", "backup", "spine", "buffer"},
    {"reservoir"},  # spine keeps batches in it (ReservoirBatchStore)
    {"retry", "metrics", "zset"},
    {"store", "codec"},
    {"headrace"},
    {"errors"},
]
# pipeline's layers, top first; errors and names sit below them all, the package's __init__
# above them (it re-exports the user's names)
PIPELINE_LAYERS = ["__init__", "api", "driver", "exec", "plan", "state", "operators",
                   "encoding", "errors", "names"]
# the foundation: store and codec use nothing of headrace but themselves and headrace.errors
FOUNDATION = {
    "store": ("headrace.store", "headrace.errors"),
    "codec": ("headrace.codec", "headrace.errors"),
    "retry.py": ("headrace.codec", "headrace.errors"),
    "errors.py": (),
}


def _modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        parts = list(f.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of ``name`` (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _imports(module: str) -> list[tuple[str, int]]:
    """(imported headrace module, line) of every import ``module`` runs."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name == "headrace" or name.startswith("headrace."):
                target = _resolve(name)
                if target is not None and target != module:
                    out.append((target, node.lineno))
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _rank(layers: list, name: str) -> int:
    return next(i for i, layer in enumerate(layers) if name in layer)


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "headrace"


def _pipeline_layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 2 else parts[2]


def test_there_is_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_every_top_level_package_is_in_a_layer():
    assert {_top(m) for m in MODULES} <= set().union(*TOP_LAYERS)


def test_top_level_packages_import_only_the_layers_below():
    bad = []
    for module, imports in GRAPH.items():
        mine = _top(module)
        for target, line in imports:
            theirs = _top(target)
            if theirs != mine and _rank(TOP_LAYERS, theirs) <= _rank(TOP_LAYERS, mine):
                bad.append(f"{module}:{line} imports {target}")
    assert bad == []


def test_pipeline_layers_import_only_themselves_and_the_layers_below():
    modules = [m for m in MODULES if _top(m) == "pipeline"]
    assert {_pipeline_layer(m) for m in modules} <= set(PIPELINE_LAYERS)
    bad = []
    for module in modules:
        mine = PIPELINE_LAYERS.index(_pipeline_layer(module))
        for target, line in GRAPH[module]:
            if _top(target) == "pipeline" and (
                    PIPELINE_LAYERS.index(_pipeline_layer(target)) < mine):
                bad.append(f"{module}:{line} imports {target}")
    assert bad == []


def test_the_pipeline_keeps_at_most_eight_modules_at_its_top_level():
    top = [p for p in (SRC / "pipeline").iterdir() if p.suffix == ".py"]
    assert len(top) <= 8, sorted(p.name for p in top)


@pytest.mark.parametrize("part", sorted(FOUNDATION))
def test_foundation_imports_point_down_only(part):
    target = SRC / part
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    assert files
    prefix = "headrace." + part.removesuffix(".py")
    bad = [(m, t) for m in MODULES if m == prefix or m.startswith(prefix + ".")
           for t, _ in GRAPH[m]
           if not any(t == a or t.startswith(a + ".") for a in FOUNDATION[part])]
    assert bad == []


def test_the_rules_see_imports_inside_functions_and_cycles():
    """The checks are not vacuous: the graph holds function-local imports (headrace.spark's
    lazy public names), and a cycle planted in a copy of the graph is found."""
    source = (SRC / "spark" / "__init__.py").read_text()
    assert "    from headrace.spark import local_session" in source
    assert "headrace.spark.local_session" in {t for t, _ in GRAPH["headrace.spark"]}
    planted = {**GRAPH, "headrace.errors": [*GRAPH["headrace.errors"], ("headrace.store", 1)]}
    assert any({"headrace.errors", "headrace.store"} <= set(c) for c in _cycles(planted))
