"""The house's rules (issue 22): no import circle in app/ or bench/, lower floors of the engine never import upper
ones, and no file in app/ over 500 lines.

There are no exceptions: the restructuring of issue 22 emptied the lists of known circles and long files that
stood here while it was under way.  The map of the floors and rooms is docs/architecture.md.

The import graph is read from the sources with ``ast`` (module-level and function-level imports alike: a lazy
import that dodges a circle at run time is still a circle for the reader).  Run it alone with
``python -m pytest -q tests/test_layering.py``; ``python -m tests.test_layering`` prints the graph's circles.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "bench")
MAX_LINES = 500

# The engine's floors, lowest first: a module may import from its own floor or lower ones only.  The package root
# (app/unlearning/__init__.py, the public API and the family registry) stands above them all.
ENGINE_FLOORS = (
    ("app.unlearning.contract.errors", "app.unlearning.contract.certificate", "app.unlearning.contract.spec",
     "app.unlearning.contract.knobs"),
    ("app.unlearning.maths",),
    ("app.unlearning.mechanism",),
    ("app.unlearning.contract.unlearner",),
    ("app.unlearning.families",),
    ("app.unlearning.verification",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``module`` imports (a name imported from a package that is itself a module counts as
    that module)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node)
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import app.x.y` names app.x.y; `from app import x` may name a package
                t = t.rpartition(".")[0]
            if t and t != module:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    src = sources()
    known = set(src)
    return {m: imports_of(m, p, known) for m, p in src.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def floor_of(module: str) -> int | None:
    for i, prefixes in enumerate(ENGINE_FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_no_import_circle_in_app_or_bench():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_engine_floors_only_import_downwards():
    bad = []
    for module, targets in graph().items():
        here = floor_of(module)
        if here is None:
            continue
        for t in targets:
            there = floor_of(t)
            if t == "app.unlearning" or (there is not None and there > here):
                bad.append(f"{module} (floor {here}) imports {t} (floor {there})")
    assert not bad, "\n".join(sorted(bad))


def test_engine_imports_nothing_of_the_service():
    bad = [f"{m} imports {t}" for m, ts in graph().items() if m.startswith("app.unlearning")
           for t in ts if t.startswith("app.") and not t.startswith("app.unlearning")]
    assert not bad, "\n".join(sorted(bad))


def test_no_app_file_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "app").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_the_graph_sees_known_edges():
    """A guard against a reader that finds nothing: the graph must see the service importing the engine."""
    g = graph()
    assert any(t.startswith("app.unlearning") for t in g["app.registry"])
    assert "app.config" in g["app.main"]


if __name__ == "__main__":
    for c in circles(graph()):
        print(" -> ".join(c))
