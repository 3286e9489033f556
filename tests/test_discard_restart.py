"""Discard-and-restart baseline (digest §2.9): exact forgetting by re-initialisation, coupled replay, regret."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.unlearning import ALGORITHMS
from app.unlearning.contract.errors import ForgetError, SpecError
from app.unlearning.families.discard import DiscardAndRestart
from app.unlearning.maths.losses import augment
from app.unlearning.mechanism.noise import SeededNoise
from app.unlearning.verification.replay import coupled_replay
from tests.olu_streams import mixed_stream, spec
from tests.test_restart import any_schedule

from .helpers import create_model, examples, unit_rows, verify_receipt


def dspec(schedule="strongly_convex_capped", **kw):
    kw.setdefault("algorithm", "discard_and_restart")
    if schedule == "regularized_convex":
        kw.setdefault("horizon", 400)
        kw.setdefault("max_deletions", 5)
    if schedule in ("convex_constant", "adaptive", "regularized_convex"):
        kw.setdefault("l2", 0.0)
    return spec(schedule, **kw)


SCHEDULES = ["strongly_convex_capped", "strongly_convex", "convex_constant", "regularized_convex", "adaptive"]


def test_registered_and_hyperparameters():
    assert ALGORITHMS["discard_and_restart"] is DiscardAndRestart
    hp = DiscardAndRestart.normalize_hyperparameters(dspec())
    assert hp == {"schedule": "strongly_convex_capped"}  # no noise allocation: nothing to calibrate
    for bad in ({"allocation": "uniform", "max_deletions": 2}, {"omega": 1.5}):
        with pytest.raises(SpecError):
            DiscardAndRestart(dspec(**bad))
    with pytest.raises(SpecError):
        DiscardAndRestart(dspec("regularized_convex", horizon=None))
    e = DiscardAndRestart(dspec())
    assert e.accounting_params() is None
    assert e.ledger()["rho_spent"] == 0.0 and e.ledger()["rho_budget"] is None


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_state_after_forget_is_independent_of_earlier_data(schedule):
    """Two streams that differ in *every* example before the deletion publish identical parameters after it,
    equal bit for bit to a fresh model that only ever saw the post-deletion examples."""
    rng = np.random.default_rng(7)
    Xa, ya = mixed_stream(rng, 60)
    Xb, yb = mixed_stream(rng, 60)
    Xc, yc = mixed_stream(rng, 40)
    s = dspec(schedule)
    a, b, fresh = DiscardAndRestart(s, SeededNoise(1)), DiscardAndRestart(s, SeededNoise(2)), DiscardAndRestart(s)
    a.learn(Xa, ya)
    b.learn(Xb, 1.0 - yb)
    assert not np.array_equal(a.published(), b.published())
    (ca,) = a.forget([17])
    (cb,) = b.forget([60])
    for c in (ca, cb):
        assert (c.mechanism, c.sigma, c.sensitivity, c.rho, c.details["restart"]) == ("exact", 0.0, 0.0, 0.0, 1.0)
        assert c.forgotten_step == 60 and c.deletion_index == 1
    assert np.array_equal(a.published(), np.zeros(4)) and np.array_equal(b.published(), np.zeros(4))
    for e in (a, b, fresh):
        steps = e.learn(Xc, yc)
    assert steps[0] == 1  # the fresh model's global clock; the restarted ones keep counting
    assert np.array_equal(a.published(), b.published())
    assert np.array_equal(a.published(), fresh.published())
    assert a.step == 100 and a.ledger()["epoch"] == 1 and a.ledger()["epoch_start"] == 60


def test_pre_epoch_forget_changes_nothing_and_batches_share_one_restart():
    X, y = mixed_stream(np.random.default_rng(3), 50)
    e = DiscardAndRestart(dspec())
    e.learn(X[:20], y[:20])
    c = e.forget([3, 9, 20])
    assert [x.details["restart"] for x in c] == [1.0, 0.0, 0.0] and [x.deletion_index for x in c] == [1, 2, 3]
    e.learn(X[20:], y[20:])
    before = e.published()
    (c,) = e.forget([5])  # learned before the restart at 20: no influence left
    assert c.mechanism == "exact" and c.details["restart"] == 0.0 and np.array_equal(before, e.published())
    (c,) = e.forget([21])
    assert c.details["restart"] == 1.0 and e.ledger()["epoch"] == 2 and e.ledger()["deletions"] == 5
    with pytest.raises(ForgetError):
        e.forget([51])


def test_state_round_trip():
    s = dspec("adaptive", capped=True)
    X, y = mixed_stream(np.random.default_rng(4), 80)
    a = DiscardAndRestart(s)
    a.learn(X[:30], y[:30])
    a.forget([4])
    a.learn(X[30:50], y[30:50])
    b = DiscardAndRestart.from_state(s, a.state())
    for e in (a, b):
        e.learn(X[50:], y[50:])
        e.forget([49, 2])
    for k, v in a.state().items():
        assert np.array_equal(np.asarray(v), np.asarray(b.state()[k])), k


class KeepsTheState(DiscardAndRestart):
    """Negative control: a 'restart' that resets the clock and the counters but keeps the iterate."""

    def restart(self):
        theta = self.theta
        super().restart()
        self.theta = theta


@pytest.mark.parametrize("schedule", SCHEDULES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_coupled_replay_is_exact(schedule, data):
    """Against the reference run on the masked stream (same public restarts), the published parameters agree
    exactly at every deletion; the control that keeps the iterate is caught."""
    T = data.draw(st.integers(10, 80), label="T")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    X, y = mixed_stream(np.random.default_rng(seed), T)
    deletions = data.draw(any_schedule(T), label="deletions")
    s = dspec(schedule)
    points = coupled_replay(lambda noise: DiscardAndRestart(s, noise), X, y, deletions, seed=seed)
    assert all(p.distance == 0.0 and p.certified == 0.0 and p.realized == 0.0 for p in points), points


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_replay_catches_a_restart_that_keeps_the_iterate(schedule):
    X, y = mixed_stream(np.random.default_rng(12), 60)
    deletions = {30: [10], 45: [40, 3]}
    s = dspec(schedule)
    good = coupled_replay(lambda noise: DiscardAndRestart(s, noise), X, y, deletions)
    assert [p.distance for p in good] == [0.0, 0.0]
    bad = coupled_replay(lambda noise: KeepsTheState(s, noise), X, y, deletions)
    # the reference never learned the record, so a kept iterate differs: an infinite divergence at zero noise
    assert bad[0].distance > 0.0 and math.isinf(bad[0].ratio)


def _stream(T: int, seed: int = 0):
    """A stationary logistic stream (d = 3, ||x|| <= 2) with a fixed separating direction."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, 3))
    X *= 2.0 / np.maximum(2.0, np.linalg.norm(X, axis=1, keepdims=True))
    w = np.array([1.5, -1.0, 0.5])
    y = (rng.uniform(size=T) < 1.0 / (1.0 + np.exp(-X @ w))).astype(float)
    return X, y


