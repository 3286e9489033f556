"""Passive OLU engine: coupled replay against retraining (ARCHITECTURE.md §5), with a negative control."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.db.state_codec import pack_state, unpack_state
from app.unlearning import InputError, ModelSpec, SeededNoise, SpecError
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.verification.replay import coupled_replay
from app.unlearning.maths.schedules import CappedStronglyConvex

TOL = 1e-9


def spec(loss="logistic", d=2, x_norm=1.0, y_abs=1.0, R=10.0, l2=0.05, rho=0.0175, **hp) -> ModelSpec:
    return ModelSpec("passive_olu", loss, d, x_norm, y_abs, R, l2, 1.0, 1e-6, rho, hp)


class UnderNoised(PassiveOLU):
    """Negative control: one tenth of the certified noise, while still claiming the rho of the full noise."""

    def noise_multiplier(self, i: int) -> float:
        return super().noise_multiplier(i) / 10.0

    def forget(self, steps, retained=None):
        return [replace(c, rho=c.rho / 100.0) for c in super().forget(steps, retained)]


@st.composite
def streams(draw):
    loss = draw(st.sampled_from(["logistic", "squared", "huber"]))
    d = draw(st.integers(1, 5))
    T = draw(st.integers(2, 60))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, d))
    X *= draw(st.floats(0.2, 1.0)) / np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(T) < 0.5).astype(float) if loss == "logistic" else rng.uniform(-1, 1, T)
    # deletion schedule: events at increasing tau, each forgetting not-yet-forgotten steps <= tau
    order = list(rng.permutation(np.arange(1, T + 1)))
    if draw(st.booleans()):
        order.remove(1)
        order.insert(0, 1)  # the record learned at step 1 is among the first forgotten
    n_del = draw(st.integers(1, min(T, 8)))
    deletions: dict[int, list[int]] = {}
    for u in order[:n_del]:
        tau = draw(st.integers(int(u), T))
        deletions.setdefault(tau, []).append(int(u))
    return spec(loss, d, R=draw(st.sampled_from([0.5, 2.0, 50.0])), l2=draw(st.sampled_from([0.01, 0.1, 1.0])),
                rho=draw(st.sampled_from([0.01, 0.5, 5.0]))), X, y, deletions, seed


@given(streams())
def test_coupled_replay_never_exceeds_certificate(case):
    sp, X, y, deletions, seed = case
    points = coupled_replay(lambda n: PassiveOLU(sp, n), X, y, deletions, seed=seed)
    assert len(points) == len(deletions)
    for p in points:
        assert p.realized <= p.certified * (1 + TOL) + 1e-300, p
        assert p.distance <= p.shift_bound * (1 + TOL) + 1e-12, p  # m <= sum of certified shifts
        assert p.certified < sp.rho  # omega-series: the budget is never exceeded


def worst_case_stream(T=200, d=2):
    """Near-worst case: balanced, separable classes at the norm bound, so the scores saturate (curvature small
    and the true contraction close to the certified 1 - eta mu); the forgotten records are mislabelled at the
    norm bound (residual ~ -1, gradient ~ L); the domain is large enough that the noise is rarely projected."""
    X = np.zeros((T, d))
    X[:, 0] = np.where(np.arange(T) % 2 == 0, 1.0, -1.0)
    y = (X[:, 0] > 0).astype(float)
    for u in (150, 190, 197):  # adversarial records: x = -e1 with label 1
        X[u - 1, 0], y[u - 1] = -1.0, 1.0
    return X, y


def test_replay_is_tight_on_the_worst_case_and_fails_when_under_noised():
    sp = spec("logistic", d=2, R=5.0, l2=0.01, rho=2.0)
    X, y = worst_case_stream()
    deletions = {195: [190], 198: [197], 200: [150]}
    good = coupled_replay(lambda n: PassiveOLU(sp, n), X, y, deletions, seed=7)
    ratios = [p.ratio for p in good]
    assert max(ratios) <= 1 + TOL
    assert max(ratios) > 0.3, ratios  # the bound is nearly attained: this harness can fail
    bad = coupled_replay(lambda n: UnderNoised(sp, n), X, y, deletions, seed=7)
    assert max(p.ratio for p in bad) > 1.0, [p.ratio for p in bad]


def test_forgetting_the_record_learned_at_step_one():
    sp = spec("logistic", d=3, R=50.0, l2=0.01, rho=1.0)  # the step-1 noise is large: keep it unprojected
    X = np.tile([[1.0, 0.0, 0.0]], (30, 1))
    X[0] = [-1.0, 0.0, 0.0]
    y = np.ones(30)
    for deletions in ({1: [1]}, {30: [1]}, {1: [1], 30: [2, 30]}):
        pts = coupled_replay(lambda n: PassiveOLU(sp, n), X, y, deletions, seed=3)
        assert all(p.realized <= p.certified * (1 + TOL) for p in pts)
    immediate = coupled_replay(lambda n: PassiveOLU(sp, n), X, y, {1: [1]}, seed=3)[0]
    assert immediate.ratio > 0.1  # at theta = 0 the residual is 1/2: the ratio is ~ (X~ / 2L)^2 ~ 0.14
    bad = coupled_replay(lambda n: UnderNoised(sp, n), X, y, {1: [1]}, seed=3)[0]
    assert bad.ratio > 1


@given(st.floats(1e-3, 10), st.floats(0, 100), st.integers(1, 300), st.integers(0, 300))
def test_closed_form_contraction_product_matches_the_steps(mu, extra, u, gap):
    sched = CappedStronglyConvex(mu, mu + extra)
    tau = u + gap
    direct = sum(math.log(sched.gamma(r)) for r in range(u + 1, tau + 1)) if sched.capped_gamma > 0 or u >= sched.t0 \
        else None
    closed = sched.log_gamma_sum(u, tau)
    if direct is not None:
        assert closed == pytest.approx(direct, rel=1e-9, abs=1e-9)
    for r in range(u + 1, tau + 1):  # every step is a contraction: every record is deletable
        assert 0 <= sched.gamma(r) <= 1
        assert sched.eta(r) <= 2 / (sched.beta + sched.mu) + 1e-15


def test_gradients_never_exceed_the_public_lipschitz_constant():
    rng = np.random.default_rng(0)
    for loss in ("logistic", "squared", "huber"):
        e = PassiveOLU(spec(loss, d=4, R=3.0, l2=0.2))
        for _ in range(200):
            theta = rng.normal(size=5)
            theta *= rng.uniform(0, 3.0) / np.linalg.norm(theta)
            x = rng.normal(size=4)
            x /= np.linalg.norm(x)
            yv = 1.0 if loss == "logistic" else rng.choice([-1.0, 1.0])
            g = e.loss.grad(theta, np.append(x, 1.0), yv)
            assert np.linalg.norm(g) <= e.L * (1 + 1e-12)


def test_state_round_trip_is_exact_and_resumes_identically():
    sp = spec("squared", d=3, R=5.0)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = rng.uniform(-1, 1, 40)
    a = PassiveOLU(sp, SeededNoise(5))
    a.learn(X[:20], y[:20])
    a.forget([3, 7])
    blob = pack_state(a.state())
    b = PassiveOLU.from_state(sp, unpack_state(blob), SeededNoise(99))
    assert pack_state(b.state()) == blob
    b.noise = a.noise  # continue with the same noise stream
    a.learn(X[20:], y[20:])
    b.learn(X[20:], y[20:])
    assert np.array_equal(a.published(), b.published())
    assert a.forget([25])[0] == b.forget([25])[0]


def test_omega_series_budget_holds_for_many_deletions():
    sp = spec("logistic", d=2, rho=0.0175)
    e = PassiveOLU(sp, SeededNoise(0))
    X = np.tile([[0.5, 0.5]], (2000, 1))
    e.learn(X, np.ones(2000))
    certs = e.forget(list(range(1, 2001)))
    total = sum(c.rho for c in certs)
    assert total < sp.rho and e.ledger()["rho_spent"] == pytest.approx(total)
    assert [c.deletion_index for c in certs] == list(range(1, 2001))
    assert all(c.rho == pytest.approx(sp.rho * 0.2 / (1.2 * c.deletion_index**1.2)) for c in certs[:50])


def test_inputs_outside_the_bounds_never_reach_the_state():
    e = PassiveOLU(spec("squared", d=2, x_norm=1.0, y_abs=2.0))
    with pytest.raises(InputError):
        e.validate_examples([[1.0, 0.1]], [0.0])
    with pytest.raises(InputError):
        e.validate_examples([[0.1, 0.1]], [2.5])
    with pytest.raises(InputError):
        e.validate_examples([[np.nan, 0.1]], [0.0])
    with pytest.raises(InputError):
        e.validate_examples([[0.1, 0.1, 0.1]], [0.0])
    X, _ = e.validate_examples([[1.0 + 1e-12, 0.0]], [2.0])  # client round-off is tolerated (constants inflated)
    assert X.shape == (1, 2)
    with pytest.raises(SpecError):
        PassiveOLU(spec(l2=0.0))
