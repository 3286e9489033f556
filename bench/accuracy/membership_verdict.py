"""The membership verdicts of bench/accuracy/membership.py's ``power_*`` section, from its results alone.

``power_verdict(row)``: one run's reading of one family (its intervals).  ``leak_verdict(rows)``: whether a family's
forgotten records are told apart from never-seen ones, over **every seed** with a multiplicity correction (issue 37
item 7; the verdict used the first seed only, and flagged the bit-identical ``exact_ridge``):

- per seed and attack, the one-sided Mann-Whitney p-value of "forgotten scores above never-seen" (``p`` in the
  cell; older saved runs without it: from the interval's half width, as a normal approximation).  For a family
  that forgets exactly, forgotten and never-seen records are exchangeable given the model, so the test is exact
  up to the normal approximation whatever the scores' distribution (the bootstrap interval's ``lo > 0.5`` was
  reported to fire for the exact families in 11 of 100 family-runs at quick sizes, against a nominal 5 %);
- per attack, Stouffer's combination of the seeds' z-scores (the seeds are independent: a new stream, forgotten
  set and noise each);
- Bonferroni over the two attacks: ``leaks`` when an attack's combined p is below alpha / 2 (alpha = 0.05), so a
  family that forgets exactly is flagged with probability at most alpha.

bench/accuracy/membership_falseflags.py measures that probability on the exact families.  Measured 2026-12-06 (200
seeds from 1030, quick size, the five exact families; shared 2-core machine): the old rule flagged 60 of 1 000
family-runs, 6.0 % [4.7, 7.6] (Wilson 95 %; sisa 10.5 %, exact_ridge 9.0 %); this verdict 24 of 500 over 2 seeds,
4.8 % [3.2, 7.0], and 14 of 250 over 4 seeds, 5.6 % [3.4, 9.2] -- at the nominal 5 % within the noise of the count
(per family 2-10 %, the highest exact_ridge's 5 of 50 [4.3, 21.4]).
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Sequence

ATTACKS = ("loss", "lira")
ALPHA = 0.05
_N = NormalDist()


def power_verdict(row: dict[str, Any]) -> dict[str, Any]:
    """Per family, from both attacks of one run: ``power`` -- before any forget, retained vs never-seen has AUC >= 0.6
    with its interval above 0.5 for at least one attack (the attack can see membership in this family's published
    model); ``leaks`` -- after the forgets, forgotten vs never-seen has its interval above 0.5 for at least one
    attack (one seed, no correction: ``leak_verdict`` is the verdict); ``power_after`` -- the records still retained
    after the forgets pass the ``power`` test (without it, forgotten ≈ 0.5 only says that the model remembers
    nothing the attacks see); ``max_forgotten`` -- the larger forgotten AUC."""
    before = [row.get("before", {}).get(a, {}).get("retained") for a in ATTACKS]
    after = [row.get("after", {}).get(a, {}).get("forgotten") for a in ATTACKS]
    kept = [row.get("after", {}).get(a, {}).get("retained") for a in ATTACKS]
    before, after, kept = [v for v in before if v], [v for v in after if v], [v for v in kept if v]
    return {"power": any(v["auc"] >= 0.6 and v["lo"] > 0.5 for v in before),
            "power_after": any(v["auc"] >= 0.6 and v["lo"] > 0.5 for v in kept),
            "leaks": any(v["lo"] > 0.5 for v in after),
            "inside": bool(after) and all(v["lo"] <= 0.5 <= v["hi"] for v in after),
            "max_forgotten": max((v["auc"] for v in after), default=float("nan"))}


def exact_family(row: dict[str, Any]) -> bool:
    """Whether every forget of the run was certified exact (sigma = 0, mechanism "exact")."""
    return row.get("done", 0) > 0 and row.get("sigma_mean", 1.0) == 0.0 and row.get("mechanisms") == ["exact"]


def z_of(cell: dict[str, Any]) -> float:
    """The one-sided z-score of "above 0.5" of an AUC cell: from its Mann-Whitney p, else from its interval."""
    p = cell.get("p")
    if p is not None and not math.isnan(p):
        return _N.inv_cdf(min(max(1.0 - float(p), 1e-15), 1.0 - 1e-15))
    half = (cell["hi"] - cell["lo"]) / 2.0
    return 0.0 if not half > 0.0 else (cell["auc"] - 0.5) / (half / 1.959963984540054)


def leak_verdict(rows: Sequence[dict[str, Any]], alpha: float = ALPHA) -> dict[str, Any] | None:
    """A family's runs at every seed (rows of ``power_run`` with ``after``) -> per attack the combined z and
    one-sided p, and ``leaks`` (combined p < alpha / number of attacks for some attack); None without forgets."""
    cells = [[row.get("after", {}).get(a, {}).get("forgotten") for row in rows] for a in ATTACKS]
    cells = [[c for c in cs if c] for cs in cells]
    if not all(cells):
        return None
    out: dict[str, Any] = {"seeds": len(cells[0]), "alpha": alpha}
    for a, cs in zip(ATTACKS, cells):
        z = sum(z_of(c) for c in cs) / math.sqrt(len(cs))
        out[a] = {"z": z, "p": 1.0 - _N.cdf(z)}
    out["leaks"] = any(out[a]["p"] < alpha / len(ATTACKS) for a in ATTACKS)
    return out
