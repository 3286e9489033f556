"""exact_ridge (issue 30): ridge regression and least-squares classification over integer sufficient statistics.

The promise: for any schedule of learns and forgets, in any order, the secret state (the integer sums A and B) and
the published weights equal bit for bit those of a model that learned only the records still held, in another
order; nothing is kept but the sums; the int64 sums cannot overflow (a learn beyond the public record cap is
refused before anything changes); predictions and weights agree with the closed-form ridge solution.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.db.state_codec import pack_state, unpack_state
from app.unlearning import ALGORITHMS, ArrayRetained, ForgetError, ModelSpec, SpecError
from app.unlearning.families.exact_ridge import ExactRidge, RidgeGrid


def spec(dim=3, n_classes=0, x_norm=1.0, y_abs=1.0, l2=0.5, **hp) -> ModelSpec:
    s = ModelSpec("exact_ridge", "squared", dim, x_norm, y_abs, 10.0, l2, 1.0, 1e-6, 0.01747, hp,
                  n_classes=n_classes)
    return s.with_hyperparameters(ExactRidge.normalize_hyperparameters(s))


def data(seed: int, n: int, dim=3, n_classes=0, x_norm=1.0, y_abs=1.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    X *= x_norm / np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (rng.integers(0, n_classes, n).astype(float) if n_classes else rng.uniform(-y_abs, y_abs, n))
    return X, y


def fingerprint(e: ExactRidge) -> tuple[bytes, bytes, bytes]:
    """The secret state's bytes (the two sums, through the service's codec) and the published weights' bytes."""
    st_ = unpack_state(pack_state(e.state()))
    return st_["A"].tobytes(), st_["B"].tobytes(), e.published().tobytes()


def test_registered_and_declares_what_the_service_reads():
    assert ALGORITHMS["exact_ridge"] is ExactRidge
    e = ExactRidge(spec())
    assert e.needs_deletion_features and not e.needs_retained_data and not e.supports_retrain
    r = ExactRidge(spec(deletion_features="retained"))
    assert r.needs_retained_data and not r.needs_deletion_features and r.supports_retrain
    assert ExactRidge.keeps_records(r.spec) and not ExactRidge.keeps_records(e.spec)
    assert e.ledger()["rho_spent"] == 0.0 and e.accounting_params() is None


@settings(deadline=None, max_examples=30)
@given(seed=st.integers(0, 10_000), K=st.sampled_from([0, 2, 3]), bits=st.integers(4, 24),
       dim=st.integers(1, 5), data_=st.data())
def test_any_schedule_equals_learning_only_the_records_held_in_another_order(seed, K, bits, dim, data_):
    T = data_.draw(st.integers(1, 40))
    X, y = data(seed, T, dim, K)
    s = spec(dim, K, grid_bits=bits)
    e = ExactRidge(s)
    held: dict[int, int] = {}  # step -> row of X
    t = 0
    for tau in sorted(data_.draw(st.sets(st.integers(1, T), min_size=1, max_size=6))):
        steps = e.learn(X[t:tau], y[t:tau])
        held.update({int(u): i for u, i in zip(steps, range(t, tau))})
        t = tau
        if data_.draw(st.booleans()):  # the state goes through the service's codec between requests
            e = ExactRidge.from_state(s, unpack_state(pack_state(e.state())))
        live = sorted(held)
        k = data_.draw(st.integers(0, min(4, len(live))))
        victims = data_.draw(st.permutations(live))[:k]
        rows = [held[u] for u in victims]
        certs = e.forget(victims, ArrayRetained(victims, X[rows].reshape(k, dim), y[rows]))
        assert [c.learned_step for c in certs] == victims
        assert all(c.mechanism == "exact" and c.sigma == c.rho == c.sensitivity == 0.0 for c in certs)
        for u in victims:
            del held[u]
        # the reference learned only the records held, in another order (shuffled, in several batches)
        ref = ExactRidge(s)
        order = data_.draw(st.permutations(sorted(held.values())))
        cut = data_.draw(st.integers(0, len(order)))
        for part in (order[:cut], order[cut:]):
            ref.learn(X[part].reshape(len(part), dim), y[part])
        assert fingerprint(e) == fingerprint(ref)
        assert e.records_held() == len(held)


