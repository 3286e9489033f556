"""Memory pair (draft 003): curvature bound, removal sign, odometer, capacity, gate, state, retrain."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from app.unlearning.contract.errors import CapacityExhausted, ForgetError, SpecError
from app.unlearning.contract.spec import ModelSpec
from app.unlearning.contract.unlearner import ArrayRetained
from app.unlearning.families.memory_pair import MemoryPair, UncertifiedMemoryPair, example_digest
from app.unlearning.families.memory_pair_curvature import CurvatureMemory
from app.unlearning.mechanism.noise import SeededNoise


class ZeroNoise:
    """The deterministic part of a deletion (the removal step alone)."""

    def standard_normal(self, size: int) -> np.ndarray:
        return np.zeros(size)

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        return np.zeros(size, dtype=np.int64)


def make_spec(dim=4, loss="logistic", l2=0.05, R=5.0, rho=1.0, **hp) -> ModelSpec:
    return ModelSpec("memory_pair", loss, dim, 1.0, 1.0, R, l2, 1.0, 1e-5, rho, hp)


def make_data(seed: int, n: int, dim: int = 4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    w = rng.normal(size=dim) * 2
    y = (X @ w + 0.5 * rng.normal(size=n) > 0).astype(float)
    return X, y


# ---- ||B^-1|| <= 1/lam -----------------------------------------------------------------------------------
def dense_bfgs(lam, m0, pairs, p):
    """Independent dense reference: B = lam I + M, M from the direct BFGS recursion."""
    M = m0 * np.eye(p)
    for s, r in pairs:
        Ms = M @ s
        M = M - np.outer(Ms, Ms) / (s @ Ms) + np.outer(r, r) / (r @ s)
    return lam * np.eye(p) + M


@given(seed=st.integers(0, 2**32 - 1), p=st.integers(1, 6), memory=st.integers(1, 8),
       lam=st.floats(1e-3, 1.0), n=st.integers(0, 30))
def test_inverse_hessian_norm_bounded(seed, p, memory, lam, n):
    rng = np.random.default_rng(seed)
    kappa = 2.0
    mem = CurvatureMemory(lam, kappa, memory, p)
    for _ in range(n):  # arbitrary pairs, including adversarial ones the acceptance rule must reject
        s = rng.normal(size=p) * 10 ** rng.uniform(-3, 2)
        if rng.random() < 0.7:
            A = rng.normal(size=(p, p))
            A = A @ A.T
            A *= kappa / max(np.linalg.eigvalsh(A).max(), 1e-12) * rng.uniform(0.01, 1)
            r = A @ s
        else:
            r = rng.normal(size=p) * 10 ** rng.uniform(-3, 3)
        mem.add(s, r)
    H = mem.inverse_matrix()
    assert np.allclose(H, H.T, atol=1e-8 / lam)
    ev = np.linalg.eigvalsh(0.5 * (H + H.T))
    assert ev.min() > 0
    assert ev.max() <= (1.0 / lam) * (1 + 1e-9)
    # the fast operator is the B^-1 of the dense recursion
    pairs = [(mem.S[i], mem.R[i]) for i in range(mem.count)]
    B = dense_bfgs(lam, mem.initial_scaling(), pairs, p)
    assert np.linalg.eigvalsh(B).min() >= lam * (1 - 1e-9)
    np.testing.assert_allclose(H, np.linalg.inv(B), rtol=1e-5, atol=1e-8 / lam)


def standard_two_loop_inverse(h0, pairs, p):
    """Textbook L-BFGS inverse (H0 = h0 I, then H+ = V^T H V + rho s s^T) as a dense matrix."""
    H = h0 * np.eye(p)
    for s, y in pairs:
        rho = 1.0 / (y @ s)
        V = np.eye(p) - rho * np.outer(y, s)
        H = V.T @ H @ V + rho * np.outer(s, s)
    return H


def test_negative_control_clamping_h0_alone_does_not_bound_inverse():
    """h0 <= 1/lam and s.y >= lam||s||^2 are not enough for the usual recursion: ||H|| blows past 1/lam."""
    lam, c = 0.1, 3.0
    # s.y = 1 >= lam ||s||^2, and y = A s for A = [[1, c], [c, 100]] > lam I
    s, y = np.array([1.0, 0.0]), np.array([1.0, c])
    H = standard_two_loop_inverse(1.0 / lam, [(s, y)], 2)
    assert np.linalg.eigvalsh(H).max() > 10 * (1.0 / lam)
    # the shifted memory given the same pair (as data-term pair r = y - lam s) stays bounded
    mem = CurvatureMemory(lam, 200.0, 4, 2)
    mem.add(s, y - lam * s)
    assert np.linalg.eigvalsh(mem.inverse_matrix()).max() <= 1.0 / lam * (1 + 1e-12)


def test_learner_memory_bounded_on_real_runs():
    for loss in ("logistic", "squared", "huber"):
        X, y = make_data(3, 200)
        if loss != "logistic":
            y = np.clip(X @ np.ones(4) * 0.5, -1, 1)
        e = MemoryPair(make_spec(loss=loss, l2=0.02, memory=5))
        e.learn(X, y)
        assert e.mem.count == 5
        assert np.linalg.eigvalsh(e.mem.inverse_matrix()).max() <= (1 / e.lam) * (1 + 1e-9)
        assert np.linalg.norm(e.theta) <= e.spec.domain_radius * (1 + 1e-12)


# ---- removal step: sign and scale -----------------------------------------------------------------------
class WrongSign(UncertifiedMemoryPair):
    removal_sign = -1.0  # the draft's "theta <- theta - d" with d = B^-1 g


def _toward_never_learned(cls, removal="loo", seeds=range(40), n=120, curvature="shanno_phua"):
    """For each seed: learn a stream with a point at a random position in the second half, forget it (no noise).
    Returns (distance to the never-learned run before, after) per seed.  The never-learned run skips the
    point and keeps the clock (ARCHITECTURE.md §5)."""
    out = []
    for seed in seeds:
        rng = np.random.default_rng(1000 + seed)
        X, y = make_data(seed, n)
        u = int(rng.integers(n // 2, n))  # 1-based position of the forgotten point
        sp = make_spec(removal=removal, initial_curvature=curvature)
        full = cls(sp, ZeroNoise())
        steps = full.learn(X, y)
        ref = cls(sp, ZeroNoise())
        ref.learn(X[: u - 1], y[: u - 1])
        ref.skip()
        ref.learn(X[u:], y[u:])
        before = np.linalg.norm(full.theta - ref.theta)
        full.forget([u], ArrayRetained(steps, X, y))
        after = np.linalg.norm(full.theta - ref.theta)
        out.append((before, after))
    return np.array(out)


# With the Shanno-Phua scaling the learner's steps are (1/t) B^-1 g with B close to the curvature, so a record's
# influence on the model is close to B^-1 g / n and the removal step is meaningful: the sign test runs there.
def test_forget_moves_back_toward_never_learned_model():
    d = _toward_never_learned(UncertifiedMemoryPair)  # shanno_phua: measured, refused by the service
    improved = d[:, 1] < d[:, 0]
    assert improved.mean() >= 0.8, improved.mean()
    assert np.median(d[:, 1] / d[:, 0]) < 0.6


def test_negative_control_wrong_sign_moves_away():
    d = _toward_never_learned(WrongSign)
    assert (d[:, 1] > d[:, 0]).mean() >= 0.9
    assert np.median(d[:, 1] / d[:, 0]) > 1.3


def test_negative_control_full_newton_step_overshoots():
    d = _toward_never_learned(UncertifiedMemoryPair, removal="full", seeds=range(15))
    assert np.median(d[:, 1] / d[:, 0]) > 5.0


def test_default_scaling_removal_step_does_not_hurt_on_average():
    """Default initial_curvature: the record's influence is not ~ B^-1 g / n (measured, docs/memory_pair.md);
    the step is small and at least not harmful on average, while the wrong sign is."""
    d = _toward_never_learned(MemoryPair, curvature=1e-3)
    w = _toward_never_learned(WrongSign, curvature=1e-3)
    assert np.median(d[:, 1] / d[:, 0]) < 1.0 < np.median(w[:, 1] / w[:, 0])


def test_single_point_learn_then_forget_is_exact():
    e = MemoryPair(make_spec())
    X, y = make_data(0, 1)
    steps = e.learn(X, y)
    (cert,) = e.forget(steps, ArrayRetained(steps, X, y))
    assert cert.mechanism == "exact" and cert.rho == 0.0
    assert np.array_equal(e.theta, np.zeros(5)) and e.rho_spent == 0.0


# ---- noise calibration from public quantities -----------------------------------------------------------
def test_sigma_is_public_and_step_clipped():
    X, y = make_data(1, 60)
    certs = []
    for u in (3, 40):  # very different records, same public state
        e = MemoryPair(make_spec(capacity=8, rho=0.5), SeededNoise(0))
        steps = e.learn(X, y)
        (c,) = e.forget([u], ArrayRetained(steps, X, y))
        certs.append(c)
    assert certs[0].sigma == certs[1].sigma
    e = MemoryPair(make_spec(capacity=8, rho=0.5))
    assert certs[0].details["shift"] == pytest.approx(e.L / e.lam / 59)
    assert certs[0].sensitivity == certs[0].details["shift"] + certs[0].details["grid"] * math.sqrt(e.p)
    assert certs[0].sigma == pytest.approx(certs[0].sensitivity / math.sqrt(2 * 0.5 / 8))
    assert certs[0].rho == pytest.approx(certs[0].sensitivity**2 / (2 * certs[0].sigma**2))


def test_removal_step_never_exceeds_public_bound():
    """Even with a forged B^-1 (memory bypassed) the step is clipped to Delta."""
    X, y = make_data(2, 50)
    e = MemoryPair(make_spec(), ZeroNoise())
    steps = e.learn(X, y)
    e.mem.inverse_apply = lambda v: 1e6 * v  # a broken curvature model
    before = e.theta.copy()
    (c,) = e.forget([7], ArrayRetained(steps, X, y))
    moved = np.linalg.norm(e.theta - before)
    assert moved <= c.sensitivity * (1 + 1e-12)
    # the clip was active: the step is Delta, up to the grid rounding (release.py)
    assert moved == pytest.approx(c.details["shift"], abs=c.details["grid"] * math.sqrt(e.p))


# ---- odometer --------------------------------------------------------------------------------------------
@given(capacity=st.integers(1, 6), rho=st.floats(0.01, 10.0),
       ops=st.lists(st.tuples(st.sampled_from(["learn", "forget", "forget2"]), st.integers(1, 5)), max_size=14),
       seed=st.integers(0, 1000))
def test_odometer_never_exceeds_budget(capacity, rho, ops, seed):
    X, y = make_data(seed, 200)
    e = MemoryPair(make_spec(capacity=capacity, rho=rho), SeededNoise(seed))
    store = ArrayRetained(np.arange(1, 201), X, y)
    pos, alive = 0, []
    for op, k in ops:
        if op == "learn":
            steps = e.learn(X[pos:pos + k], y[pos:pos + k])
            pos += k
            alive += list(steps)
            continue
        want = alive[: (1 if op == "forget" else 2)]
        if not want:
            continue
        left = e.capacity_left
        snap = e.state()
        charged = sum(1 for j in range(len(want)) if e.n_active - j > 1)
        if charged > left:
            with pytest.raises(CapacityExhausted):
                e.forget(want, store)
            assert all(np.array_equal(np.asarray(snap[k_]), np.asarray(v)) for k_, v in e.state().items())
        else:
            e.forget(want, store)
            alive = alive[len(want):]
        assert e.rho_spent <= rho
        assert e.deletions <= capacity
        assert e.ledger()["capacity_left"] == capacity - e.deletions
        assert (e.status == "retrain_required") == (e.deletions == capacity)


def test_refusal_at_capacity_then_retrain_restores():
    X, y = make_data(5, 80)
    e = MemoryPair(make_spec(capacity=3, rho=0.3), SeededNoise(1))
    store = ArrayRetained(np.arange(1, 81), X, y)
    e.learn(X, y)
    e.forget([1, 2], store)
    e.forget([3], store)
    assert e.status == "retrain_required"
    assert e.rho_spent == pytest.approx(0.3)
    with pytest.raises(CapacityExhausted):
        e.forget([4], store)
    kept = ArrayRetained(np.arange(4, 81), X[3:], y[3:])
    e.retrain(kept)
    assert e.status == "ready" and e.epoch == 1 and e.rho_spent == 0.0 and e.ledger()["capacity_left"] == 3
    assert e.step == 80  # records keep their step ids
    fresh = MemoryPair(make_spec(capacity=3, rho=0.3))
    fresh.learn(X[3:], y[3:])
    np.testing.assert_array_equal(e.theta, fresh.theta)
    e.forget([4], kept)
    assert e.deletions == 1 and e.deletions_total == 4


# ---- capacity and sample complexity ------------------------------------------------------------------------
def draft_capacity(e: MemoryPair) -> int:
    c, C = e.lam, e.lam + (e.p + e.memory_size) * (e.beta - e.lam)
    gam, dB = e.hp["gamma"], e.hp["delta_b"]
    sigma = (e.L / e.lam / max(1, e.n_active - 1)) / math.sqrt(2 * e.spec.rho / e.capacity)
    num = gam * e.n_inserts - e.L * e.D * math.sqrt(c * C * e.S_grad)
    return max(0, math.floor(num / (e.L * sigma * math.sqrt(2 * math.log(1 / dB))))) if num > 0 else 0


def test_capacity_follows_formula_and_grows_with_inserts():
    X, y = make_data(7, 3000)
    e = MemoryPair(make_spec(gamma=0.2, capacity=4), SeededNoise(2))
    caps = []
    for k in range(0, 3000, 250):
        e.learn(X[k:k + 250], y[k:k + 250])
        assert e.gamma_capacity() == draft_capacity(e)
        caps.append(e.gamma_capacity())
    assert caps[0] == 0 and caps[-1] > 0
    assert all(b >= a for a, b in zip(caps, caps[1:]))  # live capacity grows with insertions
    assert "gamma_capacity" not in e.ledger() and "S_N" not in e.ledger()  # it reads S_N: never published
    e.forget([10], ArrayRetained(np.arange(1, 3001), X, y))
    assert e.S_grad == e.L**2 * 3000  # a deletion replaces S_N by its public bound G^2 N


def _condition(e: MemoryPair, N: int, m: int, msq: float) -> bool:
    c, C = e.curvature_bounds()
    a = e.L * e.D * math.sqrt(c * C * msq)
    scale = 1.0 if e.hp["removal"] == "full" else 1.0 / max(1, N - 1)
    sigma = (scale * e.L / e.lam) / math.sqrt(2 * e.spec.rho / m)
    return a * math.sqrt(N) + m * e.L * sigma * math.sqrt(2 * math.log(1 / e.hp["delta_b"])) <= e.hp["gamma"] * N


@pytest.mark.parametrize("removal", ["loo", "full"])
@pytest.mark.parametrize("gamma", [0.05, 0.5, 2.0])
def test_sample_complexity_is_the_smallest_feasible_N(removal, gamma):
    e = MemoryPair(make_spec(gamma=gamma, removal=removal, capacity=16))
    msq = e.L**2
    N = e.sample_complexity(mean_sq_grad=msq)
    assert _condition(e, N, 16, msq)
    assert not _condition(e, N - 1, 16, msq)


def test_negative_control_draft_closed_form_is_below_threshold():
    """Draft Thm 'gamma-sample complexity': N <= [max{G^2 D sqrt(cC), m L sigma sqrt(2 ln 1/dB)} / gamma]^2.
    With the worst case S_N = G^2 N that value does not satisfy the draft's own condition."""
    e = MemoryPair(make_spec(gamma=0.5, removal="full", capacity=1, rho=1000.0))  # regret term dominates
    c, C = e.curvature_bounds()
    a = e.L**2 * e.D * math.sqrt(c * C)
    b = 1 * e.L * e.sigma_step(2) * math.sqrt(2 * math.log(1 / e.hp["delta_b"]))
    assert a > b > 0
    draft = math.floor((max(a, b) / e.hp["gamma"]) ** 2)
    assert not _condition(e, draft, 1, e.L**2)
    assert e.sample_complexity(m=1, mean_sq_grad=e.L**2) > draft


