"""Issue 14 items 1-2: every family releases through the discrete Gaussian on a declared grid (app/unlearning/
release.py), and every certified sensitivity is at least the float64 round-off of the steps in between."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from app.unlearning import ArrayRetained, ModelSpec, SeededNoise
from app.unlearning.mechanism import release
from app.unlearning.families.active import ActiveOLU
from app.unlearning.families.descent_to_delete import DescentToDelete
from app.unlearning.families.memory_pair import MemoryPair
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.verification.replay import coupled_replay
from app.unlearning.families.restart import PassiveOLURestart
from app.unlearning.families.rewind import RewindToDelete


def _is_power_of_two(g: float) -> bool:
    m, _ = math.frexp(g)
    return g > 0 and m == 0.5


# ---- issue 14 case 1/2: the certified shift below float64 resolution --------------------------------------
def test_issue14_shift_below_round_off_is_covered_by_the_certificate():
    """passive_olu, convex_constant, eta 3, l2 0.05 (gamma = 0.85), record learned at u = 1, forgotten at tau = 300:
    the exact-arithmetic shift is 4.5e-21, far below the float64 round-off of 300 steps; the coupled replay's
    published gap was ~1.3e5 times the certified sensitivity before, and must now stay within it."""
    d, R = 16, 10.0
    sp = ModelSpec("passive_olu", "logistic", d, 1.0, 1.0, R, 0.05, 1.0, 1e-6, 0.0175,
                   {"schedule": "convex_constant", "eta": 3.0})
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(300) < 0.5).astype(float)
    e = PassiveOLU(sp, SeededNoise(0))
    e.learn(X, y)
    assert e.shift_bound(1, 300)[2] == pytest.approx(4.5e-21, rel=0.01)  # the case of the issue
    (c,) = e.forget([1])
    assert c.details["shift"] < 1e-20 and c.sensitivity >= c.details["roundoff_floor"] > 1e-16
    (p,) = coupled_replay(lambda n: PassiveOLU(sp, n), X, y, {300: [1]}, seed=0)
    assert p.distance > 0  # round-off really separates the two worlds here
    assert p.distance <= p.shift_bound  # ... and the certified (lattice) sensitivity covers it
    assert p.realized <= p.certified


# ---- the release itself ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sens,n,scale", [(1.0, 3, 1.0), (3.7e-5, 17, 10.0), (4.5e-21, 17, 10.0), (123.0, 1, 0.5),
                                          (1e-300, 2, 1e300)])
def test_grid_is_a_public_power_of_two_and_rounding_costs_at_most_one_part_in_1024(sens, n, scale):
    g = release.grid_resolution(sens, n, scale)
    assert _is_power_of_two(g) and g >= math.ulp(scale)
    if g > math.ulp(scale):
        assert g * math.sqrt(n) <= sens / release.GRID_FACTOR < 2 * g * math.sqrt(n)


def test_release_is_on_the_grid_keeps_rho_and_bounds_the_coupled_gap():
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        x = rng.normal(size=n) * rng.uniform(0.1, 5)
        delta = float(rng.uniform(1e-6, 1.0))
        v = rng.normal(size=n)
        x2 = x + v * (delta * rng.uniform(0, 1) / np.linalg.norm(v))  # a second world within delta
        sigma = delta * float(rng.uniform(0.5, 50))
        seed = int(rng.integers(0, 2**31))
        p1, g, s1, d1 = release.discrete_release(x, delta, sigma, SeededNoise(seed), scale=5.0)
        p2, g2, s2, d2 = release.discrete_release(x2, delta, sigma, SeededNoise(seed), scale=5.0)
        assert (g, s1, d1) == (g2, s2, d2)
        assert release.on_grid(p1, g) and release.on_grid(p2, g)
        assert d1 == delta + g * math.sqrt(n) and d1 <= delta * (1 + 1 / release.GRID_FACTOR)
        # the charge is kept (sigma' only rounded up, by < 2^-28 relative, for the compiled sampler)
        assert d1**2 / (2 * s1**2) == pytest.approx(delta**2 / (2 * sigma**2), rel=1e-8)
        assert d1**2 / (2 * s1**2) <= delta**2 / (2 * sigma**2)
        assert np.linalg.norm(p1 - p2) <= d1  # the lattice sensitivity with the same draw k in both worlds
    # the noise is really there, at the scale asked for
    x = np.zeros(20000)
    p, g, s, _ = release.discrete_release(x, 1.0, 2.0, SeededNoise(1), scale=1.0)
    assert np.std(p) == pytest.approx(s, rel=0.03)


def test_projection_after_the_release_and_an_exact_release():
    x = np.array([3.0, 4.0])
    p, g, s, d = release.discrete_release(x, 0.5, 1e-3, SeededNoise(0), scale=5.0, radius=1.0)
    assert np.linalg.norm(p) == pytest.approx(1.0)
    p0, g0, s0, d0 = release.discrete_release(x, 0.0, 0.0, SeededNoise(0), scale=5.0)
    assert np.array_equal(p0, x) and (g0, s0, d0) == (0.0, 0.0, 0.0)


# ---- every family -----------------------------------------------------------------------------------------
def _stream(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X, (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(float)


def _spec(algorithm, hp, d=3, R=50.0, l2=0.05, rho=50.0, eps=20.0, delta=1e-5):
    return ModelSpec(algorithm, "logistic", d, 1.0, 1.0, R, l2, eps, delta, rho, hp)


FAMILIES = [
    ("passive_olu", PassiveOLU, {}, False),
    ("passive_olu_restart", PassiveOLURestart, {"max_deletions": 2, "horizon": 1000, "c": 1e4}, False),
    ("active_olu", ActiveOLU, {}, True),
    ("descent_to_delete", DescentToDelete, {"variant": "secret", "retrain_when_cheaper": False}, True),
    ("rewind_to_delete", RewindToDelete, {"variant": "rewind", "T": 40, "K": 10, "batch_size": 4, "m_max": 3,
                                          "initial_size": 60}, True),
    ("memory_pair", MemoryPair, {"capacity": 4}, True),
]


@pytest.mark.parametrize("algorithm,cls,hp,holds", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_every_family_publishes_on_its_declared_grid(algorithm, cls, hp, holds):
    X, y = _stream(60, 3)
    e = cls(_spec(algorithm, hp), SeededNoise(3))
    steps = e.learn(X, y, None) if not holds else _learn_holding(e, X, y)
    store = ArrayRetained(steps, X, y)
    (c,) = e.forget([int(steps[-3])], store)
    assert c.mechanism == "discrete_gaussian" and c.sigma > 0
    g = c.details["grid"]
    assert _is_power_of_two(g)
    # Delta' = Delta + g sqrt(d + 1) over the family's own (floored) sensitivity; sigma scaled with it
    assert c.sensitivity >= c.details["roundoff_floor"] and c.sensitivity >= c.details["shift"]
    assert c.sensitivity <= max(c.details["shift"], c.details["roundoff_floor"]) * (1 + 1.001 / release.GRID_FACTOR) \
        or algorithm == "rewind_to_delete"  # rewind's grid is set by its (larger) tail sensitivity
    w = e.published()
    if algorithm != "rewind_to_delete":  # (rewind does not project its release)
        assert np.linalg.norm(w) < e.spec.domain_radius * (1 - 1e-9)  # the projection did not bind here ...
    assert release.on_grid(w, g)  # ... so the published point is g times integers


def _learn_holding(e, X, y):
    if isinstance(e, (RewindToDelete,)):
        return e.learn(X, y, None)
    if isinstance(e, DescentToDelete):
        return e.learn(X, y, None)
    steps = []
    for i in range(len(y)):
        steps.extend(e.learn(X[i : i + 1], y[i : i + 1], ArrayRetained(np.arange(1, i + 1), X[:i], y[:i])))
    return np.asarray(steps)


# ---- the production release in one compiled call (fast_dgauss.secure_release) --------------------------------
class _KeyBits:
    """The stream SecureRandomBits would give for a known key (tests only)."""

    def __init__(self, key: bytes):
        self.key = key

    def stream(self):
        from app.unlearning.mechanism.noise import ChaChaBits
        return ChaChaBits(self.key)


@pytest.mark.parametrize("radius", [0.5, 100.0, None])
def test_secure_release_is_the_general_release_for_the_same_key(monkeypatch, radius):
    """With SecureGaussianNoise, add_discrete_noise draws and rounds in one compiled call; for the same os.urandom
    key that is exactly the pure sampler's draws rounded by fast.grid_noise_step (the general route)."""
    from app.unlearning.mechanism import fast, fast_dgauss
    from app.unlearning.mechanism.noise import SecureGaussianNoise, sample_discrete_gaussian_pure
    if not fast_dgauss.available():
        pytest.skip("numba not available")
    fast_dgauss.warm_up()

    def separate_draw(self, sigma, size):
        raise AssertionError("the production release draws inside the compiled call, not through discrete_gaussian")

    monkeypatch.setattr(SecureGaussianNoise, "discrete_gaussian", separate_draw)
    rng = np.random.default_rng(9)
    calls = []
    for i in range(40):
        key = rng.bytes(32)
        # only fast_dgauss's view of os (numba's cache needs the real os.urandom)
        monkeypatch.setattr(fast_dgauss, "os", SimpleNamespace(urandom=lambda n, key=key: calls.append(n) or key))
        theta = rng.normal(size=int(rng.integers(1, 40))) * rng.uniform(0.01, 3)
        grid = 2.0 ** int(rng.integers(-30, -5))
        sigma = fast_dgauss.sigma_for_fast_path(float(10 ** rng.uniform(-1, 6)))
        got = release.add_discrete_noise(theta, grid, sigma * grid, SecureGaussianNoise(), radius)
        k = sample_discrete_gaussian_pure(sigma, theta.shape[0], _KeyBits(key))
        np.testing.assert_array_equal(got, fast.grid_noise_step(theta, k, grid, radius))
    assert calls == [32] * 40  # one fresh key per release, through the compiled path


