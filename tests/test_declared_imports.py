"""Issue 31 item 1: every import of the app, the tests, the benchmarks and the migrations is declared in
pyproject.toml, so the README's commands work in a fresh virtual environment (the machine's system Python once had
``jsonschema`` and hid that the test extra lacked it).

Rules, read with ``ast`` (no import is executed):

- an import under ``try: ... except ImportError`` is optional: the code runs without it (uvloop, where uvicorn brought
  it), so it need not be declared;
- ``app/`` and ``migrations/``: a module-level import must come from a base dependency; one inside a function (an
  extra's feature, loaded when used) may come from any extra;
- ``tests/``: from the base dependencies or the ``test`` extra, wherever the import stands;
- ``bench/``: from the base dependencies, the ``test`` extra (the suite imports the benches) or the ``bench`` extra.

A module is mapped to the distribution that installs it (``importlib.metadata.packages_distributions``), so
``yaml`` counts as ``pyyaml`` and ``sklearn`` as ``scikit-learn``; a module not installed here is taken by its own
name.  Each distribution must be named in pyproject.toml itself: a package that arrives only as another's dependency
(``referencing`` through ``jsonschema``) can vanish with the next release of that package.
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"app", "tests", "bench", "migrations",
         "olu_client"}  # olu_client: the SDK that tests/test_cli_and_sdk.py generates and imports at run time


def _dist_name(requirement: str) -> str:
    return _normalise(re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0))


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_dist_name(r) for r in project["dependencies"]}
    extras = {name: {_dist_name(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    return base, extras


def _guarded(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names |= {k.id for k in kinds if isinstance(k, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception"}) or any(h.type is None for h in node.handlers)


MODULE, LAZY, GUARDED = "module", "lazy", "guarded"


def imports(path: Path) -> list[tuple[str, str, int]]:
    """(top-level module, MODULE / LAZY (in a function) / GUARDED (under except ImportError), line) for each
    absolute import."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], kind, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.split(".")[0], kind, child.lineno))
            elif isinstance(child, ast.Try) and _guarded(child):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), GUARDED)
                for part in (child.handlers, child.orelse, child.finalbody):
                    for stmt in part:
                        visit(ast.Module(body=[stmt], type_ignores=[]), kind)
                continue
            inner = LAZY if kind == MODULE and isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else kind
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), MODULE)
    return found


def undeclared() -> list[str]:
    base, extras = declared()
    any_extra = set().union(*extras.values())
    module_dists = importlib.metadata.packages_distributions()
    allowed = {
        "app": (base, base | any_extra),
        "migrations": (base, base | any_extra),
        "tests": (base | extras["test"],) * 2,
        "bench": (base | extras["test"] | extras["bench"],) * 2,
    }
    problems = []
    for room, (required, optional_ok) in allowed.items():
        for path in sorted((ROOT / room).rglob("*.py")):
            for module, kind, line in imports(path):
                if (module in LOCAL or module in sys.stdlib_module_names or module == "__future__"
                        or kind == GUARDED):
                    continue
                dists = {_normalise(d) for d in module_dists.get(module, [module])}
                ok = optional_ok if kind == LAZY else required
                if not dists & ok:
                    where = "an extra" if ok is optional_ok and room in ("app", "migrations") else "its dependencies"
                    problems.append(f"{path.relative_to(ROOT)}:{line}: imports {module!r} ({', '.join(sorted(dists))}),"
                                    f" not declared in {where} in pyproject.toml")
    return problems


def test_every_import_is_declared():
    problems = undeclared()
    assert not problems, "\n".join(problems)


def test_the_check_sees_an_undeclared_import(tmp_path):
    """The rule itself: a guarded import is optional, a module-level one is not, a function's is lazy."""
    source = tmp_path / "m.py"
    source.write_text("import numpy\ntry:\n    import numba\nexcept ImportError:\n    numba = None\n"
                      "def f():\n    import msgpack\n    try:\n        import uvloop\n    except ImportError:\n"
                      "        pass\n")
    assert imports(source) == [("numpy", MODULE, 1), ("numba", GUARDED, 3), ("msgpack", LAZY, 7),
                               ("uvloop", GUARDED, 9)]
    assert "jsonschema" in declared()[1]["test"]