def _online_loss(e: DiscardAndRestart, X, y, taus) -> float:
    """Sum of f_t(z_t) (the loss of the model published before each example), forgetting the oldest record
    of the current epoch after each tau in ``taus``."""
    total = 0.0
    Xa = augment(X)
    for t in range(len(y)):
        total += float(e.loss.losses(e.published(), Xa[t : t + 1], y[t : t + 1])[0])
        e.learn(X[t : t + 1], y[t : t + 1])
        if t + 1 in taus:
            e.forget([e.step])
    return total


def test_regret_grows_with_the_number_of_restarts():
    """Every restart throws the learned model away: the online loss grows with k, and at fixed k the average
    excess over the no-deletion run shrinks as T grows (O(k log T) / T for strongly convex losses)."""
    s = dspec(l2=0.01)
    excess = {}
    for T in (500, 4000):
        X, y = _stream(T)
        base = _online_loss(DiscardAndRestart(s), X, y, set())
        for k in (1, 10):
            taus = {int(T * (j + 1) / (k + 1)) for j in range(k)}
            excess[T, k] = _online_loss(DiscardAndRestart(s), X, y, taus) - base
    assert excess[500, 1] > 0 and excess[4000, 1] > 0
    assert excess[500, 10] > 2 * excess[500, 1] and excess[4000, 10] > 2 * excess[4000, 1]
    for k in (1, 10):
        assert excess[4000, k] / 4000 < excess[500, k] / 500


# ---- over HTTP ---------------------------------------------------------------------------------------------------
def test_discard_and_restart_over_http(server, tenant):
    _, c = tenant
    algos = {a["name"]: a for a in c.get("/v1/algorithms").json()["items"]}
    assert algos["discard_and_restart"]["guarantee"]["definition"].startswith("exact")
    model = create_model(c, dim=3, algorithm="discard_and_restart")
    mid = model["id"]
    assert model["hyperparameters"] == {"schedule": "strongly_convex_capped"}
    X = unit_rows(30, 3, seed=4)
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)}).status_code == 200
    assert any(c.get(f"/v1/models/{mid}/parameters").json()["weights"])
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-3", "rec-29"]})
    assert r.status_code == 200, r.text
    keys = c.get("/v1/keys").json()["keys"]
    receipts = r.json()["receipts"]
    for receipt, restart in zip(receipts, (True, False)):  # one restart forgets both; its receipt says so
        assert verify_receipt(receipt, keys) and receipt["algorithm"] == "discard_and_restart"
        assert receipt["mechanism"] == {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0,
                                        **({"restart": True} if restart else {})}
        assert receipt["ledger_after"]["rho_spent"] == 0.0 and receipt["guarantee"]["epsilon"] == 0.0
    params = c.get(f"/v1/models/{mid}/parameters").json()
    assert not any(params["weights"]) and params["bias"] == 0.0  # everything learned was discarded
    assert c.post(f"/v1/models/{mid}/predict", json={"x": X[:2].tolist()}).status_code == 200
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert [e["kind"] for e in ledger["entries"]] == ["restart", "deletion"]
    assert ledger["rho_spent"] == 0.0 and ledger["epsilon"] == 0.0
    m = c.get(f"/v1/models/{mid}").json()
    assert m["n_forgotten"] == 2 and m["step"] == 30 and m["epoch"] == 2
    rt = c.post(f"/v1/models/{mid}/retrain")
    assert rt.status_code == 409 and rt.json()["type"].endswith("/retrain-not-supported")
    r = c.post(f"/v1/models", json={"name": "x", "algorithm": "discard_and_restart", "loss": "logistic", "dim": 2,
                                    "bounds": {"x_norm": 1.0}, "domain_radius": 1.0, "l2": 0.1,
                                    "privacy": {"epsilon": 1.0, "delta": 1e-6},
                                    "hyperparameters": {"allocation": "uniform"}})
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid-model-spec")
