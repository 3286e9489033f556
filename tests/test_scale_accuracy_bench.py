"""Smoke test of the scale_accuracy section (bench/accuracy/scale_accuracy.py, bench/accuracy/membership.py) at tiny size: its
plumbing and what cannot fail silently, not its numbers (those are docs/accuracy.md)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("scipy")

from bench.accuracy import membership as M  # noqa: E402
from bench.accuracy import scale_accuracy as S  # noqa: E402
from bench.accuracy import scale_accuracy_docs as SD  # noqa: E402
from bench.accuracy import scale_runs as SR  # noqa: E402


def test_auc_and_interval():
    rng = np.random.default_rng(0)
    assert M.auc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    assert M.auc(np.array([0.0]), np.array([1.0])) == 0.0
    assert M.auc(np.ones(5), np.ones(7)) == 0.5  # ties count one half
    pos, neg = rng.normal(0.5, 1, 300), rng.normal(0, 1, 500)
    brute = np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg])
    ci = M.auc_ci(pos, neg, rounds=100)
    assert ci["auc"] == pytest.approx(brute) and ci["lo"] <= ci["auc"] <= ci["hi"] and 0 <= ci["lo"] < ci["hi"] <= 1
    # confidence on the true label: logistic P(class 1), softmax the class's column
    assert np.allclose(M.true_label_confidence(np.array([0.9, 0.2]), np.array([1.0, 1.0])), [0.9, 0.2])
    assert np.allclose(M.true_label_confidence(np.array([0.9, 0.2]), np.array([0.0, 0.0])), [0.1, 0.8])
    P = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]])
    assert np.allclose(M.true_label_confidence(P, np.array([1.0, 2.0])), [0.7, 0.25])


def test_scale_section_at_tiny_size(tmp_path):
    n = 2000
    d = {"name": f"synthetic {n}", "loss": "logistic", "data": SR.synthetic_stream(n, 500), "what": "tiny"}
    lines: list[str] = []
    objects: dict = {}
    r = S.run_dataset(d, quick=True, families=["passive_olu", "retrain"], log=lines.append, objects=objects)
    assert r["ks"] == {"1e-4": 1, "1e-3": 2, "1e-2": 20}
    cols = SD.columns(r)
    ref, fams = r["reference"], r["families"]
    assert set(fams) == {"passive_olu", "retrain"} and all(0.0 <= ref[c] <= 1.0 for c in cols)
    # before any forget passive OLU is the exact retrain's OGD (same schedule, no noise yet)
    assert fams["passive_olu"]["before"] == ref["before"]
    # the retrain family is exact: every cell is the reference (a masked run with the clock kept), no noise
    for c in cols:
        assert fams["retrain"][c] == pytest.approx(ref[c], abs=1e-12), c
    assert fams["retrain"]["sigma_mean"] == 0.0 and fams["retrain"]["mechanisms"] == ["exact"]
    assert fams["retrain"]["x_retrain"] == pytest.approx(1.0)
    assert fams["passive_olu"]["forget_us_median"] > 0 and fams["passive_olu"]["sigma_mean"] > 0
    # membership AUCs: in [0, 1], the interval contains the point, one row per scenario and attack
    for fam in fams.values():
        for key in ("mia", "mia_during"):
            for attack in ("loss", "lira"):
                for group in ("forgotten", "retained"):
                    v = fam[key][attack][group]
                    assert 0.0 <= v["lo"] <= v["auc"] <= v["hi"] <= 1.0
        assert fam["mia"]["n_forgotten"] == 20
    # the retrain's forgotten-vs-never-seen AUC equals the one of the exact retrain on the masked stream
    t, keep = objects["targets"], objects["keeps"]["end 1e-2"]
    exact = SR.masked_model("retrain", d["data"], "logistic", {}, keep)
    want = t.aucs(exact, "end", objects["order"][:20])
    assert fams["retrain"]["mia"]["loss"]["forgotten"]["auc"] == want["loss"]["forgotten"]["auc"]
    assert fams["retrain"]["mia"]["lira"]["forgotten"]["auc"] == want["lira"]["forgotten"]["auc"]
    out = {"epsilon": S.EPSILON, "delta": S.DELTA, "rho": S.RHO, "rates": ["1e-4", "1e-3", "1e-2"],
           "spec_fields": dict(S.MODEL_DEFAULTS), "shadows": 2, "datasets": {d["name"]: r}, "seconds": 1.0}
    out["targets"] = SD.targets(out)
    assert {t["column"] for t in out["targets"]} == {"end 1e-4", "during 1e-4", "end 1e-3", "during 1e-3"}
    text = SD.table(out)
    assert any(line.strip().startswith("retrain ") for line in text)
    assert any(line.strip().startswith("passive_olu   loss") for line in text)
    # the docs writer: both generated parts appended once, then replaced in place, the prose kept
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "accuracy.md"
    doc.write_text("# Accuracy\n\nprose\n")
    for _ in range(2):
        made = SD.write_docs(out, tmp_path / "out", tmp_path / "docs")
    body = doc.read_text()
    assert body.startswith("# Accuracy\n\nprose\n") and body.count(SD.SCALE_BEGIN) == 1 and body.count(SD.MIA_END) == 1
    assert body.count("## Accuracy at scale") == 1 and body.count("## Membership inference after forgetting") == 1
    assert body.count("| retrain | loss |") == 1 and body.count("| retrain | lira |") == 1 and made
    assert (tmp_path / "docs" / "membership.png").exists() and (tmp_path / "docs" / "accuracy_scale.png").exists()


def test_masked_retained_matches_the_array_store():
    from app.unlearning import ArrayRetained

    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(50, 3)), rng.integers(0, 2, 50).astype(float)
    steps = np.arange(1, 51)
    alive = rng.random(50) > 0.3
    m = SR.MaskedRetained(steps, X, y, alive, 40)
    a = ArrayRetained(steps[:40][alive[:40]], X[:40][alive[:40]], y[:40][alive[:40]])
    assert len(m) == len(a)
    ex = [int(s) for s in steps[:40][alive[:40]][:3]]
    for (s1, X1, y1), (s2, X2, y2) in zip(m.chunks(7, exclude=ex), a.chunks(7, exclude=ex)):
        assert np.array_equal(s1, s2) and np.array_equal(X1, X2) and np.array_equal(y1, y2)
    live = [int(s) for s in steps[:40][alive[:40]][:5]]
    assert np.array_equal(m.get(live)[0], a.get(live)[0])
    dead = int(steps[:40][~alive[:40]][0])
    with pytest.raises(KeyError):
        m.get([dead])


def test_sisa_shards_on_the_small_real_streams():
    """The small-stream side of the sisa defaults: S = 1 is one model (the retrain family's OGD); every row is a
    real accuracy of a real learned ensemble, and the docs table compares each S with S = 1."""
    rows = S.sisa_small_streams(quick=True, log=lambda *_: None)
    assert [r["shards"] for r in rows] == [1, 8] and len({r["dataset"] for r in rows}) == 1
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["per_shard"] == r["n"] // r["shards"] for r in rows)
    lines = SD.markdown_scale({"datasets": {}, "sisa_small": rows, "epsilon": 1.0, "delta": 1e-6, "rho": 0.02,
                              "measured": "now", "seconds": 1.0, "spec_fields": {"domain_radius": 10.0, "l2": 0.01}, "rates": []})
    assert sum(line.startswith(f"| {rows[0]['dataset']} |") for line in lines) == 2
    assert any(line.endswith("| +0.0 |") for line in lines)