# ---- inference gate --------------------------------------------------------------------------------------------
def test_inference_gate():
    X, y = make_data(8, 4000)
    off = MemoryPair(make_spec(gamma=1.0))
    assert off.inference_allowed()
    e = MemoryPair(make_spec(gamma=1.0, inference_gate=True))
    assert not e.inference_allowed()
    opened_at = None
    for k in range(4000):
        e.learn(X[k:k + 1], y[k:k + 1])
        if opened_at is None and e.inference_allowed():
            opened_at = e.n_inserts
            assert e.n_inserts >= e.public_sample_complexity()
            break
        assert e.n_inserts < e.public_sample_complexity()
    assert opened_at is not None, "the gate never opened on 4000 inserts"
    assert e.ledger()["inference_allowed"]
    # the gate and the published threshold are the worst case S_N = G^2 N: public, whatever the data
    assert e.public_sample_complexity() == e.sample_complexity(mean_sq_grad=e.L**2)
    assert e.ledger()["sample_complexity"] == MemoryPair(make_spec(gamma=1.0)).ledger()["sample_complexity"]


# ---- state -------------------------------------------------------------------------------------------------
def test_state_round_trip_exact_and_same_future():
    X, y = make_data(9, 150)
    store = ArrayRetained(np.arange(1, 151), X, y)
    spec = make_spec(step="adagrad", memory=4)
    a = MemoryPair(spec, SeededNoise(3))
    a.learn(X[:100], y[:100])
    a.forget([5, 17], store)
    a.learn(X[100:120], y[100:120])
    st_ = a.state()
    for k, v in st_.items():
        assert isinstance(v, (int, float)) or (isinstance(v, np.ndarray) and v.dtype in (np.float64, np.int64)), k
    b = MemoryPair.from_state(spec, st_, SeededNoise(4))
    a.noise = SeededNoise(4)
    for k, v in b.state().items():
        assert np.array_equal(np.asarray(v), np.asarray(st_[k])) and type(v) is type(st_[k]), k
    for e in (a, b):
        e.learn(X[120:150], y[120:150])
        e.forget([130], store)
    for k, v in a.state().items():
        assert np.array_equal(np.asarray(v), np.asarray(b.state()[k])), k
    assert a.ledger() == b.ledger()