def test_forgetting_everything_gives_the_state_of_a_model_that_learned_nothing():
    s = spec(4, 3)
    X, y = data(3, 50, 4, 3)
    e = ExactRidge(s)
    e.learn(X, y)
    e.forget(list(range(1, 51)), ArrayRetained(range(1, 51), X, y))
    assert not e.A.any() and not e.B.any() and not e.published().any()
    assert fingerprint(e) == fingerprint(ExactRidge(s))


def test_a_different_record_resent_leaves_a_different_state():
    """Negative control: the equality above is not vacuous -- forgetting a record that differs in one feature by a
    grid step (what the service's check code refuses, tests/test_api_families.py) leaves another state."""
    s = spec(3)
    X, y = data(5, 20)
    e = ExactRidge(s)
    e.learn(X, y)
    wrong = X[4:5].copy()
    wrong[0, 0] += math.ldexp(1.0, -e.grid.kx)  # one grid step
    e.forget([5], ArrayRetained([5], wrong, y[4:5]))
    ref = ExactRidge(s)
    ref.learn(np.delete(X, 4, axis=0), np.delete(y, 4))
    assert fingerprint(e) != fingerprint(ref)


@pytest.mark.parametrize("K", [0, 2, 4])
def test_published_weights_are_the_ridge_solution_on_the_quantised_records(K):
    """W minimises sum ||W x~ - t||^2 + l2 ||W||^2 over the records held (the grid's rounding aside)."""
    s = spec(5, K, l2=0.3)
    X, y = data(7, 300, 5, K)
    e = ExactRidge(s)
    e.learn(X, y)
    Xa = np.hstack([X, np.ones((300, 1))])
    T = (np.where(np.arange(K)[None, :] == y[:, None], 1.0, -1.0) if K else y[:, None])
    W = np.linalg.solve(Xa.T @ Xa + 0.3 * np.eye(6), Xa.T @ T).T
    got = e.published().reshape(K or 1, 6)
    assert np.allclose(got, W, atol=1e-4), np.abs(got - W).max()
    assert ExactRidge.published_shape(s) == ((K, 6) if K else (6,))


def test_classifier_predictions_scores_and_probabilities():
    s = spec(2, 3, l2=0.1)
    rng = np.random.default_rng(0)
    centres = np.array([[0.6, 0.0], [-0.3, 0.5], [-0.3, -0.5]])
    y = rng.integers(0, 3, 600)
    X = centres[y] + 0.1 * rng.normal(size=(600, 2))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    e = ExactRidge(s)
    e.learn(X, y.astype(float))
    pred, P = ExactRidge.predict_published(s, e.loss, e.published(), X)
    assert (pred == y).mean() > 0.95
    assert P.shape == (600, 3) and np.all(P >= 0) and np.allclose(P.sum(axis=1), 1.0)
    assert (np.max(P, axis=1) == P[np.arange(600), pred.astype(int)]).all()  # the predicted class ranks first
    # an input far outside the data: every output may be clipped to 0 -> uniform, never NaN
    _, P0 = ExactRidge.predict_published(s, e.loss, np.zeros(9), np.zeros((1, 2)))
    assert np.allclose(P0, 1 / 3)


def test_a_system_singular_in_floating_point_still_publishes_finite_weights():
    """l2 far below the round-off of A (identical records): LU fails or overflows, the eigendecomposition serves."""
    s = spec(2, l2=1e-300)
    e = ExactRidge(s)
    X = np.tile([[0.6, 0.0]], (8, 1))
    e.learn(X, np.full(8, 0.5))
    w = e.published()
    assert np.all(np.isfinite(w)) and np.allclose(X @ w[:-1] + w[-1], 0.5, atol=1e-3)


