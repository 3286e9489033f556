"""Multi-class softmax models (issue 16 item 1): the constants of losses.py checked numerically, coupled replays
against retraining for every family that serves softmax (each with an under-noised control that must fail), the
memory pair's refusal, and the HTTP surface (names, probabilities, the parameter matrix, bad labels).

Near-worst-case streams reuse the passive family's orthogonal probe (tests/olu_streams.py) with classes: pushers
(x_p, class 1) make the model confident in class 1 along x_p, so the probe record (x_p, class 0) has
p ~ e_1 and ||p - e_0|| ~ sqrt(2), a gradient of norm close to L; every later example is orthogonal to x_p in
augmented space, so the difference the probe made, a matrix v x~_p^T, changes no later score and contracts
exactly by the certified factor.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.receipts import parameters_sha256
from app.registry import build_spec, rho_from_epsilon_delta
from app.unlearning import ArrayRetained, ModelSpec, SeededNoise, SpecError
from app.unlearning.families.active import ActiveOLU
from app.unlearning.families.descent_to_delete import DescentToDelete
from app.unlearning.verification.d2d_replay import d2d_replay
from app.unlearning.families.discard import DiscardAndRestart
from app.unlearning.families.dp_tree import OnlineDPTree
from app.unlearning.families.dp_tree_aggregation import levels_for
from app.unlearning.maths.losses import MAX_CLASSES, augment, make_loss
from app.unlearning.families.memory_pair import MemoryPair
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.verification.replay import coupled_replay
from app.unlearning.verification.replay_data import coupled_replay_data
from app.unlearning.verification.replay_data_sgd import coupled_sgd_replay
from app.unlearning.families.restart import PassiveOLURestart
from app.unlearning.families.retrain import RetrainOGD
from app.unlearning.families.rewind import RewindToDelete
from app.unlearning.families.second_order import SecondOrderOLU
from app.unlearning.families.second_order_numerics import SOFTMAX_D3
from tests import test_second_order as tso
from tests.olu_streams import PROBE, X_NORM, max_ratio, orthogonal, under_noised

from .helpers import unit_rows, verify_receipt

TOL = 1e-9


def sspec(algorithm: str, hp=None, *, K: int = 3, dim: int = 3, x_norm: float = X_NORM, R: float = 20.0,
          l2: float = 0.01, eps: float = 1.0, delta: float = 1e-6, rho: float | None = None) -> ModelSpec:
    rho = rho_from_epsilon_delta(eps, delta) if rho is None else rho
    return ModelSpec(algorithm, "softmax", dim, x_norm, 1.0, R, l2, eps, delta, rho, dict(hp or {}), n_classes=K)


def softmax_loss(K=3, x_norm=2.0, R=20.0, mu=0.01):
    return make_loss("softmax", x_norm, 1.0, R, mu, {}, K)


def probe_stream(n_push: int, n_after: int, K: int = 3, seed: int = 0):
    """(X, y, u): pushers (x_p, class 1), the probe record (x_p, class 0) at step u, then orthogonal examples."""
    rng = np.random.default_rng(seed)
    X = np.vstack([np.tile(PROBE, (n_push, 1)), PROBE[None, :], orthogonal(rng, n_after)])
    y = np.concatenate([np.ones(n_push), [0.0], rng.integers(0, K, n_after).astype(float)])
    return X, y, n_push + 1


def mixed(rng, T: int, K: int = 3):
    """Pushers, probes, orthogonal and random examples at the norm bound, labels in 0..K-1."""
    kind = rng.integers(0, 4, T)
    X = np.empty((T, 3))
    y = rng.integers(0, K, T).astype(float)
    for s, k in enumerate(kind):
        if k == 0:
            X[s], y[s] = PROBE, 1.0
        elif k == 1:
            X[s], y[s] = PROBE, 0.0
        elif k == 2:
            X[s] = orthogonal(rng, 1)[0]
        else:
            v = rng.normal(size=3)
            X[s] = X_NORM * v / np.linalg.norm(v)
    return X, y


# ---- the constants of losses.py, numerically ---------------------------------------------------------------------
def _ball(rng, n, r):
    v = rng.normal(size=n)
    return v / np.linalg.norm(v) * r * rng.uniform(0, 1) ** (1 / n)


@settings(deadline=None)
@given(seed=st.integers(0, 2**31 - 1), K=st.integers(2, 12), d=st.integers(1, 6),
       x_norm=st.sampled_from([0.1, 1.0, 3.0]), R=st.sampled_from([0.5, 5.0, 50.0]), mu=st.sampled_from([0.0, 0.01, 1.0]))
def test_gradient_and_smoothness_bounds_on_random_points(seed, K, d, x_norm, R, mu):
    rng = np.random.default_rng(seed)
    loss = make_loss("softmax", x_norm, 1.0, R, mu, {}, K)
    for _ in range(5):
        theta = _ball(rng, K * (d + 1), R)
        x = _ball(rng, d, x_norm)
        xa = augment(x[None, :])[0]
        y = float(rng.integers(0, K))
        g = loss.grad(theta, xa, y)
        assert np.linalg.norm(g) <= loss.lipschitz * (1 + TOL)
        H = loss.hessian_sum(xa[None, :], loss.hessian_parts(theta, xa[None, :]))
        ev = np.linalg.eigvalsh(H)
        assert ev.max() + mu <= loss.smoothness * (1 + TOL)
        assert ev.min() >= -1e-12  # convex data term
        # the data term is flat along Theta -> Theta + 1 c^T: strong convexity is mu alone
        flat = np.outer(np.ones(K), rng.normal(size=d + 1)).ravel()
        assert np.linalg.norm(H @ flat) <= 1e-10 * np.linalg.norm(flat) * max(1.0, ev.max())


@pytest.mark.parametrize("K", [2, 3, 10])
def test_gradient_bound_is_nearly_attained(K):
    """p concentrated on a class k != y, x at the norm bound and Theta at the radius along (e_k - e_y) x~^T: the
    data gradient and the regulariser align and the norm reaches sqrt(2) X~ + mu R up to exp(-margin)."""
    loss = softmax_loss(K=K, x_norm=2.0, R=200.0, mu=0.01)
    x = np.array([2.0, 0.0, 0.0])
    xa = augment(x[None, :])[0]
    e = np.zeros(K)
    e[1], e[0] = 1.0, -1.0
    direction = np.outer(e, xa).ravel()
    theta = 200.0 * direction / np.linalg.norm(direction)
    g = loss.grad(theta, xa, 0.0)
    assert np.linalg.norm(g) <= loss.lipschitz * (1 + TOL)
    assert np.linalg.norm(g) >= 0.999 * loss.lipschitz


def test_smoothness_bound_is_attained_at_two_even_classes():
    loss = softmax_loss(K=4, mu=0.0)
    xa = augment(np.array([[2.0, 0.0, 0.0]]))
    theta = np.zeros(4 * 4)
    theta.reshape(4, 4)[2:, 3] = -50.0  # classes 2, 3 far below: p = (1/2, 1/2, ~0, ~0)
    H = loss.hessian_sum(xa, loss.hessian_parts(theta, xa))
    assert np.linalg.eigvalsh(H).max() == pytest.approx(loss.smoothness, rel=1e-8)  # X~ carries BOUND_TOLERANCE


@settings(deadline=None)
@given(seed=st.integers(0, 2**31 - 1), K=st.integers(2, 8), scale=st.sampled_from([1e-4, 1e-2, 1.0, 10.0]),
       near=st.booleans())
def test_hessian_lipschitz_bound_holds(seed, K, scale, near):
    """||grad^2 f(Theta) - grad^2 f(Theta')||_op <= M ||Theta - Theta'||_F with M = X~^3/sqrt(2) (losses.py); ``near``
    starts where the third derivative is large (two classes with p ~ 0.2 / 0.8)."""
    rng = np.random.default_rng(seed)
    d = 2
    loss = make_loss("softmax", 1.0, 1.0, 100.0, 0.0, {}, K)
    M = SOFTMAX_D3 * loss.feature_bound**3
    x = _ball(rng, d, 1.0)
    x *= 1.0 / max(np.linalg.norm(x), 1e-12) if near else 1.0
    xa = augment(x[None, :])
    theta = rng.normal(size=K * (d + 1)) * 3
    if near:
        theta = np.zeros(K * (d + 1))
        theta.reshape(K, d + 1)[0, -1] = math.log(4.0)
        theta.reshape(K, d + 1)[2:, -1] = -60.0
    other = theta + scale * rng.normal(size=theta.shape)
    H1 = loss.hessian_sum(xa, loss.hessian_parts(theta, xa))
    H2 = loss.hessian_sum(xa, loss.hessian_parts(other, xa))
    gap = np.linalg.norm(H1 - H2, 2)
    assert gap <= M * np.linalg.norm(theta - other) * (1 + 1e-7) + 1e-15


def test_third_derivative_bound_over_many_directions():
    """sup over unit h of |E_p (h - E_p h)^3| <= 1/sqrt(2), the constant of M; random and adversarial p."""
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(3000):
        K = int(rng.integers(2, 6))
        p = rng.dirichlet(np.full(K, rng.choice([0.1, 1.0, 10.0])))
        h = rng.normal(size=K)
        h /= np.linalg.norm(h)
        c = h - p @ h
        worst = max(worst, abs(float(p @ c**3)))
    assert worst <= SOFTMAX_D3
    # two classes, h = (1, -1)/sqrt(2), p_1 = (3 + sqrt 3)/6: the logistic extremum, 2 sqrt(2)/(6 sqrt 3) ~ 0.272
    p = np.array([(3 + math.sqrt(3)) / 6, (3 - math.sqrt(3)) / 6])
    h = np.array([1.0, -1.0]) / math.sqrt(2)
    c = h - p @ h
    assert abs(float(p @ c**3)) == pytest.approx(2 * math.sqrt(2) / (6 * math.sqrt(3)), rel=1e-12)
    assert worst <= SOFTMAX_D3 and abs(float(p @ c**3)) >= SOFTMAX_D3 / 3  # the constant is within 3x of sup


def test_derivatives_match_finite_differences():
    rng = np.random.default_rng(3)
    loss = softmax_loss(K=4, mu=0.3)
    X = augment(unit_rows(7, 3, seed=2) * 2.0)
    y = rng.integers(0, 4, 7).astype(float)
    theta = rng.normal(size=16)
    F = lambda t: float(loss.losses(t, X, y).sum())  # noqa: E731
    num = np.array([(F(theta + 1e-6 * e) - F(theta - 1e-6 * e)) / 2e-6 for e in np.eye(16)])
    assert np.allclose(num, loss.grad_sum(theta, X, y) + len(y) * loss.mu * theta, atol=1e-6)
    assert np.allclose(loss.mean_grad(theta, X, y), sum(loss.grad(theta, x, t) for x, t in zip(X, y)) / len(y))
    parts = loss.hessian_parts(theta, X)
    v = rng.normal(size=16)
    assert np.allclose(loss.hvp_sum(X, parts, v), loss.hessian_sum(X, parts) @ v)
    G = lambda t: loss.grad_sum(t, X, y)  # noqa: E731
    Hn = np.array([(G(theta + 1e-6 * e) - G(theta - 1e-6 * e)) / 2e-6 for e in np.eye(16)]).T
    assert np.allclose(Hn, loss.hessian_sum(X, parts), atol=1e-6)


def test_binary_softmax_constants_and_labels():
    loss = softmax_loss(K=2, x_norm=1.0, R=10.0, mu=0.1)
    Xt = math.sqrt(2.0)
    assert loss.lipschitz == pytest.approx(math.sqrt(2) * Xt + 1.0)
    assert loss.smoothness == pytest.approx(Xt**2 / 2 + 0.1)
    assert loss.n_params(3) == 8
    for bad in (-1.0, 2.0, 0.5):
        with pytest.raises(Exception) as e:
            loss.normalize_labels(np.array([0.0, bad]))
        assert getattr(e.value, "code", None) == "invalid-label" and e.value.index == 1
    for K in (0, 1, MAX_CLASSES + 1):
        with pytest.raises(SpecError):
            make_loss("softmax", 1.0, 1.0, 1.0, 0.1, {}, K)


# ---- coupled replays, one per family ----------------------------------------------------------------------------
def test_passive_replay_tight_and_under_noised_fails():
    s = sspec("passive_olu", {"schedule": "strongly_convex_capped"}, R=50.0, rho=1.0)  # noise rarely projected
    X, y, u = probe_stream(100, 60)
    pts = coupled_replay(lambda nz: PassiveOLU(s, nz), X, y, {len(y): [u]})
    for p in pts:
        assert p.distance <= p.shift_bound * (1 + TOL) + 1e-12
    ratio = max_ratio(pts)
    assert 0.3 <= ratio <= 1 + TOL, ratio
    neg = max_ratio(coupled_replay(lambda nz: under_noised(PassiveOLU)(s, nz), X, y, {len(y): [u]}))
    assert neg > 1.0, neg


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), data=st.data())
def test_passive_and_restart_replays_on_random_streams(seed, data):
    rng = np.random.default_rng(seed)
    T = data.draw(st.integers(8, 60))
    X, y = mixed(rng, T, K=data.draw(st.integers(2, 5)))
    K = int(y.max()) + 1 if y.max() >= 1 else 2
    taus = sorted(data.draw(st.sets(st.integers(2, T), min_size=1, max_size=3)))
    dels, used = {}, set()
    for tau in taus:
        cands = [s for s in range(1, tau + 1) if s not in used]
        pick = data.draw(st.sampled_from(cands))
        used.add(pick)
        dels[tau] = [pick]
    algo = data.draw(st.sampled_from(["passive_olu", "passive_olu_restart"]))
    hp = {"schedule": "strongly_convex_capped"} if algo == "passive_olu" else {
        "schedule": "regularized_convex", "horizon": 200, "max_deletions": 3}
    s = sspec(algo, hp, K=max(K, 2), R=data.draw(st.sampled_from([1.0, 20.0])),
              l2=0.01 if algo == "passive_olu" else 0.0)
    cls = PassiveOLU if algo == "passive_olu" else PassiveOLURestart
    for p in coupled_replay(lambda nz: cls(s, nz), X, y, dels, seed=seed):
        assert p.realized <= p.certified * (1 + TOL) + 1e-300, p
        assert p.distance <= p.shift_bound * (1 + TOL) + 1e-12, p


def test_restart_replay_restarts_then_certifies_and_under_noised_fails():
    s = sspec("passive_olu_restart", {"schedule": "regularized_convex", "horizon": 400, "max_deletions": 3, "c": 1e6},
              R=5.0, l2=0.0, rho=1.0)
    rng = np.random.default_rng(0)
    X0, y0 = mixed(rng, 20)
    Xp, yp, up = probe_stream(100, 50)
    X, y = np.vstack([X0, Xp]), np.concatenate([y0, yp])
    dels = {20: [2], len(y): [20 + up]}
    pts = coupled_replay(lambda nz: PassiveOLURestart(s, nz), X, y, dels)
    assert pts[0].distance == 0.0 and pts[0].realized == 0.0  # the restart erased everything
    ratio = max_ratio(pts)
    assert 0.3 <= ratio <= 1 + TOL, ratio
    neg = max_ratio(coupled_replay(lambda nz: under_noised(PassiveOLURestart)(s, nz), X, y, dels))
    assert neg > 1.0, neg


class ActiveUnderNoised(ActiveOLU):
    def noise_multiplier(self, i):
        return super().noise_multiplier(i) / 10.0


@pytest.mark.parametrize("variant", ["single", "two_phase"])
def test_active_replay_holds_and_under_noised_fails(variant):
    """-e1 / e1 are orthogonal in augmented space (2-D features): only the l2 term moves the forgotten record's
    difference, in OGD and in the GD phase alike."""
    e1 = np.array([1.0, 0.0])
    X = np.array([-e1] * 10 + [e1] + [-e1] * 30)
    y = np.array([1.0] * 10 + [0.0] + [2.0] * 30)
    s = sspec("active_olu", {"variant": variant}, dim=2, x_norm=1.0, R=10.0, l2=0.01, rho=0.01747)
    pts = [coupled_replay_data(lambda nz: ActiveOLU(s, nz), X, y, {len(y): [11]}, seed=k)[0] for k in range(3)]
    for p in pts:
        assert p.distance <= p.shift_bound * (1 + TOL) + 1e-12, p
        assert p.realized <= p.certified * (1 + TOL) + 1e-15, p
    assert max(p.distance / p.shift_bound for p in pts) > 0.3
    (q,) = coupled_replay_data(lambda nz: ActiveUnderNoised(s, nz), X, y, {len(y): [11]})
    assert q.realized > q.certified


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), variant=st.sampled_from(["single", "two_phase"]), data=st.data())
def test_active_replay_random_schedules(seed, variant, data):
    rng = np.random.default_rng(seed)
    T = data.draw(st.integers(4, 25))
    X = unit_rows(T, 2, seed=seed, scale=1.0)
    y = rng.integers(0, 4, T).astype(float)
    u = data.draw(st.integers(1, T))
    s = sspec("active_olu", {"variant": variant, "max_gd_steps": data.draw(st.sampled_from([0, 5, 200]))}, K=4,
              dim=2, x_norm=1.0, R=data.draw(st.sampled_from([1.0, 10.0])), rho=0.01747)
    for p in coupled_replay_data(lambda nz: ActiveOLU(s, nz), X, y, {T: [u]}, seed=seed):
        assert p.distance <= p.shift_bound * (1 + TOL) + 1e-12, p
        assert p.realized <= p.certified * (1 + TOL) + 1e-15, p


def _masked_run(s, X, y, masked):
    e = RetrainOGD(s)
    for t in range(1, len(y) + 1):
        if t in masked:
            e.skip(1)
        else:
            e.learn(X[t - 1:t], y[t - 1:t])
    return e


def test_retrain_forget_equals_fresh_run_on_the_masked_stream_and_control_differs():
    rng = np.random.default_rng(5)
    X, y = mixed(rng, 40, K=4)
    s = sspec("retrain", K=4, l2=0.5)  # eta_t = 1/(mu t) below the cap from t = 3: the clock matters
    e = RetrainOGD(s)
    steps = e.learn(X, y)
    certs = e.forget([7, 30], ArrayRetained(steps, X, y))
    assert all(c.mechanism == "exact" and c.rho == 0 for c in certs)
    assert np.array_equal(e.published(), _masked_run(s, X, y, {7, 30}).published())  # bitwise
    keep = [k for k in range(40) if k + 1 not in (7, 30)]
    wrong = RetrainOGD(s)  # dropping the records and their clock ticks is not the reference (P7)
    wrong.learn(X[keep], y[keep])
    assert not np.allclose(e.published(), wrong.published(), atol=1e-6)
    stale = RetrainOGD(s)  # and a forget that did nothing
    stale.learn(X, y)
    assert not np.allclose(e.published(), stale.published(), atol=1e-6)


def test_discard_replay_is_exact_and_keeping_the_iterate_is_caught():
    rng = np.random.default_rng(12)
    X, y = mixed(rng, 60)
    s = sspec("discard_and_restart", {"schedule": "strongly_convex_capped"})
    dels = {30: [10], 45: [40, 3]}
    pts = coupled_replay(lambda nz: DiscardAndRestart(s, nz), X, y, dels, seed=1)
    assert all(p.distance == 0.0 and p.certified == 0.0 for p in pts), pts

    class KeepsTheState(DiscardAndRestart):
        def restart(self):
            theta = self.theta
            super().restart()
            self.theta = theta

    bad = coupled_replay(lambda nz: KeepsTheState(s, nz), X, y, dels, seed=1)
    assert max(p.distance for p in bad) > 0.0


def outlier_data(n: int, d: int, x_norm: float = 1.0):
    """Every record but the first is (x = 0, class 0); the first is (x_norm e1, class 1): it stays misclassified,
    its gradient has norm ~ sqrt(2) X~, and only mu curves the e1 columns (the slowest contraction)."""
    X = np.zeros((n, d))
    y = np.zeros(n)
    X[0, 0], y[0] = x_norm, 1.0
    return X, y


@pytest.mark.parametrize("variant", ["secret", "regularized_strong"])
def test_descent_to_delete_replay_holds_and_under_noised_fails(variant):
    """The outlier is the only record with an e1 component: the warm-started GD contracts its shift at the slow
    rate.  Measured ratio distance / Delta ~ 0.09 here (Delta's 2 L / (mu n) is twice the optimum's move along e1,
    and L carries mu R), so the control is sigma/20 (sigma/10 lands just under epsilon)."""
    hp = {"variant": variant, "retrain_when_cheaper": False, "iterations": 200}
    l2 = 0.05
    if variant.startswith("regularized"):
        hp["regularization"], l2 = 0.05, 0.0
    s = sspec("descent_to_delete", hp, K=3, dim=2, x_norm=3.0, R=10.0, l2=l2, rho=0.5)
    X, y = outlier_data(2000, 2, 3.0)
    p = d2d_replay(lambda nz: DescentToDelete(s, nz), X, y, 2000, [("delete", 1)], check_optimum=True)[0]
    assert p.mechanism == "discrete_gaussian"
    assert p.distance <= p.certified and p.published_distance <= p.certified
    assert p.realized_epsilon <= s.epsilon
    assert p.to_optimum <= p.radius  # eq. 3
    assert p.ratio > 0.05

    class Under(DescentToDelete):
        sigma_scale = 0.05

    q = d2d_replay(lambda nz: Under(s, nz), X, y, 2000, [("delete", 1)])[0]
    assert q.distance == pytest.approx(p.distance, rel=1e-9)
    assert q.realized_epsilon > s.epsilon, (p.ratio, q.realized_epsilon)


def test_descent_to_delete_distributed_runs_softmax_partitions():
    hp = {"variant": "distributed", "retrain_when_cheaper": False}
    s = sspec("descent_to_delete", hp, K=3, dim=2, x_norm=1.0, R=1.0, l2=0.05, rho=0.5)
    rng = np.random.default_rng(0)
    X = unit_rows(64, 2, seed=1)
    y = rng.integers(0, 3, 64).astype(float)
    pts = d2d_replay(lambda nz: DescentToDelete(s, nz), X, y, 64, [("delete", 3)])
    for p in pts:
        assert p.distance <= p.certified and p.realized_epsilon <= s.epsilon


def test_rewind_replay_within_sigma_and_tight():
    """Thm 18 (strongly convex PSGD): the mean distance to the replay stays <= Sigma, and above Sigma/10 (so
    Sigma/10, equivalently sigma/10, would be violated)."""
    X, y = outlier_data(200, 4)
    hp = {"regime": "strongly_convex", "T": 1500, "K": 50, "batch_size": 4, "m_max": 1, "initial_size": 50}
    s = sspec("rewind_to_delete", hp, K=3, dim=4, x_norm=1.0, R=4.0, l2=0.01, eps=0.5, delta=1e-5, rho=0.0)
    pts = [coupled_sgd_replay(lambda nz, sp: RewindToDelete(s, nz, sp), X, y, [[0]], seed=k)[0] for k in range(12)]
    mean = float(np.mean([p.distance for p in pts]))
    Sigma = pts[0].sigma_at_m
    assert mean <= Sigma
    assert mean > Sigma / 10


class _ZeroNoise:
    def standard_normal(self, size):
        return np.zeros(size)

    def discrete_gaussian(self, sigma, size):
        return np.zeros(size, dtype=np.int64)


def test_dp_tree_node_divergence_within_charge_and_sigma_over_10_overspends():
    """As tests/test_dp_tree.py: skipping records changes exactly the tree nodes holding them by their rounded
    gradients; pushers make the skipped probe records' gradients close to L, aligned, in shared nodes."""
    T, k = 64, 4
    X = np.tile(PROBE, (T, 1))
    y = np.ones(T)
    y[-4:] = 0.0
    s = sspec("online_dp_tree", {"horizon": T, "max_deletions": k, "group_privacy": "gaussian_group", "lambda": 10.0},
              R=50.0, l2=0.0)
    e = OnlineDPTree(s, _ZeroNoise())
    played = [np.zeros(s.n_params)]
    for i in range(T - 1):
        e.learn(X[i:i + 1], y[i:i + 1])
        played.append(e.published())
    g = np.array([e.loss.grad(w, x, label) for w, x, label in zip(played, augment(X), y)])
    assert np.linalg.norm(g[-1]) > 0.8 * e.L

    def divergence(U, sigma):
        r = e.grid * np.array([e.leaf(gu) for gu in g], dtype=float)
        total = 0.0
        for h in range(levels_for(e.horizon)):
            for j in range(T >> h):
                node = range(j * 2**h + 1, (j + 1) * 2**h + 1)
                diff = sum((r[u - 1] for u in U if u in node), np.zeros(s.n_params))
                total += float(diff @ diff) / (2 * sigma**2)
        return total

    tight = divergence([61, 62, 63, 64], e.node_sigma)
    assert 0.5 * e.rho_olu <= tight <= e.rho_olu * (1 + 1e-9), tight / e.rho_olu
    assert divergence([61, 62, 63, 64], e.node_sigma / 10) > e.rho_olu


def softmax_erm(e: SecondOrderOLU, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin (1/n) sum l + (mu/2)||Theta||^2 to round-off by damped Newton (the softmax form of test_second_order.erm)."""
    Xa = augment(X)
    mu, n, loss = e.mu, len(y), e.loss
    w = np.zeros(loss.n_params(X.shape[1]))
    F = lambda v: float(np.mean(loss.losses(v, Xa, y)))  # noqa: E731
    for _ in range(200):
        g = loss.grad_sum(w, Xa, y) / n + mu * w
        if np.linalg.norm(g) <= 1e-14:
            break
        H = loss.hessian_sum(Xa, loss.hessian_parts(w, Xa)) / n + mu * np.eye(len(w))
        step = np.linalg.solve(H, g)
        t, f0 = 1.0, F(w)
        while np.linalg.norm(g) > 1e-6 and F(w - t * step) > f0 - 0.25 * t * float(g @ step) and t > 1e-8:
            t *= 0.5
        w = w - t * step
    assert np.linalg.norm(loss.grad_sum(w, Xa, y) / n + mu * w) <= 1e-12
    return w


def softmax_stream(n: int, d: int, K: int, seed: int, flipped: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    X *= rng.uniform(0.3, 1.0, size=(n, 1))
    X[: n // 10] /= np.linalg.norm(X[: n // 10], axis=1, keepdims=True)
    W = rng.standard_normal((K, d))
    y = np.argmax(X @ W.T + 0.3 * rng.standard_normal((n, K)), axis=1).astype(float)
    y[:flipped] = (y[:flipped] + 1) % K  # mislabelled records: the largest gradients
    return X, y


@pytest.mark.parametrize("schedule,batch,l2", [("random", 1, 0.05), ("max_norm", 1, 0.02), ("random", 2, 0.05)])
def test_second_order_pre_noise_gap_within_certified_sensitivity(monkeypatch, schedule, batch, l2):
    monkeypatch.setattr(tso, "erm", softmax_erm)
    X, y = softmax_stream(200, 4, 3, seed=1, flipped=8)
    s = sspec("second_order_olu", dim=4, x_norm=1.0, R=10.0, l2=l2)
    gaps = tso.replay(tso.Recording, s, X, y, schedule, 140, 3, 0, batch)
    assert len(gaps) == 3 * batch
    for gap, delta in gaps:
        assert 0 < delta and gap <= delta, (gap, delta)


def test_second_order_paper_sign_fails_the_check(monkeypatch):
    monkeypatch.setattr(tso, "erm", softmax_erm)
    X, y = softmax_stream(3000, 4, 3, seed=0, flipped=8)
    s = sspec("second_order_olu", dim=4, x_norm=1.0, R=10.0, l2=0.1)
    good = tso.replay(tso.Recording, s, X, y, "max_norm", 3000, 2)
    bad = tso.replay(tso.PaperSign, s, X, y, "max_norm", 3000, 2)
    assert all(g <= d for g, d in good)
    assert max(g / d for g, d in bad) > 1.0


def test_second_order_constants_for_softmax():
    e = SecondOrderOLU(sspec("second_order_olu", dim=4, x_norm=1.0, R=10.0, l2=0.05))
    X = e.loss.feature_bound
    assert e.M == pytest.approx(X**3 / math.sqrt(2))
    assert e.B == pytest.approx(min(math.sqrt(2 * math.log(3) / 0.05), math.sqrt(2) * X / 0.05))
    assert e.L_B == pytest.approx(math.sqrt(2) * X + 0.05 * e.B)


# ---- creation ---------------------------------------------------------------------------------------------------
BASE = {"name": "m", "loss": "softmax", "dim": 3, "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0,
        "l2": 0.01, "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}}


def test_memory_pair_refuses_softmax_naming_the_loss():
    with pytest.raises(SpecError) as e:
        build_spec({**BASE, "algorithm": "memory_pair", "n_classes": 3}, max_dim=1000)
    assert e.value.field == "loss" and "measured" in str(e.value)
    with pytest.raises(SpecError):
        MemoryPair(sspec("memory_pair"))


@pytest.mark.parametrize("extra,field", [
    ({}, "n_classes"),
    ({"n_classes": 1}, "n_classes"),
    ({"n_classes": MAX_CLASSES + 1}, "n_classes"),
    ({"n_classes": 3, "classes": ["a", "b"]}, "n_classes"),
    ({"classes": ["a", "a"]}, "classes"),
    ({"n_classes": 400, "dim": 3}, "n_classes"),  # 400 x 4 parameters > max_dim + 1
])
def test_bad_class_declarations_are_refused(extra, field):
    with pytest.raises(SpecError) as e:
        build_spec({**BASE, "algorithm": "passive_olu", **extra}, max_dim=1000)
    assert e.value.field == field or (field == "n_classes" and e.value.field == "dim")  # either fixes it


def test_n_classes_only_with_softmax_and_names_fill_k():
    with pytest.raises(SpecError) as e:
        build_spec({**BASE, "loss": "logistic", "algorithm": "passive_olu", "n_classes": 3}, max_dim=1000)
    assert e.value.field == "n_classes"
    s = build_spec({**BASE, "algorithm": "passive_olu", "classes": ["a", "b", "c"]}, max_dim=1000)
    assert s.n_classes == 3 and s.classes == ("a", "b", "c") and s.n_params == 12


def test_calibration_refusal_names_a_field_and_its_range():
    """A softmax spec whose constants overflow is refused at creation with the field and its accepted range."""
    with pytest.raises(SpecError) as e:
        build_spec({**BASE, "algorithm": "passive_olu", "n_classes": 3, "bounds": {"x_norm": 1e200, "y_abs": 1.0}},
                   max_dim=1000)
    assert e.value.field is not None and e.value.accepted is not None
    lo, hi = e.value.accepted
    build_spec({**BASE, "algorithm": "passive_olu", "n_classes": 3,
                **({"bounds": {"x_norm": hi, "y_abs": 1.0}} if e.value.field == "bounds.x_norm" else {})}, max_dim=1000)


# ---- HTTP ------------------------------------------------------------------------------------------------------
NAMES = [f"c{k}" for k in range(10)]


def test_ten_class_model_over_http(server, tenant):
    _, c = tenant
    body = {**BASE, "algorithm": "passive_olu", "dim": 4, "classes": NAMES}
    r = c.post("/v1/models", json=body)
    assert r.status_code == 201, r.text
    model = r.json()
    mid = model["id"]
    assert model["loss"] == "softmax" and model["n_classes"] == 10 and model["classes"] == NAMES
    X_norm_bound = math.sqrt(1.0 + 1.0)
    assert model["constants"]["L"] == pytest.approx(math.sqrt(2) * X_norm_bound + 0.01 * 10.0, rel=1e-6)
    assert model["constants"]["beta"] == pytest.approx(X_norm_bound**2 / 2 + 0.01, rel=1e-6)
    X = unit_rows(40, 4, seed=3)
    exs = [{"id": f"r{i}", "x": x.tolist(), "y": (NAMES[i % 10] if i % 2 else i % 10)} for i, x in enumerate(X)]
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": exs})
    assert r.status_code == 200, r.text
    r = c.post(f"/v1/models/{mid}/learn", json={"ids": ["col-1", "col-2"], "x": X[:2].tolist(), "y": [3, 9]})
    assert r.status_code == 200, r.text
    p = c.get(f"/v1/models/{mid}/parameters").json()
    assert p["shape"] == [10, 5] and len(p["weights"]) == 50 and p["bias"] is None and p["classes"] == NAMES
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["r3", "r8"]})
    assert r.status_code == 200, r.text
    keys = c.get("/v1/keys").json()["keys"]
    for receipt in r.json()["receipts"]:
        assert verify_receipt(receipt, keys)
        m = receipt["mechanism"]
        assert m["type"] == "discrete_gaussian" and m["sigma"] > 0 and m["sensitivity"] > 0
    after = c.get(f"/v1/models/{mid}/parameters").json()
    assert after["weights"] != p["weights"] and after["version"] > p["version"]
    last = r.json()["receipts"][-1]  # the receipt hashes the published matrix (row-major float64 bytes)
    assert last["model_version"] == after["version"]
    assert last["published_parameters_sha256"] == hashlib.sha256(np.asarray(after["weights"], "<f8").tobytes()).hexdigest()
    assert last["published_parameters_sha256"] == parameters_sha256(after["weights"], after["bias"])
    r = c.post(f"/v1/models/{mid}/predict", json={"x": X[:5].tolist()})
    assert r.status_code == 200, r.text
    out = r.json()
    W = np.array(after["weights"]).reshape(10, 5)
    S = X[:5] @ W[:, :-1].T + W[:, -1]
    P = np.exp(S - S.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    assert np.allclose(out["probabilities"], P, rtol=1e-12, atol=1e-15)
    assert out["predictions"] == np.argmax(P, axis=1).astype(float).tolist()
    assert out["classes"] == [NAMES[int(k)] for k in out["predictions"]]
    assert np.allclose(out["scores"], P.max(axis=1))
    assert c.get(f"/v1/models/{mid}").json()["n_classes"] == 10


def test_binary_answers_are_unchanged_over_http(server, tenant):
    """The softmax fields are additive: a logistic model's model, predict and parameters answers carry none."""
    _, c = tenant
    r = c.post("/v1/models", json={**BASE, "loss": "logistic", "algorithm": "passive_olu"})
    assert r.status_code == 201
    m = r.json()
    assert "n_classes" not in m and "classes" not in m
    X = unit_rows(4, 3)
    c.post(f"/v1/models/{m['id']}/learn", json={"examples": [{"id": f"b{i}", "x": x.tolist(), "y": i % 2}
                                                              for i, x in enumerate(X)]})
    assert set(c.post(f"/v1/models/{m['id']}/predict", json={"x": X.tolist()}).json()) == {"predictions", "scores",
                                                                                            "version"}
    p = c.get(f"/v1/models/{m['id']}/parameters").json()
    assert set(p) == {"version", "weights", "bias", "published_at"} and isinstance(p["bias"], float)
    r = c.post(f"/v1/models/{m['id']}/learn", json={"examples": [{"id": "n1", "x": X[0].tolist(), "y": "c1"}]})
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid-label"), r.text  # the model's rule


def test_bad_labels_are_refused_and_change_nothing(server, tenant):
    _, c = tenant
    r = c.post("/v1/models", json={**BASE, "algorithm": "active_olu", "classes": ["cat", "dog", "eel"]})
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    X = unit_rows(3, 3)
    ok = c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "a", "x": X[0].tolist(), "y": "dog"}]})
    assert ok.status_code == 200
    before = (c.get(f"/v1/models/{mid}").json(), c.get(f"/v1/models/{mid}/parameters").json())
    for y in ("cow", 3, -1, 1.5):
        r = c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "b", "x": X[1].tolist(), "y": "cat"},
                                                                  {"id": "c", "x": X[2].tolist(), "y": y}]})
        assert r.status_code == 422, (y, r.text)
        assert r.json()["type"].endswith("/invalid-label"), r.text
        assert r.json().get("index") == 1
    r = c.post(f"/v1/models/{mid}/learn", json={"ids": ["b"], "x": [X[1].tolist()], "y": [7]})
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid-label")
    assert (c.get(f"/v1/models/{mid}").json(), c.get(f"/v1/models/{mid}/parameters").json()) == before
    r = c.post("/v1/models", json={**BASE, "algorithm": "memory_pair", "n_classes": 3})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "loss", r.text
    r = c.post("/v1/models", json={**BASE, "algorithm": "passive_olu", "n_classes": 3, "classes": ["a", "b"]})
    assert r.status_code == 422, r.text