# ---- service hooks -----------------------------------------------------------------------------------------
def test_deletion_features_modes():
    assert MemoryPair(make_spec()).needs_retained_data is True
    client = MemoryPair(make_spec(deletion_features="client"))
    assert client.needs_retained_data is False
    X, y = make_data(10, 30)
    client.learn(X, y)
    with pytest.raises(ForgetError):
        client.forget([4])
    sent = ArrayRetained([4], X[3:4], y[3:4])  # what the client sends with the unlearn request
    (c,) = client.forget([4], sent)
    assert c.learned_step == 4
    with pytest.raises(ForgetError):
        client.forget([5], sent)  # features for step 5 were not supplied
    assert example_digest(X[3], y[3]) == example_digest(X[3].copy(), float(y[3]))
    assert example_digest(X[3], y[3]) != example_digest(X[4], y[4])


@pytest.mark.parametrize("hp", [{"memory": 0}, {"step": "sgd"}, {"deletion_features": "x"}, {"capacity": 1.5},
                                {"inference_gate": "yes"}, {"gamma": 0}, {"initial_curvature": 0},
                                {"initial_curvature": "bfgs"}, {"burn_in": -1}, {"burn_in": "x"}, {"delta_b": 1.0},
                                {"bogus": 1}])
def test_bad_hyperparameters(hp):
    with pytest.raises(SpecError):
        MemoryPair(make_spec(**hp))