def test_regression_predicts_the_value():
    s = spec(3, l2=0.01)
    X, _ = data(2, 400)
    y = np.clip(0.5 * X[:, 0] - 0.2, -1, 1)
    e = ExactRidge(s)
    e.learn(X, y)
    pred, out = ExactRidge.predict_published(s, e.loss, e.published(), X)
    assert np.allclose(pred, y, atol=1e-3) and np.array_equal(pred, out)


def test_the_grid_bounds_every_record_and_the_record_cap_prevents_overflow():
    """|q(x~)|^2 <= P and |q(t) q(x~)_j| <= P for every record inside the bounds (the first at the norm bound),
    chunk * P <= 2^53, and record_cap * P < 2^115 (two words, hi below 2^53)."""
    for dim, bits, x_norm, y_abs in [(1, 20, 1.0, 1.0), (64, 20, 3.7, 1e-3), (200, 24, 1e-9, 1e9), (7, 4, 1e5, 2.0)]:
        s = spec(dim, x_norm=x_norm, y_abs=y_abs, grid_bits=bits)
        g = RidgeGrid(s, bits)
        X, y = data(1, 200, dim, 0, x_norm, y_abs)
        X[0] = 0.0
        X[0, 0] = x_norm * (1 + 1e-9)  # the bound with the input tolerance
        y[0] = y_abs
        Xq, Tq = g.features(X), g.targets(y)
        assert np.array_equal(Xq[:, :-1], np.rint(np.ldexp(X, g.kx)))  # the documented rule, rint(x 2^kx)
        bx = math.sqrt((2.0**bits + 0.5 * math.sqrt(dim)) ** 2 + 4.0 ** (bits - 1))
        per = max(bx * bx, bx * (2.0**bits + 0.5))
        assert (np.sum(Xq * Xq, axis=1) <= bx * bx).all() and (np.abs(Tq) <= 2.0**bits + 0.5).all()
        assert g.per_record >= per and g.chunk * g.per_record <= 2**53
        # the two words hold record_cap records: hi = value / 2^62 stays below 2^53 (exact in float64)
        assert g.record_cap * g.per_record < 2 ** (62 + 53)
        assert np.abs(Xq[0, 0]) >= 2.0 ** (bits - 2)  # the grid uses its bits (not a degenerate scale)


def test_a_learn_beyond_the_record_cap_is_refused_before_anything_changes(monkeypatch):
    s = spec(2)
    e = ExactRidge(s)
    monkeypatch.setattr(e.grid, "record_cap", 5)
    X, y = data(0, 6, 2)
    e.learn(X[:3], y[:3])
    assert e.learn_capacity() == 2
    before = fingerprint(e)
    with pytest.raises(Exception):
        e.learn(X[3:], y[3:])
    assert fingerprint(e) == before and e.step == 3
    e.forget([1], ArrayRetained([1], X[:1], y[:1]))  # forgetting frees room: the cap bounds the records held
    assert e.learn_capacity() == 3


def test_the_sums_stay_exact_at_the_record_cap():
    """The worst case the cap allows: records all at the norm bound, grid at 24 bits; the int64 sums equal the
    exact integer sums computed with Python integers."""
    s = spec(1, grid_bits=24)
    e = ExactRidge(s)
    X = np.full((e.grid.chunk * 2 + 3, 1), 1.0)
    y = np.full(len(X), 1.0)
    e.learn(X, y)
    q, c = int(np.rint(math.ldexp(1.0, e.grid.kx))), 2 ** e.grid.kc
    n = len(X)
    assert e.A.tolist() == [[n * q * q, n * q * c], [n * q * c, n * c * c]]
    qy = int(np.rint(math.ldexp(1.0, e.grid.ky)))
    assert e.B.tolist() == [[n * qy * q, n * qy * c]]
    assert e.grid.record_cap * (q * q + c * c) < 2 ** (62 + 53)


