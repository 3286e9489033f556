"""Smoke test of the accuracy section of the benchmark (bench/accuracy/accuracy.py) at tiny size: its plumbing, not its
numbers (those are docs/accuracy.md)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")  # the data sets (test extra); river (bench extra) is optional: its column is None

from bench.accuracy import accuracy as A  # noqa: E402
from bench.accuracy import accuracy_docs as AD  # noqa: E402
from bench.accuracy import datasets as D  # noqa: E402
from app.unlearning.maths.losses import LOSSES  # noqa: E402


def test_accuracy_section_at_tiny_size(tmp_path):
    entry = next(e for e in A.DATASETS if e.name == "breast-cancer")
    r = A.run_dataset(entry, quick=True, families=["passive_olu", "retrain"], seeds=1)
    n = r["n_train"]
    assert r["forgets"] == {"1 record": 1, "1%": max(1, round(0.01 * n)), "10%": max(1, round(0.1 * n))}
    refs, fams = r["references"], r["families"]
    assert set(refs) == {"exact retrain", "river single pass", "batch optimum (sklearn)"}
    for row in [*refs.values(), *({c: v[c]["mean"] for c in A.COLUMNS} for v in fams.values())]:
        assert all(row[c] is None or 0.0 <= row[c] <= 1.0 for c in A.COLUMNS)
    assert refs["exact retrain"]["before"] is not None and refs["batch optimum (sklearn)"]["before"] is not None
    # before any forget, passive OLU is the exact retrain's OGD (same schedule, no noise yet): same accuracy
    assert fams["passive_olu"]["before"]["mean"] == refs["exact retrain"]["before"]
    assert fams["passive_olu"]["mechanisms"] == ["discrete_gaussian"] and fams["passive_olu"]["sigma_mean"] > 0
    # the retrain family forgets exactly: no noise, and it stays with a fresh retrain on the remaining records
    assert fams["retrain"]["mechanisms"] == ["exact"] and fams["retrain"]["sigma_mean"] == 0.0
    for c in A.COLUMNS:
        assert abs(fams["retrain"][c]["mean"] - refs["exact retrain"][c]) <= 0.05, c
    out = {"epsilon": A.EPSILON, "delta": A.DELTA, "rho": A.RHO, "batch": A.BATCH, "skipped": {},
           "datasets": {"breast-cancer": r}}
    out["targets"] = A.targets(out, {"keep data": {"end 10%": "retrain"}})
    has_river = refs["river single pass"]["before"] is not None
    assert [t["met"] for t in out["targets"]] == [True] * (2 if has_river else 1)
    lines = A.table(out)
    assert any(line.strip().startswith("retrain ") for line in lines)
    made = AD.write_docs(out, tmp_path)
    assert (tmp_path / "accuracy.md").read_text().count("| passive_olu |") == 1 and made


def test_entries_the_engine_cannot_serve_are_skipped_with_the_reason():
    digits = next(e for e in A.DATASETS if e.name == "digits")
    why = A.unsupported(digits)
    assert (why is None) == ("softmax" in LOSSES)
    if why is not None:
        assert "softmax" in why
    hashed = next(e for e in A.DATASETS if e.features == "hashed")
    assert (A.unsupported(hashed) is None) == (D.hashed_encoder() is not None)


def _tiny(entry, n_train: int, n_test: int):
    """``entry``'s quick data cut to n_train / n_test records (plumbing only)."""
    data = entry.load(True)
    data.X_train, data.y_train = data.X_train[:n_train], data.y_train[:n_train]
    data.X_test, data.y_test = data.X_test[:n_test], data.y_test[:n_test]
    return D.Entry(entry.name, entry.loss, entry.features, lambda quick: data, entry.what)


@pytest.mark.skipif("softmax" not in LOSSES, reason="no softmax in this build")
def test_softmax_entry_at_tiny_size():
    digits = next(e for e in A.DATASETS if e.name == "digits")
    r = A.run_dataset(_tiny(digits, 60, 30), quick=True, families=["passive_olu", "retrain", "memory_pair"], seeds=1)
    assert r["loss"] == "softmax" and r["classes"] == 10 and r["dim"] == 64
    fams, refs = r["families"], r["references"]
    # the memory pair refuses softmax at creation, and the table says so
    assert "softmax" in fams["memory_pair"]["skipped"]
    # a softmax passive model is the exact retrain's OGD before any forget; the retrain family forgets exactly
    assert fams["passive_olu"]["before"]["mean"] == refs["exact retrain"]["before"]
    assert fams["retrain"]["mechanisms"] == ["exact"] and fams["retrain"]["sigma_mean"] == 0.0
    for c in A.COLUMNS:  # (30 held-out records: one is 0.033; the retrain keeps the original step numbers)
        assert abs(fams["retrain"][c]["mean"] - refs["exact retrain"][c]) <= 0.1, c
    spec = A.model_spec("passive_olu", 64, "softmax", 10, {})
    assert spec.n_classes == 10 and spec.n_params == 10 * 65
    river = refs["river single pass"]["before"]
    assert river is None or 0.0 <= river <= 1.0


def test_hashed_entry_uses_the_service_featurizer_with_declared_ranges():
    from app.features import featurize_many

    encode = D.hashed_encoder()
    assert encode is not None
    spec = D.hashed_feature_spec()
    assert spec["numeric"] == {f"n{j}": [-D.CAT_RANGE, D.CAT_RANGE] for j in range(D.CAT_NUMERIC)}
    records, _ = D.categorical_records(40)
    X = encode(records)
    assert X.shape == (40, D.HASH_DIM) and (np.linalg.norm(X, axis=1) <= 1.0 + 1e-12).all()
    np.testing.assert_array_equal(X, featurize_many(spec, records, 1.0))  # the service's own encoding
    # a record's vector does not depend on the other records (no statistics of the data)
    np.testing.assert_array_equal(encode(records[:1])[0], X[0])
    hashed = next(e for e in A.DATASETS if e.features == "hashed")
    r = A.run_dataset(_tiny(hashed, 80, 40), quick=True, families=["passive_olu", "retrain"], seeds=1)
    assert r["dim"] == D.HASH_DIM and r["features"] == "hashed"
    assert r["families"]["passive_olu"]["before"]["mean"] == r["references"]["exact retrain"]["before"]


def test_plans_and_encodings():
    plan = A.during_plan(200, 20)
    taus = [t for t, _ in plan]
    assert taus == sorted(taus) and len({u for _, u in plan}) == 20
    assert all(u < tau for tau, u in plan)  # each request names a record already learned
    records, y = D.categorical_records(50)
    X = D.encode_onehot(records)
    assert X.shape == (50, D.CAT_NUMERIC + D.CAT_CATEGORICAL * (len(D.CAT_CUTS) + 1))
    assert (np.linalg.norm(X, axis=1) <= 1.0 + 1e-12).all() and set(np.unique(y)) <= {0.0, 1.0}
