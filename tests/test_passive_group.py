"""passive_olu allocation "group" (issue 30 item 3; docs/passive_group_allocation.md): every window is rho-zCDP against
the run that never saw any record forgotten so far, checked by coupled replay; sigma scaled down must fail.

Near-worst case: every record is the same example at the norm bound with a huber residual that stays saturated
(|y| = 100), l2 = 0, constant steps: each record moves the iterate by exactly Delta = eta L in the same direction,
so the group's gap is exactly the sum of the shifts and the group allocation's certificate is tight.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.privacy.modes import accounting_from_params
from app.unlearning import ModelSpec, SeededNoise, SpecError
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.verification.replay import coupled_replay

RHO = 0.5


def spec(allocation="group", rho=RHO, loss="huber", y_abs=100.0, l2=0.0, R=100.0, dim=1, **hp):
    hp = {"schedule": "convex_constant", "eta": 0.05, "allocation": allocation, **hp}
    return ModelSpec("passive_olu", loss, dim, 1.0, y_abs, R, l2, 1.0, 1e-6, rho, hp)


class Scaled(PassiveOLU):
    """Negative control: the group allocation's sigma times 0.9, still certifying the full window bound."""

    def group_noise(self, u, tau, a):
        sigma, sens, rho_i, total = super().group_noise(u, tau, a)
        return 0.9 * sigma, sens, rho_i, total


def worst_stream(T=20):
    return np.ones((T, 1)), np.full(T, -100.0)


def windows(cls, s, X, y, deletions, seed):
    """Per event: (realized divergence of the coupled replay, the window bound the last certificate states)."""
    points = coupled_replay(lambda noise: cls(s, noise), X, y, deletions, seed=seed)
    e = cls(s, SeededNoise(seed))
    t, bounds = 0, []
    for tau in sorted(deletions):
        e.learn(X[t:tau], y[t:tau])
        t = tau
        bounds.append(e.forget(deletions[tau])[-1].rho)
    return [(p.realized, b) for p, b in zip(points, bounds)]


def test_after_the_stream_every_window_is_covered_and_tight():
    X, y = worst_stream()
    for seed in range(5):
        (realized, bound), = windows(PassiveOLU, spec(), X, y, {20: [3, 7, 11, 15, 19]}, seed)
        assert bound <= RHO * (1 + 1e-12)
        assert 0.95 * RHO < realized <= bound * (1 + 1e-9), (realized, bound)


def test_one_forget_per_request_after_the_stream_and_the_2i_minus_1_law():
    X, y = worst_stream()
    e = PassiveOLU(spec(), SeededNoise(0))
    e.learn(X, y)
    certs = [e.forget([u])[0] for u in (2, 5, 9, 14, 18)]
    a = certs[0].details["Delta_u"]
    total = 0.0
    for i, c in enumerate(certs, 1):
        # the continuous sigma_i^2 is (2i - 1) a^2/(2 rho) up to the lattice terms (< 0.5 %)
        var = (c.details["group_shift"] ** 2 / (2 * RHO)) - total
        total += var
        assert var / ((2 * i - 1) * a * a / (2 * RHO)) == pytest.approx(1.0, rel=5e-3)
        assert c.rho == pytest.approx(RHO, rel=1e-9)  # the window bound: the whole budget, not added up
        assert c.details["group_size"] == float(i)
    assert e.ledger()["accounting"] == "per_update" and e.ledger()["rho_spent"] == pytest.approx(RHO)


@pytest.mark.parametrize("seed", range(4))
def test_coupled_replay_with_learning_between_forgets(seed):
    """Learning between forgets (old records forgotten later, records learned after earlier releases): the window
    bound stays <= rho and the realized divergence stays below it."""
    X, y = worst_stream(40)
    rng = np.random.default_rng(seed)
    dels = {10: [3], 18: [12, 1], 25: [20], 33: [5], 40: [30, 39]}
    s = spec(l2=0.02 * rng.integers(0, 2))
    for realized, bound in windows(PassiveOLU, s, X, y, dels, seed):
        assert bound <= RHO * (1 + 1e-12) and realized <= bound * (1 + 1e-9), (realized, bound)


