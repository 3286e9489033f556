"""Every signed figure right (issue 37 item 7): a receipt states the privacy figures its model's ledger states.

- group allocation (passive_olu ``allocation: "group"``, and passive_olu_restart with it): the ledger keeps the
  current window's bound (``per_update``); the receipts added the windows up (2 rho, 3 rho, ... and epsilon 1.45,
  1.81, ... inside one 4-record request) -- now each states its own window, as the ledger does;
- additive budgets (the omega series) still sum, and the last receipt equals the ledger;
- an exact receipt states delta = 0 with no conversion (it carried delta = 1e-6 and a cks20 conversion for rho = 0);
and the receipts still verify offline."""
from __future__ import annotations

import math

import pytest

from app.receipts.verify import verify_bundle

from .helpers import create_model, examples, unit_rows


def _forget_in_requests(c, mid: str, groups: list[list[int]]) -> list[dict]:
    out = []
    for ids in groups:
        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"rec-{i}" for i in ids]})
        assert r.status_code == 200, r.text
        out += r.json()["receipts"]
    return out


@pytest.mark.parametrize("algorithm,hp", [("passive_olu", {"allocation": "group"}),
                                          ("passive_olu_restart", {"allocation": "group", "max_deletions": 4,
                                                                  "schedule": "strongly_convex"})])
def test_group_allocation_receipts_state_each_window_as_the_ledger(tenant, algorithm, hp):
    _, c = tenant
    r = c.post("/v1/models", json={"name": "g", "algorithm": algorithm, "loss": "logistic", "dim": 4,
                                   "bounds": {"x_norm": 1.0}, "domain_radius": 10.0, "l2": 0.05,
                                   "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": hp})
    if r.status_code == 422:
        pytest.skip(f"{algorithm} refuses {hp}: {r.json()['detail']}")
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(300, 4))}).status_code == 200
    # late records: passive_olu_restart restarts (exactly) on a record learned early in the epoch
    receipts = _forget_in_requests(c, mid, [[280, 283, 286], [292]])
    noised = [x for x in receipts if x["mechanism"]["type"] == "discrete_gaussian"]
    assert noised, [x["mechanism"]["type"] for x in receipts]
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert ledger["accounting"] == "per_update"
    rho = ledger["details"].get("rho", None) or max(x["mechanism"]["rho"] for x in noised)
    for x in noised:  # each window's bound, never a sum: at most the model's rho, epsilon at most its target
        assert x["ledger_after"]["rho_spent"] == x["mechanism"]["rho"], x["ledger_after"]
        assert x["ledger_after"]["rho_spent"] <= rho * (1 + 1e-12)
        assert x["ledger_after"]["epsilon"] <= 1.0 + 1e-9 and x["guarantee"]["epsilon"] == x["ledger_after"]["epsilon"]
    last = receipts[-1]["ledger_after"]
    assert last["rho_spent"] == ledger["rho_spent"] and math.isclose(last["epsilon"], ledger["epsilon"], rel_tol=1e-12)
    bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
    assert verify_bundle(bundle, c.get("/v1/keys").json()).ok


def test_additive_budgets_still_sum_and_end_on_the_ledger(tenant):
    _, c = tenant
    mid = create_model(c)["id"]  # passive_olu, omega series
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(30, 4))}).status_code == 200
    receipts = _forget_in_requests(c, mid, [[1, 2, 3], [4]])
    spent = [x["ledger_after"]["rho_spent"] for x in receipts]
    assert all(b > a for a, b in zip(spent, spent[1:]))
    assert math.isclose(spent[-1], sum(x["mechanism"]["rho"] for x in receipts), rel_tol=1e-9)
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert math.isclose(spent[-1], ledger["rho_spent"], rel_tol=1e-12)
    assert all(x["guarantee"]["delta"] == 1e-6 and x["guarantee"]["conversion"] == "cks20" for x in receipts)


@pytest.mark.parametrize("algorithm,hp", [("retrain", {}), ("sisa", {}), ("exact_ridge", {"deletion_features": "retained"})])
def test_exact_receipts_state_delta_zero_without_conversion(tenant, algorithm, hp):
    _, c = tenant
    loss = {"exact_ridge": "squared"}.get(algorithm, "logistic")
    mid = create_model(c, algorithm=algorithm, loss=loss, hyperparameters=hp)["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(12, 4))}).status_code == 200
    receipts = _forget_in_requests(c, mid, [[2, 4]])
    for x in receipts:
        assert x["mechanism"]["type"] == "exact" and x["mechanism"]["rho"] == 0.0
        assert (x["guarantee"]["epsilon"], x["guarantee"]["delta"], x["guarantee"]["conversion"]) == (0.0, 0.0, "none")
        assert (x["ledger_after"]["rho_spent"], x["ledger_after"]["epsilon"], x["ledger_after"]["delta"]) == (0, 0, 0)
    bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
    assert verify_bundle(bundle, c.get("/v1/keys").json()).ok


def test_a_restart_receipt_is_exact_and_the_noisy_ones_keep_their_delta(tenant):
    _, c = tenant
    # passive_olu_restart restarts on a record its schedule does not cover: the first steps of the epoch
    r = c.post("/v1/models", json={"name": "r", "algorithm": "passive_olu_restart", "loss": "logistic", "dim": 4,
                                   "bounds": {"x_norm": 1.0}, "domain_radius": 10.0, "l2": 0.05,
                                   "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {"max_deletions": 10, "schedule": "strongly_convex"}})
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    learned = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(30, 4))}).json()
    span = learned.get("restart_on_forget")
    if span is None:
        pytest.skip("this schedule restarts on no learned step")
    receipts = _forget_in_requests(c, mid, [[span["first_step"] - 1]])
    assert receipts[0]["mechanism"].get("restart") is True
    g = receipts[0]["guarantee"]
    assert (g["epsilon"], g["delta"], g["conversion"]) == (0.0, 0.0, "none")