def test_forget_refusals_change_nothing():
    s = spec(2)
    X, y = data(0, 5, 2)
    e = ExactRidge(s)
    e.learn(X, y)
    before = fingerprint(e)
    for steps, store in (([9], ArrayRetained([9], X[:1], y[:1])), ([1, 1], ArrayRetained([1], X[:1], y[:1])),
                         ([2], None), ([2], ArrayRetained([3], X[2:3], y[2:3]))):
        with pytest.raises(ForgetError):
            e.forget(steps, store)
        assert fingerprint(e) == before


def test_retained_mode_retrains_to_the_same_state():
    s = spec(3, 2, deletion_features="retained")
    X, y = data(1, 30, 3, 2)
    e = ExactRidge(s)
    e.learn(X, y)
    e.forget([4], ArrayRetained([4], X[3:4], y[3:4]))
    before = fingerprint(e)
    keep = [i for i in range(30) if i != 3]
    e.retrain(ArrayRetained([i + 1 for i in keep], X[keep], y[keep]))
    assert fingerprint(e) == before and e.epoch == 1


@pytest.mark.parametrize("change, field", [
    ({"loss": "logistic"}, "loss"), ({"loss": "softmax", "n_classes": 3}, "loss"), ({"l2": 0.0}, "l2"),
    ({"hyperparameters": {"grid_bits": 30}}, "hyperparameters.grid_bits"),
    ({"hyperparameters": {"deletion_features": "never"}}, "hyperparameters.deletion_features"),
])
def test_refused_specs_name_their_field(change, field):
    base = dict(algorithm="exact_ridge", loss="squared", dim=3, x_norm=1.0, y_abs=1.0, domain_radius=10.0, l2=0.5,
                epsilon=1.0, delta=1e-6, rho=0.01, hyperparameters={})
    with pytest.raises(SpecError) as e:
        ExactRidge.normalize_hyperparameters(ModelSpec(**{**base, **change}))
    assert e.value.fields[0] == field


@pytest.mark.parametrize("x_norm, y_abs, l2, field", [(1e200, 1.0, 1.0, "bounds.x_norm"),
                                                      (1.0, 1e300, 1e-10, "bounds.y_abs"),
                                                      (1.0, 1.0, 1e-305, "l2")])
def test_calibration_refuses_sums_or_weights_that_could_overflow(x_norm, y_abs, l2, field):
    s = ModelSpec("exact_ridge", "squared", 3, x_norm, y_abs, 10.0, l2, 1.0, 1e-6, 0.01, {})
    with pytest.raises(SpecError) as e:
        ExactRidge.check_calibration(s)
    assert field in e.value.fields


def test_a_dimension_over_the_budget_is_refused_naming_dim_before_any_state_is_allocated():
    """d = 100 000 would be a 80 GB state and a 10^15-flop solve: the registry refuses it naming dim and the range
    that fits (without allocating the p x p sums on the way), and the top of that range is served."""
    from app.registry import build_spec
    from app.unlearning.maths.work_budget import Budget

    budget = Budget(work=3e8, memory=64 << 20, batch=10_000)
    body = {"name": "b", "algorithm": "exact_ridge", "loss": "squared", "dim": 100_000,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}}
    with pytest.raises(SpecError) as e:
        build_spec(body, max_dim=100_000, budget=budget)
    assert e.value.field == "dim" and 1 <= e.value.accepted[1] < 2000
    s = build_spec({**body, "dim": int(e.value.accepted[1])}, max_dim=100_000, budget=budget)
    assert ExactRidge.cost(s, 1).learn <= 3e8


def test_work_budget_counts_the_d_squared_state_and_the_d_cubed_solve():
    small, big = ExactRidge.cost(spec(10), 1), ExactRidge.cost(spec(1000), 1)
    assert big.solve == 1001 and big.array_bytes >= 8 * 1001**2
    assert big.learn > 500 * small.learn  # the d^3 solve dominates
    assert big.forget_fields[0] == "dim" and big.memory_fields == ("dim",)
    kept = ExactRidge.cost(spec(10, deletion_features="retained", max_records=1000), 1)
    assert kept.retrain > 0 and kept.forget_fields[0] == "hyperparameters.max_records"