def test_second_order_softmax_x_norm_1e150_refused_with_the_field_and_its_range():
    """M = X~^3/sqrt(2) overflows: refused at creation naming bounds.x_norm with an accepted range below 1e150, and
    the top of that range is accepted."""
    body = {**BASE, "algorithm": "second_order_olu", "n_classes": 4, "bounds": {"x_norm": 1e150, "y_abs": 1.0}}
    with pytest.raises(SpecError) as e:
        build_spec(body, max_dim=1000)
    assert e.value.field == "bounds.x_norm" and e.value.accepted is not None
    lo, hi = e.value.accepted
    assert lo <= 1.0 <= hi < 1e150
    s = build_spec({**body, "bounds": {"x_norm": hi, "y_abs": 1.0}}, max_dim=1000)
    assert math.isfinite(SecondOrderOLU(s).M)


SERVED = {"passive_olu": {}, "passive_olu_restart": {"max_deletions": 3, "horizon": 200}, "active_olu": {},
          "retrain": {}, "descent_to_delete": {}, "rewind_to_delete": {"initial_size": 5, "T": 20},
          "discard_and_restart": {}, "online_dp_tree": {"horizon": 200, "max_deletions": 3}, "second_order_olu": {},
          "sisa": {"shards": 3, "slices": 2, "max_records": 40}}