@pytest.mark.parametrize("hp, words", [({"burn_in": 0}, "burn_in = 0 is refused"),
                                       ({"burn_in": 5}, "burn_in = 5 is refused"),
                                       ({"initial_curvature": "shanno_phua"}, "initial_curvature")])
def test_settings_measured_under_noised_are_refused(hp, words):
    """Issue 14 (4): burn_in below ceil(beta/lam) (the draft's learner reached 1.88 Delta) and the Shanno-Phua
    scaling (1.25 Delta) would sign false certificates; the measurement-only class still builds them."""
    sp = make_spec(**hp)
    least = math.ceil(MemoryPair(make_spec()).beta / 0.05)  # logistic, l2 = 0.05: beta = 2/4 + 0.05, least = 12
    assert least == MemoryPair(make_spec()).burn_in > 5  # so burn_in = 5 is below the measured length
    with pytest.raises(SpecError, match=words):
        MemoryPair.normalize_hyperparameters(sp)  # creation (app.registry.build_spec)
    assert MemoryPair.normalize_hyperparameters(make_spec(burn_in=least))["burn_in"] == least  # accepted
    with pytest.raises(SpecError, match=f"integer >= {least}"):
        MemoryPair.normalize_hyperparameters(make_spec(burn_in=least - 1))
    # a model stored before the refusal loads and learns, and forgets exactly, never with a certificate under the
    # refused settings (issue 29 item 4; was NotDeletable: the record could never be forgotten): an exact retrain
    # without the record (retained mode), a restart (client mode)
    X, y = make_data(3, 40)
    old = MemoryPair(sp, SeededNoise(1))
    steps = old.learn(X, y)
    (c,) = old.forget([20], ArrayRetained(steps, X, y))
    assert (c.mechanism, c.rho, c.details["restart"]) == ("exact", 0.0, 1.0)
    keep = steps != 20
    ref = MemoryPair(sp, SeededNoise(1))
    ref.retrain(ArrayRetained(steps[keep], X[keep], y[keep]))
    assert np.array_equal(old.published(), ref.published()) and old.n_active == 39 and old.epoch == 1
    client = MemoryPair(make_spec(**hp, deletion_features="client"), SeededNoise(1))
    client.learn(X, y)
    (c,) = client.forget([20], ArrayRetained([20], X[19:20], y[19:20]))
    assert (c.mechanism, c.details["restart"]) == ("exact", 1.0) and not client.published().any()
    assert client.n_active == 0 and client.epoch_start == 40
    # the measurement-only class forgets under them (bench/, tests/)
    u = UncertifiedMemoryPair(sp, SeededNoise(1))
    u.learn(X, y)
    (c,) = u.forget([20], ArrayRetained(steps, X, y))
    assert c.mechanism == "discrete_gaussian"


