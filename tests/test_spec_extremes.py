"""No spec ends in a 500 (issue 29, item 6): extreme values in every numeric field of every family's spec.

The spec-space walk (tests/test_spec_space.py) draws whole specs; this test takes a served spec of each family and
variant and puts one extreme number (1e-320, 1e308, a huge xi, a huge horizon, ...) into one numeric field: every
numeric hyperparameter the family fills in (its defaults, the budget's limits) or takes, and the spec's own numbers.
Creation goes through the whole path (schema, the family's checks, the calibration, the work and memory estimate):
the answer is 201, or a 422 that names a field, never a 500.  The issue's case: descent_to_delete regularized_weak
with xi 76.6, 122.5 or 1e300 overflowed ``i ** (2 xi)`` in the work estimate (OverflowError, 500).
"""
from __future__ import annotations

import secrets
import sys

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import Settings
from app.main import create_app
from app.unlearning import ALGORITHMS

from .test_spec_space import examples_inside, forget_each, learn_all, names_a_field

BASE = {"name": "x", "loss": "logistic", "dim": 3, "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0,
        "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}}
# served specs of every family and variant (their filled-in hyperparameters are the fields varied)
VARIANTS = {
    "passive_olu": [{}, {"schedule": "regularized_convex", "horizon": 1000, "max_deletions": 3},
                    {"schedule": "adaptive"}, {"schedule": "convex_constant"}],
    "passive_olu_restart": [{"max_deletions": 3, "horizon": 1000}],
    "discard_and_restart": [{}],
    "active_olu": [{"variant": "single"}, {"variant": "two_phase"}],
    "descent_to_delete": [{"variant": v} for v in ("secret", "perfect", "regularized_strong", "distributed")]
    + [{"variant": "regularized_weak", "retrain_when_cheaper": True}],
    "rewind_to_delete": [{"initial_size": 3, "T": 20}, {"variant": "descend", "regime": "strongly_convex",
                                                        "initial_size": 3, "T": 20}],
    "memory_pair": [{"capacity": 3}, {"capacity": 3, "step": "adagrad"}],
    "retrain": [{}],
    "sisa": [{}],
    "second_order_olu": [{}, {"solver": "cg"}],
    "online_dp_tree": [{"horizon": 1000, "max_deletions": 3}, {"horizon": 1000, "max_deletions": 3,
                                                               "group_privacy": "gaussian_group"}],
    "exact_ridge": [{}, {"deletion_features": "retained"}],
}
# the loss a family is created with where it does not serve BASE's (exact_ridge: least squares only)
LOSS = {"exact_ridge": "squared"}


def _base(algorithm: str) -> dict:
    return {**BASE, "loss": LOSS.get(algorithm, BASE["loss"]), "algorithm": algorithm}
# keys a family takes but does not fill in (so they are not in the answer's hyperparameters)
EXTRA_KEYS = {"online_dp_tree": ("lambda",), "descent_to_delete": ("regularization", "beta"),
              "passive_olu": ("eta", "p0", "omega", "c"), "active_olu": ("omega",), "second_order_olu": ("omega",),
              "memory_pair": ("gamma", "delta_b"), "rewind_to_delete": ("sigma_target", "eta")}
SPEC_FIELDS = ("bounds.x_norm", "bounds.y_abs", "domain_radius", "l2", "privacy.epsilon", "privacy.delta", "dim")
FLOATS = [5e-324, 1e-320, sys.float_info.min, 1e-300, 1e-150, 1e-9, 0.5, 76.6, 122.46, 1e4, 1e150, 1e300, 1e308,
          sys.float_info.max]
INTS = [0, 1, 2, 7, 10**6, 10**9, 2**31, 10**12, 2**53 + 1, 10**15, 2**62, 2**63, 10**18, 10**30]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    token = "extremes-admin-" + secrets.token_hex(16)
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("extremes"), admin_token=token, rate_limit=0,
                              log_level="WARNING"))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/tenants", json={"name": "extremes"}, headers={"authorization": f"Bearer {token}"})
        c.headers["authorization"] = f"Bearer {r.json()['api_key']}"
        yield c


_FILLED: dict[tuple[str, int], dict] = {}


def _served(client, algorithm: str, i: int) -> dict:
    """The hyperparameters the service fills in for the served variant i of the family (created once)."""
    key = (algorithm, i)
    if key not in _FILLED:
        r = client.post("/v1/models", json={**_base(algorithm), "hyperparameters": VARIANTS[algorithm][i]})
        assert r.status_code == 201, r.text
        _FILLED[key] = r.json()["hyperparameters"]
    return _FILLED[key]


def _set(body: dict, path: str, value) -> dict:
    out = {**body, "bounds": dict(body["bounds"]), "privacy": dict(body["privacy"]),
           "hyperparameters": dict(body["hyperparameters"])}
    node = out
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    return out


@settings(max_examples=max(40, settings().max_examples), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), data=st.data())
def test_extreme_numbers_in_any_field_are_201_or_a_422_naming_a_field(client, algorithm, data):
    i = data.draw(st.integers(0, len(VARIANTS[algorithm]) - 1), label="variant")
    filled = _served(client, algorithm, i)
    numeric = [f"hyperparameters.{k}" for k, v in filled.items() if isinstance(v, (int, float))
               and not isinstance(v, bool)]
    numeric += [f"hyperparameters.{k}" for k in EXTRA_KEYS.get(algorithm, ()) if k not in filled]
    path = data.draw(st.sampled_from(sorted(set(numeric)) + list(SPEC_FIELDS)), label="field")
    value = data.draw(st.one_of(st.sampled_from(FLOATS), st.sampled_from(INTS)), label="value")
    # the variant as the client gave it (the filled-in limits are varied one at a time, the rest left to defaults)
    body = {**_base(algorithm), "hyperparameters": dict(VARIANTS[algorithm][i])}
    if path.startswith("hyperparameters.") and path.split(".", 1)[1] not in body["hyperparameters"]:
        body["hyperparameters"][path.split(".", 1)[1]] = filled.get(path.split(".", 1)[1])
    body = _set(body, path, value)
    r = client.post("/v1/models", json=body)
    assert r.status_code in (201, 422), (body, r.status_code, r.text)
    if r.status_code == 422:
        assert names_a_field(r.json()), (body, r.text)


@pytest.mark.parametrize("cheaper", [True, False])
@pytest.mark.parametrize("xi", [76.6, 122.46, 1e300])
def test_issue_29_regularized_weak_huge_xi_is_not_a_500(client, xi, cheaper):
    """The issue's spec: the work estimate computed T_i = i^(2 xi) I as a float power (OverflowError)."""
    body = {"name": "xi", "algorithm": "descent_to_delete", "loss": "squared", "dim": 1,
            "bounds": {"x_norm": 0.0024, "y_abs": 1.0}, "domain_radius": 2, "l2": 12.11,
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "hyperparameters": {"variant": "regularized_weak", "xi": xi, "beta": 1e-100, "retrain_when_cheaper": cheaper,
                                "chunk_size": 7}}
    r = client.post("/v1/models", json=body)
    assert r.status_code in (201, 422), r.text
    if r.status_code == 422:
        assert names_a_field(r.json()), r.text
    else:  # accepted: it learns and forgets every record (later rounds retrain: a round of i^(2 xi) I never runs)
        mid, hp = r.json()["id"], r.json()["hyperparameters"]
        ex = examples_inside(body, 4, 0)
        learn_all(client, mid, hp, ex)
        forget_each(client, mid, body, ex)