@pytest.mark.parametrize("algorithm", sorted(SERVED))
def test_state_round_trip_keeps_the_matrix(algorithm):
    """Every family serving softmax stores its K(d+1) parameters and reloads them exactly (state codec included),
    and the reloaded engine forgets exactly as the original with the same noise."""
    from app.db.state_codec import pack_state, unpack_state
    from app.unlearning import engine_class

    s = build_spec({**BASE, "algorithm": algorithm, "n_classes": 4, "hyperparameters": SERVED[algorithm]},
                   max_dim=1000)
    cls = engine_class(algorithm)
    rng = np.random.default_rng(0)
    X, y = unit_rows(30, 3, seed=5), rng.integers(0, 4, 30).astype(float)
    a = cls(s, SeededNoise(1))
    keep = cls.needs_retained_data
    steps = a.learn(X, y, ArrayRetained(np.zeros(0, int), np.zeros((0, 3)), np.zeros(0)) if keep else None)
    assert a.published().shape == (int(np.prod(cls.published_shape(s))),) and cls.published_shape(s)[-2:] == (4, 4)
    b = cls.from_state(s, unpack_state(pack_state(a.state())), SeededNoise(1))
    a.noise = SeededNoise(2)
    b.noise = SeededNoise(2)
    assert np.array_equal(a.published(), b.published())
    store = ArrayRetained(steps, X, y) if keep else None
    for e in (a, b):
        e.forget([int(steps[4])], store)
    assert np.array_equal(a.published(), b.published())
    preds, probs = a.predict(X[:3])
    assert probs.shape == (3, 4) and np.allclose(probs.sum(axis=1), 1.0)
    assert set(preds.tolist()) <= {0.0, 1.0, 2.0, 3.0}


def test_passive_softmax_takes_the_numpy_loop(monkeypatch):
    """The compiled OGD kernel is scalar-score only: softmax learning never reaches it (routed by the loss)."""
    from app.unlearning.mechanism import fast

    def boom(*a, **k):
        raise AssertionError("the compiled kernel was called for softmax")

    monkeypatch.setattr(fast, "ogd_steps", boom)
    e = PassiveOLU(sspec("passive_olu"))
    assert not fast.supported(e.schedule, e.loss)
    e.learn(unit_rows(5, 3, seed=1), np.array([0.0, 1.0, 2.0, 1.0, 0.0]))
    assert e.step == 5