def test_defaults():
    hp = MemoryPair.normalize_hyperparameters(make_spec())
    assert hp == {"memory": 10, "initial_curvature": 1e-3, "burn_in": "auto", "step": "strongly_convex",
                  "capacity": 32, "deletion_features": "retained",
                  "inference_gate": False, "gamma": 0.5, "delta_b": 0.05, "removal": "loo"}


# ---- replay gap: what the certificate assumes -------------------------------------------------------------
GAP_CASE = __import__("pathlib").Path(__file__).parent / "data" / "memory_pair_gap_case.csv"


def _gap_ratio(X, y, u, l2, R, no_pairs=False, **hp):
    """(gap before, gap after the removal step) / Delta against the exact replay (record skipped, clock kept)."""
    sp = ModelSpec("memory_pair", "logistic", X.shape[1], 1.0, 1.0, R, l2, 1.0, 1e-5, 1.0, hp)
    e, ref = UncertifiedMemoryPair(sp, ZeroNoise()), UncertifiedMemoryPair(sp, ZeroNoise())
    if no_pairs:  # the memory-free limit: B = lam I, i.e. plain projected OGD with eta_t = 1/(lam t)
        for m in (e, ref):
            m.mem.add = lambda s, r: False
            m.mem.initial_scaling = lambda: 0.0
    steps = e.learn(X, y)
    ref.learn(X[: u - 1], y[: u - 1])
    ref.skip()
    ref.learn(X[u:], y[u:])
    before = np.linalg.norm(e.theta - ref.theta)
    (c,) = e.forget([u], ArrayRetained(steps, X, y))
    return before / c.sensitivity, np.linalg.norm(e.theta - ref.theta) / c.sensitivity


