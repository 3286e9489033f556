"""Issue 32 item 5: bench/ in rooms, and what it writes to the docs regenerates byte for byte from a saved run.

- No file under bench/ over 500 lines, and no import circle among the bench modules (the graph is
  tests/test_layering.py's, read from the sources with ``ast``).
- ``python -m bench --render RESULTS_JSON`` (bench/__main__.py ``render``) rebuilds the generated parts of
  docs/accuracy.md from a saved results.json, and ``python -m bench.regret --render PICKLE`` rebuilds docs/regret.md,
  without measuring.  tests/data/bench_render/ holds a small saved run of the accuracy and scale_accuracy sections
  (tiny sizes: breast-cancer, a 2 000-record synthetic stream) and of Table 1 (T = 150, 300), and the text the
  code before the split into packages rendered from them (accuracy.md, regret.md; the only edit: the bench/ paths
  the text cites, renamed by the move).  The pickle was written before the move (its cells name
  ``bench.regret_table1``), so the regret render also proves an old saved run still loads.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_layering import MAX_LINES, ROOT, circles, graph, sources

DATA = ROOT / "tests" / "data" / "bench_render"
PACKAGES = ("accuracy", "performance", "scale", "regret", "memory_pair")


def test_no_bench_file_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "bench").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_bench_is_in_rooms_without_an_import_circle():
    g = {m: ts for m, ts in graph().items() if m.startswith("bench")}
    assert not circles(g), circles(g)
    # every section module lives in a family's package; only the runner and the shared helpers stay at the top
    files = {m: p for m, p in sources().items() if m.startswith("bench")}
    top = {m for m, p in files.items() if p.parent == ROOT / "bench" and p.name != "__init__.py"}
    assert top == {"bench.__main__", "bench.common"}, top
    rooms = {p.parent.name for p in files.values() if p.parent != ROOT / "bench"}
    assert rooms == set(PACKAGES), rooms
    assert all((ROOT / "bench" / room / "__init__.py").exists() for room in PACKAGES)
    # the graph really is read: the runner imports the sections, the sections the shared helpers
    assert "bench.accuracy.accuracy_docs" in g["bench.__main__"] and "bench.common" in g["bench.performance.engine"]


def test_accuracy_docs_render_byte_for_byte_from_a_saved_run(tmp_path):
    pytest.importorskip("sklearn")
    from bench.__main__ import render

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "accuracy.md").write_text("# Accuracy\n\nprose\n")
    res = json.loads((DATA / "results.json").read_text())
    made = render(res, tmp_path / "out", docs, to_docs=False)
    assert docs / "accuracy.md" in made
    assert (docs / "accuracy.md").read_text() == (DATA / "accuracy.md").read_text()
    # a second render replaces the generated parts in place: same bytes again
    render(res, tmp_path / "out", docs, to_docs=False)
    assert (docs / "accuracy.md").read_bytes() == (DATA / "accuracy.md").read_bytes()


def test_regret_docs_render_byte_for_byte_from_a_saved_run(tmp_path):
    from bench.regret import regret

    regret.main(["--render", str(DATA / "regret_last.pkl"), "--out", str(tmp_path)])
    assert (tmp_path / "regret.md").read_bytes() == (DATA / "regret.md").read_bytes()
    assert (tmp_path / "regret_table1.png").stat().st_size > 0


def test_render_measures_nothing_and_keeps_the_prose(tmp_path, monkeypatch):
    """--render with a quick run's results writes under --out only (a quick run touches docs/ only with --docs)."""
    from bench import __main__ as runner

    res = json.loads((DATA / "results.json").read_text())
    res["quick"] = True
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(res))
    monkeypatch.setattr(runner, "ROOT", tmp_path)  # docs/ of the checkout is never written by a test
    (tmp_path / "docs").mkdir()
    runner.main(["--render", str(saved), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "accuracy.md").exists() and (tmp_path / "out" / "scale_accuracy.md").exists()
    assert not (tmp_path / "docs" / "accuracy.md").exists()
    assert not (tmp_path / "out" / "results.json").exists()  # nothing measured, no new results
