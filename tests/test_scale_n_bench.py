"""bench/performance/scale_n.py (issue 32): the engine-at-scale section runs every named family end to end on a tiny stream,
reports where each stopped, and rewrites only its marked parts of a performance document.  No timing is asserted."""
from __future__ import annotations

import numpy as np

from bench.performance import scale_n as S


def test_chunked_stream_is_the_rule_in_chunks(monkeypatch):
    monkeypatch.setattr(S, "GEN_CHUNK", 64)
    X, y, Xt, yt = S.chunked_stream(300, 5, seed=1, n_test=50)
    assert X.shape == (300, 5) and Xt.shape == (50, 5) and set(np.unique(y)) <= {0.0, 1.0}
    assert np.all(np.linalg.norm(X, axis=1) <= 0.95 + 1e-12)
    X2, y2, _, _ = S.chunked_stream(300, 5, seed=1, n_test=50)
    assert np.array_equal(X, X2) and np.array_equal(y, y2)


def test_run_table_and_docs(tmp_path):
    fams = ["passive_olu", "retrain", "sisa", "exact_ridge"]
    r = S.run(quick=True, sizes=(500, 1000), families=fams, cap_s=60.0, log=lambda *a, **k: None)
    assert list(r["families"]) == fams
    for fam in fams:
        rows = r["families"][fam]["rows"]
        assert [row["n"] for row in rows] == [500, 1000], (fam, r["families"][fam])
        assert all(row["forget_s"] > 0 and row["forgets"] >= 1 and row["learned"] == row["n"] for row in rows)
    assert r["families"]["sisa"]["rows"][0]["shards"] == 8
    assert r["families"]["retrain"]["rows"][-1]["retained_bytes_per_record"] == 8.0 * (S.D + 2)
    assert set(r["ratios"]["retrain_forget_vs_passive_learn"]) == {500, 1000}
    assert r["database"]["backends"]["sqlite"]["retrain"]["total_per_example"] > \
        r["database"]["backends"]["sqlite"]["passive_olu"]["total_per_example"] > 0
    lines = S.table(r)
    assert any(line.strip().startswith("sisa") for line in lines)
    doc = tmp_path / "perf.md"
    doc.write_text(f"# x\n{S.TARGETS_BEGIN}\nold\n{S.TARGETS_END}\nkeep me\n{S.BEGIN}\nold\n{S.END}\ntail\n")
    S.write_docs(r, doc)
    text = doc.read_text()
    assert "old" not in text and "keep me" in text and text.endswith("tail\n")
    assert "| target | measured |" in text and "```text" in text