def test_known_case_replay_gap_exceeds_delta():
    """Characterisation, not a wish: the certificate assumes gap <= Delta, and it is FALSE on this stream
    (found by random search, bench/memory_pair/memory_pair_replay.py; docs/memory_pair.md).  The memory-free limit of the
    same learner (plain OGD) stays far inside.  If a change makes the first assertion fail, update the docs."""
    M = np.loadtxt(GAP_CASE, delimiter=",")
    X, y = M[:, :2], M[:, 2]
    l2, R, u = float.fromhex("0x1.286ad2b9a5040p-2"), float.fromhex("0x1.09187981b322dp+0"), 2
    before, after = _gap_ratio(X, y, u, l2, R, burn_in=0)  # the draft's learner: pairs from the first insert
    assert after > 1.5 and before > 1.5
    before0, after0 = _gap_ratio(X, y, u, l2, R, no_pairs=True)
    assert after0 < 0.5 and before0 < 0.5
    _, after_default = _gap_ratio(X, y, u, l2, R)  # default burn_in="auto": no pairs in the first beta/lam steps
    assert after_default < 1.0


@given(seed=st.integers(0, 2**31), n=st.integers(20, 80), u=st.integers(1, 20))
def test_memory_free_limit_replay_gap_within_delta(seed, n, u):
    """Plain OGD (the B = lam I limit) is the case the contraction argument of passive OLU covers (for the
    capped schedule; here uncapped, projected): the harness must report gap <= Delta there.  The memory pair
    itself gets no such test because it fails (test_known_case_replay_gap_exceeds_delta)."""
    X, y = make_data(seed, n, dim=3)
    u = min(u, n)
    before, _ = _gap_ratio(X, y, u, 0.05, 3.0, no_pairs=True)
    assert before <= 1.0 + 1e-9


