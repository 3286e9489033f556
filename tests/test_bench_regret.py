"""Smoke test of ``python -m bench.regret``'s Table 1 code path (bench/regret/regret_table1.py) at tiny T."""
from __future__ import annotations

import math

import numpy as np
import pytest

from bench.regret import regret as regret_bench
from bench.regret import regret_table1 as t1
from bench.regret import regret_table1_docs as t1_docs

SIZES, KS = (150, 300), (2, 3)


@pytest.fixture(scope="module")
def data():
    return t1.synthetic(max(SIZES), d=5, seed=1)


@pytest.fixture(scope="module")
def res(data):
    return t1.run(sizes=SIZES, ks=KS, data=data, with_digits=False, log=lambda *a: None, seeds=1)


def test_slope_fit():
    assert t1.slope([10, 100, 1000], [3.0, 30.0, 300.0]) == pytest.approx(1.0)
    assert t1.slope([10, 100], [5.0, 5.0]) == pytest.approx(0.0)
    assert math.isnan(t1.slope([10, 100], [1.0, -1.0]))     # a regret <= 0 has no logarithm
    assert math.isnan(t1.slope([10], [1.0]))
    assert t1.predicted_slope(t1.LIN, [1000, 100000], 10) == pytest.approx(1.0)
    assert 0.05 < t1.predicted_slope(t1.LOG, [1000, 100000], 10) < 0.2  # log T is not flat over this range


def test_every_served_family_is_measured(res):
    from app.unlearning import ALGORITHMS

    assert {f.algorithm for f in t1.FAMILIES} == set(ALGORITHMS)
    assert len(res["rows"]) == len(t1.FAMILIES) * len(KS)
    for row in res["rows"]:
        assert sorted(row.cells) == list(SIZES)
        for T, cell in row.cells.items():
            assert not cell.fallback, (row.family.label, T)
            assert cell.n_timed == row.k and cell.seeds == 1  # one timed forget per deletion event
            assert cell.cost_s is not None and cell.cost_s > 0
            assert cell.regret is not None and np.isfinite(cell.regret)
        assert np.isfinite(row.cost_slope()), row.family.label
        regrets = [row.cells[T].regret for T in SIZES]
        if all(r > 0 for r in regrets):
            assert np.isfinite(row.regret_slope())


def test_exact_families_add_no_noise_and_noisy_ones_do(res):
    sig = {(r.family.algorithm, r.k): r.cells[SIZES[-1]].sigma for r in res["rows"]}
    for k in KS:
        assert sig[("retrain", k)] == 0.0
        assert sig[("discard_and_restart", k)] == 0.0
        assert sig[("passive_olu", k)] > 0.0
        assert sig[("second_order_olu", k)] > 0.0


def test_tables_have_one_line_per_family_and_k(res):
    text = "\n".join(t1_docs.document(res))
    for title in ("### Table 1a", "### Table 1b"):
        block = text.split(title, 1)[1].split("###", 1)[0]
        body = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| family")]
        assert len(body) == len(t1.FAMILIES) * len(KS)
    assert "where the measured slopes disagree" in text.lower()


def test_over_budget_cells_fall_back_and_say_so(data):
    fams = tuple(f for f in t1.FAMILIES if f.algorithm in ("retrain", "passive_olu_restart"))
    res = t1.run(sizes=SIZES, ks=(2,), families=fams, cap_s=0.0, data=data, with_digits=False, log=lambda *a: None,
                 seeds=1)
    for row in res["rows"]:
        first, second = row.cells[SIZES[0]], row.cells[SIZES[1]]
        assert not first.fallback and first.regret is not None
        assert second.fallback and second.regret is None and second.n_timed == t1.FALLBACK_FORGETS
        assert second.cost_s > 0
        assert math.isnan(row.regret_slope())            # one regret point: no slope, never an extrapolation
    text = "\n".join(t1_docs.markdown(res))
    assert text.count("not run [") == len(fams)


def test_cli_quick_path_writes_the_documents(tmp_path):
    regret_bench.main(["--quick", "--table1-only", "--sizes", "150,300", "--ks", "2", "--no-digits",
                       "--out", str(tmp_path)])
    doc = (tmp_path / "regret.md").read_text()
    assert "Table 1a" in doc and "Table 1b" in doc
    assert (tmp_path / "regret_table1.png").stat().st_size > 0
    regret_bench.main(["--render", str(tmp_path / "regret_last.pkl"), "--out", str(tmp_path / "again")])
    assert (tmp_path / "again" / "regret.md").read_text().split("Runtime of Table 1")[0] == \
        doc.split("Runtime of Table 1")[0]


def test_several_noise_seeds_average_and_report_their_spread(data):
    fams = tuple(f for f in t1.FAMILIES if f.algorithm in ("passive_olu", "retrain") and "uniform" not in f.label)
    res = t1.run(sizes=SIZES, ks=(3,), families=fams, data=data, with_digits=False, log=lambda *a: None, seeds=2)
    one = t1.run(sizes=SIZES[:1], ks=(3,), families=fams, data=data, with_digits=False, log=lambda *a: None, seeds=1)
    for row, single in zip(res["rows"], one["rows"]):
        cell = row.cells[SIZES[0]]
        assert cell.seeds == 2 and cell.n_timed == 2 * 3
        if row.family.algorithm == "retrain":                # exact: every seed gives the same run
            assert cell.regret_sd == 0.0 and cell.regret == pytest.approx(single.cells[SIZES[0]].regret)
        else:                                                # seeds 0 and 1 draw different noise
            assert cell.regret_sd > 0.0