def test_secure_release_hands_a_draw_outside_the_bounds_to_the_pure_path(monkeypatch):
    """A candidate outside the kernel's int64 bounds (forced here with ymax = 12): the pure path redoes that draw
    from the same bit position and the result is still the general release's."""
    from app.unlearning.mechanism import fast, fast_dgauss
    from app.unlearning.mechanism.noise import sample_discrete_gaussian_pure
    if not fast_dgauss.available():
        pytest.skip("numba not available")
    fast_dgauss.warm_up()
    kernel = fast_dgauss._compiled
    stopped = []

    def tight(key, start_pos, start, n, d, t, ttd, two_n, vmax, ymax, k):
        done, pos = kernel(key, start_pos, start, n, d, t, ttd, two_n, vmax, 12, k)
        stopped.append(done)
        return done, pos

    def release_kernel(key, p, q, theta, grid, radius, out):  # the release kernel under the same tight bound
        done, _ = tight(key, 0, 0, *fast_dgauss.params(p / q)[4], np.empty(theta.shape[0], dtype=np.int64))
        return done

    monkeypatch.setattr(fast_dgauss, "_compiled_release", release_kernel)
    monkeypatch.setattr(fast_dgauss, "_compiled", tight)
    key = bytes(range(32))
    monkeypatch.setattr(fast_dgauss, "os", SimpleNamespace(urandom=lambda n: key))
    theta = np.linspace(-1, 1, 200)
    got = fast_dgauss.secure_release(theta, 10.0, 2.0**-8, 0.9)
    k = sample_discrete_gaussian_pure(10.0, 200, _KeyBits(key))
    assert np.abs(k).max() > 12 and stopped[0] < 200  # the kernel did stop
    np.testing.assert_array_equal(got, fast.grid_noise_step(theta, k, 2.0**-8, 0.9))