def test_sigma_scaled_down_is_caught():
    X, y = worst_stream()
    caught = 0
    for seed in range(5):
        (realized, bound), = windows(Scaled, spec(), X, y, {20: [3, 7, 11, 15, 19]}, seed)
        caught += realized > bound
    assert caught == 5


def test_hyperparameters_and_accounting():
    with pytest.raises(SpecError):
        PassiveOLU(spec(omega=1.5))
    e = PassiveOLU(spec())
    acct = accounting_from_params(e.accounting_params())
    assert acct.accounting == "per_update" and e.accounting == "per_update"
    # the ledger allows the window bound (<= rho) and does not add it up
    X, y = worst_stream()
    e = PassiveOLU(spec(), SeededNoise(0))
    e.learn(X, y)
    from app.privacy.ledger import LedgerState
    state = LedgerState()
    for u in (1, 2, 3):
        (c,) = e.forget([u])
        state, charge = acct.spend(state, certified_rho=c.rho, index=None)
        assert state.rho_spent == pytest.approx(RHO)
    b = PassiveOLU.from_state(spec(), e.state())
    assert (b.group_u, b.group_rel) == (e.group_u, e.group_rel)
    assert math.isfinite(b.group_noise(4, e.t, 0.07)[0])


def test_group_allocation_over_http(server, tenant):
    """Served end to end: receipts verify and state the window bound, the ledger keeps the current one (per_update)."""
    from .helpers import create_model, examples, unit_rows, verify_receipt
    _, c = tenant
    mid = create_model(c, dim=3, hyperparameters={"allocation": "group"}, l2=0.05)["id"]
    X = unit_rows(30, 3, seed=4)
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)}).status_code == 200
    for ids in (["rec-3", "rec-29"], ["rec-7"]):
        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids})
        assert r.status_code == 200, r.text
        keys = c.get("/v1/keys").json()["keys"]
        assert all(verify_receipt(x, keys) for x in r.json()["receipts"])
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert ledger["accounting"] == "per_update" and len(ledger["entries"]) == 3
    assert 0.0 < ledger["rho_spent"] <= ledger["entries"][0]["rho"] * (1 + 1e-12)


def test_group_noise_out_of_float_range_restarts_instead():
    from app.unlearning.contract.errors import CapacityExhausted
    e = PassiveOLU(spec(), SeededNoise(0))
    e.group_precheck(10)  # in range
    with pytest.raises(CapacityExhausted):
        e.group_precheck(10**200)
    X, y = worst_stream()
    e.learn(X, y)
    e.group_precheck = lambda k: (_ for _ in ()).throw(CapacityExhausted("out of range"))
    certs = e.forget([3, 4])  # refused before anything changed: one exact restart for the whole request
    assert [c.mechanism for c in certs] == ["exact", "exact"] and certs[0].details["restart"] == 1.0


@pytest.mark.parametrize("seed", range(3))
def test_the_chain_holds_in_any_forget_order(seed):
    """docs/passive_group_allocation.md §2 step 2 (issue 37 item 7): the chain of runs must go through the forgotten
    records in increasing learning step -- a link whose runs both skip a later-learned record's step would contract
    less than its a_j counts.  Since S is a sum of per-record terms, the proof may always take that order, whatever
    order the forgets came in; the engine sums each member's own a_v (it sorts nothing).  Checked with contraction
    (l2 > 0, so Gamma < 1): forgetting in decreasing step order certifies the same S and window bound as increasing
    order, and the coupled replay stays within it."""
    X, y = worst_stream()
    s = spec(l2=0.05)
    up, down = [3, 7, 11, 15, 19], [19, 15, 11, 7, 3]
    shifts = {}
    for order in (up, down):
        e = PassiveOLU(s, SeededNoise(seed))
        e.learn(X, y)
        certs = e.forget(order)
        shifts[tuple(order)] = certs[-1].details["group_shift"]
        assert certs[-1].details["Gamma"] < 1.0 or order[-1] == 19
    assert shifts[tuple(down)] == pytest.approx(shifts[tuple(up)], rel=1e-12)
    (realized, bound), = windows(PassiveOLU, s, X, y, {20: down}, seed)
    assert bound <= RHO * (1 + 1e-12) and realized <= bound * (1 + 1e-9), (realized, bound)
