"""The compiled OGD loop (app/unlearning/mechanism/fast.py) gives the numpy loop's results (round-off only)."""
from __future__ import annotations

import numpy as np
import pytest

from app.unlearning import ALGORITHMS, ModelSpec, SeededNoise
from app.unlearning.mechanism import fast

needs_numba = pytest.mark.skipif(not fast.available(), reason=f"compiled fast path unavailable: "
                                                               f"{fast.unavailable_reason() or 'disabled'}")

CASES = [
    ("passive_olu", "logistic", {"schedule": "strongly_convex_capped"}),
    ("passive_olu", "squared", {"schedule": "strongly_convex_capped"}),
    ("passive_olu", "huber", {"schedule": "strongly_convex_capped", "huber_delta": 0.5}),
    ("passive_olu", "logistic", {"schedule": "strongly_convex"}),
    ("passive_olu", "squared", {"schedule": "convex_constant"}),
    ("passive_olu", "huber", {"schedule": "regularized_convex", "horizon": 500, "max_deletions": 5}),
    ("passive_olu_restart", "logistic", {"max_deletions": 3, "horizon": 1000}),
]


@pytest.fixture(autouse=True, scope="module")
def _kernels_loaded():
    fast.warm_up()  # requests never wait for the compiler (issue 23); these tests compare the two loops


def _spec(algorithm, loss, hp, dim, radius, l2=0.05):
    cls = ALGORITHMS[algorithm]
    spec = ModelSpec(algorithm=algorithm, loss=loss, dim=dim, x_norm=1.0, y_abs=2.0, domain_radius=radius, l2=l2,
                     epsilon=1.0, delta=1e-6, rho=0.0175, hyperparameters=hp)
    return spec.with_hyperparameters(cls.normalize_hyperparameters(spec)), cls


def _stream(rng, n, dim, loss):
    X = rng.standard_normal((n, dim))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True)) * rng.uniform(1.0, 1.5, size=(n, 1))
    y = rng.integers(0, 2, n).astype(float) if loss == "logistic" else rng.uniform(-2, 2, n)
    return X, y


@needs_numba
@pytest.mark.parametrize("algorithm,loss,hp", CASES, ids=[f"{a}-{l}-{h.get('schedule', 'default')}" for a, l, h in CASES])
@pytest.mark.parametrize("seed", range(4))
def test_compiled_loop_matches_numpy(algorithm, loss, hp, seed):
    rng = np.random.default_rng(seed)
    dim = int(rng.integers(1, 40))
    radius = float(rng.choice([0.3, 2.0, 50.0]))  # small radii make the projection bind
    spec, cls = _spec(algorithm, loss, hp, dim, radius)
    fast_engine, slow_engine = cls(spec, SeededNoise(seed)), cls(spec, SeededNoise(seed))
    assert fast.supported(fast_engine.schedule, fast_engine.loss)
    for batch in (1, 7, 300, 1, 50):  # several calls: the clock carries over between batches
        X, y = _stream(rng, batch, dim, loss)
        steps_fast = fast_engine.learn(X, y)
        previous = fast.set_enabled(False)
        try:
            steps_slow = slow_engine.learn(X, y)
        finally:
            fast.set_enabled(previous)
        assert np.array_equal(steps_fast, steps_slow)
        assert fast_engine.step == slow_engine.step and fast_engine.last_eta == slow_engine.last_eta
        np.testing.assert_allclose(fast_engine.theta, slow_engine.theta, rtol=0, atol=1e-12)
    # forgetting afterwards sees the same state and the same certified constants
    u = fast_engine.step - 2
    c_fast, c_slow = fast_engine.forget([u]), slow_engine.forget([u])
    assert [c.sigma for c in c_fast] == [c.sigma for c in c_slow]
    np.testing.assert_allclose(fast_engine.theta, slow_engine.theta, rtol=0, atol=1e-12)


@needs_numba
@pytest.mark.parametrize("algorithm,loss,hp", CASES, ids=[f"{a}-{l}-{h.get('schedule', 'default')}" for a, l, h in CASES])
def test_switching_loop_mid_stream_stays_within_the_roundoff_floor(algorithm, loss, hp):
    """Issue 23: a model learns on the numpy loop until the compiled kernels have loaded, then on the compiled loop.
    Its state differs from a run on one loop throughout by less than the round-off floor every certificate already
    adds to its shift (passive.py roundoff_floor: two float64 runs of the same steps, each within step_roundoff of
    the exact map per step), so the certified noise covers the switch."""
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        dim = int(rng.integers(1, 40))
        spec, cls = _spec(algorithm, loss, hp, dim, float(rng.choice([0.3, 2.0, 50.0])))
        mixed, numpy_only, compiled_only = (cls(spec, SeededNoise(seed)) for _ in range(3))
        switch = int(rng.integers(1, 400))
        X, y = _stream(rng, 400, dim, loss)
        previous = fast.set_enabled(False)
        try:
            mixed.learn(X[:switch], y[:switch])
            numpy_only.learn(X, y)
        finally:
            fast.set_enabled(previous)
        mixed.learn(X[switch:], y[switch:])
        compiled_only.learn(X, y)
        floor = mixed.roundoff_floor(1, mixed.step)
        assert floor > 0
        for other in (numpy_only, compiled_only):
            assert float(np.linalg.norm(mixed.theta - other.theta)) <= floor


def test_numpy_path_until_the_kernels_load(monkeypatch):
    """No caller waits for the compiler: before the kernels are loaded ``supported`` is False (the numpy loop runs)
    and the noise step and the discrete Gaussian sampler take their numpy / pure routes, with the same draws."""
    from app.unlearning.mechanism import fast_dgauss, noise

    monkeypatch.setattr(fast, "_kernel", None)
    # as if the background compilation were still running (and none is started here)
    monkeypatch.setattr(fast._background, "start", lambda: None)
    monkeypatch.setattr(fast_dgauss, "_ready", False)
    monkeypatch.setattr(fast_dgauss._background, "start", lambda: None)
    spec, cls = _spec("passive_olu", "logistic", {}, 3, 2.0)
    engine = cls(spec)
    assert not fast.supported(engine.schedule, engine.loss)
    assert fast_dgauss.secure_release(np.zeros(3), 10.0, 2.0**-8, 1.0) is None
    assert fast_dgauss.secure_discrete_release(np.zeros(3), 1.0, 1.0, 1.0, 1.0) is None
    draws = fast_dgauss.sample(10.0, 50, noise.SeededRandomBits(7))
    assert np.array_equal(draws, noise.sample_discrete_gaussian_pure(10.0, 50, noise.SeededRandomBits(7)))


def test_adaptive_schedule_keeps_the_numpy_loop():
    spec, cls = _spec("passive_olu", "logistic", {"schedule": "adaptive"}, 3, 2.0)
    engine = cls(spec)
    assert not fast.supported(engine.schedule, engine.loss)


def test_batch_commitments_equal_hmac():
    import secrets

    from app.services.records import commitment, commitment_digests

    for key in (secrets.token_bytes(32), b"", secrets.token_bytes(64), secrets.token_bytes(100)):
        ids = ["a", "", "record-\u00e9\u4e2d", "x" * 256] + [secrets.token_hex(8) for _ in range(20)]
        assert [d.hex() for d in commitment_digests(key, ids)] == [commitment(key, i) for i in ids]