class _KeyNoise:
    """A noise source whose discrete draws are the pure sampler's on a known key (the general Python route)."""

    def __init__(self, key: bytes):
        self.key = key

    def discrete_gaussian(self, sigma, size):
        from app.unlearning.mechanism.noise import sample_discrete_gaussian_pure
        return sample_discrete_gaussian_pure(sigma, size, _KeyBits(self.key))


def _release_cases(rng, count):
    for i in range(count):
        n = int(rng.integers(1, 70))
        theta = rng.normal(size=n) * rng.uniform(1e-3, 3)
        sens = float(10 ** rng.uniform(-22, 1)) if i % 7 else 0.0
        sigma = float(10 ** rng.uniform(-3, 3)) * (sens if sens > 0 else 1e-6)
        scale = float(10 ** rng.uniform(-2, 3))
        radius = [None, scale, float(rng.uniform(0.05, 2))][i % 3]
        yield theta, sens, sigma, scale, radius
    # edge cases: sigma'/g below 1, beyond the kernel's bounds (Python route), a grid at the ulp floor, tiny shift
    yield np.array([0.3, -0.2]), 1e-3, 1e-9, 1.0, 1.0
    yield np.array([0.3, -0.2, 5.0]), 1e-3, 1e9, 1.0, None
    yield np.full(17, 0.5), 1e-300, 1e-299, 1e3, 1.0
    yield np.linspace(-1, 1, 17), 4.5e-21, 5e-20, 1.0, 1.0


