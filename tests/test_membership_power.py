"""The membership-inference-with-power setting (bench/accuracy/membership.py ``power_*``; issue 30 item 4) at tiny size:
the attack arithmetic, the verdicts, the memorising stream, and the generated docs part -- fixed seeds
throughout, no timing."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("scipy")

from bench.accuracy import membership as M

TINY = {"n": 60, "n_test": 120, "dim": 240, "n_forget": 20, "shadows": 2}


def test_auc_separable_identical_and_interval():
    # perfectly separable scores: 1 (and 0 the other way round), with a degenerate interval at the point
    ci = M.auc_ci(np.arange(10.0, 20.0), np.arange(10.0), seed=0, rounds=50)
    assert (ci["auc"], ci["lo"], ci["hi"]) == (1.0, 1.0, 1.0)
    assert M.auc_ci(np.arange(10.0), np.arange(10.0, 20.0), rounds=50)["hi"] == 0.0
    # the very same scores in both groups: exactly 0.5 (ties and the rank symmetry)
    v = np.random.default_rng(3).normal(size=200)
    assert M.auc(v, v) == 0.5
    # the Mann-Whitney AUC against the pairwise definition, ties included
    rng = np.random.default_rng(4)
    pos, neg = rng.integers(0, 5, 80).astype(float), rng.integers(0, 5, 70).astype(float)
    brute = np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg])
    assert M.auc(pos, neg) == pytest.approx(brute)
    # one distribution (fixed seed): the 95 % interval covers 0.5 and contains the point; the bootstrap is
    # deterministic for a given seed and narrows as the groups grow
    a, b = rng.normal(size=400), rng.normal(size=400)
    ci, again = M.auc_ci(a, b, seed=7, rounds=200), M.auc_ci(a, b, seed=7, rounds=200)
    assert ci == again and ci["lo"] <= 0.5 <= ci["hi"] and ci["lo"] <= ci["auc"] <= ci["hi"]
    small = M.auc_ci(a[:40], b[:40], seed=7, rounds=200)
    assert small["hi"] - small["lo"] > ci["hi"] - ci["lo"]


def test_verdicts():
    def cell(auc, lo, hi):
        return {"auc": auc, "lo": lo, "hi": hi}

    row = {"before": {"loss": {"retained": cell(0.7, 0.65, 0.75)}, "lira": {"retained": cell(0.55, 0.5, 0.6)}},
           "after": {"loss": {"forgotten": cell(0.5, 0.45, 0.55)}, "lira": {"forgotten": cell(0.58, 0.52, 0.64)}},
           "done": 3, "sigma_mean": 0.0, "mechanisms": ["exact"]}
    v = M.power_verdict(row)
    assert v["power"] and v["leaks"] and not v["inside"] and v["max_forgotten"] == 0.58 and not v["power_after"]
    row["after"]["loss"]["retained"] = cell(0.7, 0.66, 0.74)
    assert M.power_verdict(row)["power_after"]
    row["after"]["lira"]["forgotten"] = cell(0.52, 0.47, 0.57)
    row["before"]["loss"]["retained"] = cell(0.59, 0.55, 0.63)  # interval above 0.5 but AUC < 0.6: no power
    v = M.power_verdict(row)
    assert not v["power"] and not v["leaks"] and v["inside"]
    assert M.exact_family(row) and not M.exact_family({**row, "sigma_mean": 0.1})
    assert not M.exact_family({**row, "mechanisms": ["discrete_gaussian"]})


def test_stream_bounds_and_flips():
    (X, y), (Xt, yt), (Xp, yp), flipped = M.power_stream(50, 30, 20, 0.25, seed=1, with_flips=True)
    assert X.shape == (50, 20) and Xt.shape == (30, 20) and Xp.shape == (100, 20)
    assert np.allclose(np.linalg.norm(np.vstack([X, Xt, Xp]), axis=1), 1.0)  # within the spec's x_norm = 1
    assert set(np.unique(np.concatenate([y, yt, yp]))) <= {0.0, 1.0} and len(flipped) == 180
    again = M.power_stream(50, 30, 20, 0.25, seed=1)
    assert len(again) == 3 and np.array_equal(again[0][0], X) and np.array_equal(again[2][1], yp)


def test_power_run_tiny(tmp_path):
    lines: list[str] = []
    r = M.power_run(["retrain", "passive_olu"], log=lines.append, **TINY)
    assert set(r["families"]) == {"retrain", "passive_olu"} and len(lines) == 2
    for row in r["families"].values():
        assert row["done"] == TINY["n_forget"]
        for a in M.ATTACKS:
            for cell in (row["before"][a]["retained"], row["after"][a]["forgotten"], row["after"][a]["retained"]):
                assert 0.0 <= cell["lo"] <= cell["auc"] <= cell["hi"] <= 1.0
            assert row["after"][a]["forgotten"]["n_pos"] == TINY["n_forget"]
            assert row["after"][a]["retained"]["n_pos"] == TINY["n"] - TINY["n_forget"]
    assert M.exact_family(r["families"]["retrain"]) and not M.exact_family(r["families"]["passive_olu"])
    # d = 4 n, labels flipped with probability 0.2: the exact retrain memorises its records (fixed seeds; the
    # margin is wide: the measured AUC is far above it)
    assert r["families"]["retrain"]["before"]["loss"]["retained"]["lo"] > 0.6
    # seeded end to end: a second run gives the same numbers
    again = M.power_run(["retrain"], log=lines.append, **TINY)
    assert again["families"]["retrain"]["after"] == r["families"]["retrain"]["after"]
    # the generated part: markers, one row per family and attack, rewritten in place
    r.update(machine={"date_utc": "2026-01-01 00:00:00", "nproc": "2", "cpu": "x", "load_avg": [1.0]}, commit="abc",
             replicates=[again])
    doc = tmp_path / "docs" / "accuracy.md"
    doc.parent.mkdir()
    doc.write_text("# Accuracy\n\nprose before\n")
    M.power_write_docs(r, tmp_path / "out", tmp_path / "docs")
    M.power_write_docs(r, tmp_path / "out", tmp_path / "docs")
    text = doc.read_text()
    assert text.count(M.POWER_BEGIN) == 1 and text.count(M.POWER_END) == 1 and "prose before" in text
    assert "commit abc" in text and sum(line.startswith("| retrain |") for line in text.splitlines()) == 2
    # the summary across seeds: the families present in every run, with both attacks' intervals counted
    assert "Across 2 seeds" in text and "| retrain (exact) |" in text and "of 4 |" in text
    assert not any(line.startswith("| passive_olu |") and "of 4" in line for line in text.splitlines())
    assert (tmp_path / "out" / "membership_power.json").exists()


def test_leak_verdict_uses_every_seed_with_a_multiplicity_correction():
    """Issue 37 item 7: the verdict read the first seed only (any interval above 0.5: exact families flagged in 11 of
    100 family-runs at quick sizes).  Now: each attack's one-sided Mann-Whitney z combined over the seeds
    (Stouffer), Bonferroni over the two attacks, family-wise 5 %."""
    from bench.accuracy.membership_verdict import leak_verdict, z_of

    def row(p_loss, p_lira, lo=0.45):
        cell = lambda p: {"auc": 0.55, "lo": lo, "hi": 0.62, "p": p}  # noqa: E731
        return {"after": {"loss": {"forgotten": cell(p_loss)}, "lira": {"forgotten": cell(p_lira)}}}

    # one seed just past a 2.5 % tail (its interval above 0.5), the others at chance: no leak
    chance = leak_verdict([row(0.02, 0.3, lo=0.51), row(0.6, 0.5), row(0.45, 0.7), row(0.5, 0.4)])
    assert not chance["leaks"] and chance["seeds"] == 4 and chance["loss"]["p"] > 0.025
    # a small shift at every seed, none significant alone: combined, a leak (the power of pooling the seeds)
    pooled = leak_verdict([row(0.04, 0.5), row(0.05, 0.5), row(0.03, 0.5), row(0.06, 0.5)])
    assert pooled["leaks"] and pooled["loss"]["p"] < 0.025 / 1
    # Bonferroni: a combined p of 0.03 on one attack is not enough (0.025 per attack)
    one = leak_verdict([row(0.03, 0.9)])
    assert one["loss"]["p"] == pytest.approx(0.03) and not one["leaks"]
    # saved runs without p: z from the interval's half width (0.55 with +-0.05 is about z = 1.96)
    assert z_of({"auc": 0.55, "lo": 0.5, "hi": 0.6}) == pytest.approx(1.96, abs=0.01)
    assert leak_verdict([{"after": {}}]) is None


def test_mann_whitney_p_is_calibrated_for_exchangeable_groups():
    rng = np.random.default_rng(11)
    ps = [M.auc_ci(rng.normal(size=30), rng.normal(size=200), rounds=10)["p"] for _ in range(400)]
    assert 0.02 <= np.mean(np.array(ps) < 0.05) <= 0.09  # about 5 % under the null (400 draws)
    assert M.auc_ci(rng.normal(1.0, size=30), rng.normal(size=200), rounds=10)["p"] < 1e-4
