"""Issue 38 item 4 in CI: the observer bench (bench/accuracy/observer.py) at its quick size.  A before/after
observer of a 1-record forget recovers the record from retrain's and exact_ridge's exact versions (gradient
inversion with H estimated from a population sample), and nothing from exact_ridge's private publication."""
from __future__ import annotations

from bench.accuracy import observer


def test_gradient_inversion_reads_the_record_off_exact_versions_only():
    rows = {f: observer.attack(f, observer.QUICK_N, observer.QUICK_FORGETS) for f in
            ("retrain", "exact_ridge", "exact_ridge_private")}
    for exact in ("retrain", "exact_ridge"):
        best = max(rows[exact][a]["first"] for a in ("population_h", "raw"))
        assert best >= 0.7 and rows[exact]["raw"]["cosine_median"] > 0.8, rows[exact]
    private = rows["exact_ridge_private"]
    assert all(private[a]["first"] <= 0.1 and abs(private[a]["cosine_median"]) < 0.5 for a in ("population_h", "raw"))
    assert "retrain" in "\n".join(observer.table({"n": 1, "forgets": 1, "dim": 1, "rows": list(rows.values())}))