def test_secure_discrete_release_is_the_python_release_for_the_same_key(monkeypatch):
    """discrete_release with the production source runs grid, sigma', the 29-bit rounding, the exact ratio, the
    draws and the rounding in one compiled call (fast_dgauss.secure_discrete_release): for the same os.urandom key
    every output is bit-identical to the Python route's (grid_resolution, sigma_for_fast_path, the pure sampler,
    fast.grid_noise_step)."""
    from app.unlearning.mechanism import dgauss_kernel, fast_dgauss
    from app.unlearning.mechanism.noise import SecureGaussianNoise
    if not fast_dgauss.available():
        pytest.skip("numba not available")
    fast_dgauss.warm_up()
    assert dgauss_kernel._GRID_FACTOR == release.GRID_FACTOR
    assert dgauss_kernel._P_MAX_K == fast_dgauss._P_MAX and dgauss_kernel._TQ_MAX_K == fast_dgauss._TQ_MAX
    rng = np.random.default_rng(14)
    compiled = []
    kernel = fast_dgauss._compiled_discrete_release

    def counting(*args):
        r = kernel(*args)
        compiled.append(r[0])
        return r

    monkeypatch.setattr(fast_dgauss, "_compiled_discrete_release", counting)
    for theta, sens, sigma, scale, radius in _release_cases(rng, 300):
        key = rng.bytes(32)
        monkeypatch.setattr(fast_dgauss, "os", SimpleNamespace(urandom=lambda n, key=key: key))
        got = release.discrete_release(theta, sens, sigma, SecureGaussianNoise(), scale=scale, radius=radius)
        want = release.discrete_release(theta, sens, sigma, _KeyNoise(key), scale=scale, radius=radius)
        assert got[1:] == want[1:], (sens, sigma, scale)
        if compiled[-1] >= 0:  # (a sigma'/g beyond the kernel's bounds draws from noise's own os.urandom key)
            np.testing.assert_array_equal(got[0], want[0])
    assert sum(1 for d in compiled if d > 0) >= 290 and -1 in compiled  # both routes were taken


def test_secure_discrete_release_redraws_when_the_kernel_stops(monkeypatch):
    """When a draw leaves the kernel's bounds the same key is redrawn (pure path for that draw) and rounded by the
    general route: the same published vector as the Python route."""
    from app.unlearning.mechanism import fast_dgauss
    from app.unlearning.mechanism.noise import SecureGaussianNoise
    if not fast_dgauss.available():
        pytest.skip("numba not available")
    fast_dgauss.warm_up()
    kernel = fast_dgauss._compiled_discrete_release
    monkeypatch.setattr(fast_dgauss, "_compiled_discrete_release", lambda *a: (3,) + tuple(kernel(*a)[1:]))
    key = bytes(range(32))
    monkeypatch.setattr(fast_dgauss, "os", SimpleNamespace(urandom=lambda n: key))
    theta = np.linspace(-1, 1, 40)
    got = release.discrete_release(theta, 1e-2, 0.3, SecureGaussianNoise(), scale=1.0, radius=0.9)
    want = release.discrete_release(theta, 1e-2, 0.3, _KeyNoise(key), scale=1.0, radius=0.9)
    assert got[1:] == want[1:]
    np.testing.assert_array_equal(got[0], want[0])