def test_deletion_noise_has_the_certified_scale():
    """Over seeded noise draws, the per-coordinate spread of the unlearned model is the certificate's sigma and
    its mean is the noise-free removal (noise centred, added once, in parameter units)."""
    X, y = make_data(12, 40, dim=2)
    sp = make_spec(dim=2, R=1e4, capacity=2, rho=0.5)
    base = MemoryPair(sp)
    steps = base.learn(X, y)
    store = ArrayRetained(steps, X, y)
    st_ = base.state()
    clean = MemoryPair.from_state(sp, st_, ZeroNoise())
    clean.forget([7], store)
    outs, sigma = [], None
    for seed in range(600):
        e = MemoryPair.from_state(sp, st_, SeededNoise(seed))
        (c,) = e.forget([7], store)
        sigma = c.sigma
        outs.append(e.theta)
    outs = np.array(outs)
    np.testing.assert_allclose(outs.std(axis=0), sigma, rtol=0.1)
    assert np.all(np.abs(outs.mean(axis=0) - clean.theta) < 4 * sigma / math.sqrt(600))


def test_odometer_exact_at_large_capacity():
    """m = 10000 uniform steps: the last one still fits and rho_spent never exceeds rho_tot (no drift)."""
    X, y = make_data(13, 3, dim=2)
    e = MemoryPair(make_spec(dim=2, capacity=10_000, rho=0.7), SeededNoise(0))
    e.learn(X, y)
    e.deletions = 9_999
    e.rho_spent = 9_999 * e.rho_step
    assert e.ledger()["capacity_left"] == 1
    e.forget([1], ArrayRetained([1, 2, 3], X, y))
    assert e.rho_spent <= 0.7 and e.status == "retrain_required"
    with pytest.raises(CapacityExhausted):
        e.forget([2], ArrayRetained([1, 2, 3], X, y))
