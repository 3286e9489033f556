"""The exact families' OGD loop (app/unlearning/mechanism/exact_ogd.py, issue 32): the compiled kernel and its
fallbacks compute the same bits, so an exact forget stays exact whichever loop learned and whichever replays --
in particular across the cold start (requests on the fallback until numba has loaded the kernel)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.unlearning import ModelSpec
from app.unlearning.families.retrain import RetrainOGD
from app.unlearning.families.sisa import SISA
from app.unlearning.maths.losses import make_loss
from app.unlearning.maths.schedules import CappedStronglyConvex, ConstantStep, StronglyConvex
from app.unlearning.mechanism import exact_ogd, fast

from .test_sisa import Store, assert_matches_reference

needs_numba = pytest.mark.skipif(not fast.available(), reason=f"compiled path unavailable: "
                                                               f"{fast.unavailable_reason() or 'disabled'}")


@pytest.fixture(autouse=True, scope="module")
def _kernels_loaded():
    fast.warm_up()


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()  # -0.0 and 0.0 differ here


@st.composite
def streams(draw):
    loss_name = draw(st.sampled_from(["logistic", "squared", "huber"]))
    # both fallbacks: Python floats up to LIST_DIM, numpy vectors above
    d = draw(st.sampled_from([1, 2, 7, 33, exact_ogd.LIST_DIM, exact_ogd.LIST_DIM + 1, 130]))
    n = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    radius = draw(st.sampled_from([0.05, 0.7, 3.0, 100.0]))  # small radii make the projection bind
    mu = draw(st.sampled_from([1e-4, 0.01, 0.3]))
    kind = draw(st.sampled_from(["capped", "strong", "constant"]))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0)
    y = rng.integers(0, 2, n).astype(float) if loss_name == "logistic" else rng.uniform(-3, 3, n)
    steps = np.sort(rng.choice(10**6, size=n, replace=False)).astype(np.int64) + 1
    theta = rng.standard_normal(d + 1) * rng.uniform(0.0, 2.0)
    loss = make_loss(loss_name, 1.0, 3.0, radius, mu, {"huber_delta": float(rng.uniform(0.05, 2.0))})
    schedule = {"capped": CappedStronglyConvex(mu, loss.smoothness), "strong": StronglyConvex(mu, loss.smoothness),
                "constant": ConstantStep(float(rng.uniform(1e-3, 2.0)) / loss.smoothness, mu, loss.smoothness)}[kind]
    return loss, schedule, radius, theta, X, y, steps


def _args(loss, schedule, radius, theta, X, y, steps):
    cap, t_switch, mu_sched = fast.schedule_params(schedule)
    return (theta.copy(), X, y, steps, float(cap), int(t_switch), float(mu_sched), fast.LOSS_CODES[loss.name],
            float(loss.mu), float(loss.huber_delta), float(radius))


@needs_numba
@settings(max_examples=150, deadline=None)
@given(streams())
def test_kernel_and_fallbacks_agree_bit_for_bit(case):
    loss, schedule, radius, theta, X, y, steps = case
    outs = []
    for loop in (fast._exact_kernel, exact_ogd._list_ogd_at, exact_ogd._numpy_ogd_at, exact_ogd._py_ogd_at):
        args = _args(*case)
        loop(*args)
        outs.append(bits(args[0]))
    assert outs[0] == outs[1] == outs[2] == outs[3]
    # and the dispatcher's two roads
    compiled = fast.exact_ogd_at(theta, X, y, steps, schedule, loss, radius)
    previous = fast.set_enabled(False)
    try:
        fallback = fast.exact_ogd_at(theta, X, y, steps, schedule, loss, radius)
    finally:
        fast.set_enabled(previous)
    assert bits(compiled) == bits(fallback) == outs[0]


def test_the_comparison_sees_one_ulp():
    """Negative control: a loop that sums the score with numpy's dot (BLAS order) instead of left to right is a
    float64 run of the same steps, yet the bits differ (the check above could fail)."""
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((200, 40)), rng.integers(0, 2, 200).astype(float)
    loss = make_loss("logistic", 1.0, 1.0, 100.0, 0.01, {})
    schedule = CappedStronglyConvex(0.01, loss.smoothness)
    args = _args(loss, schedule, 100.0, np.zeros(41), X, y, np.arange(1, 201, dtype=np.int64))
    exact_ogd._list_ogd_at(*args)
    th, eta = np.zeros(41), None
    for t, (x, v) in enumerate(zip(X, y), start=1):
        eta = schedule.eta(t)
        r = 0.5 * (1.0 + np.tanh(0.5 * (x @ th[:40] + th[40]))) - v
        th = th - eta * (r * np.append(x, 1.0) + 0.01 * th)
    assert np.allclose(th, args[0], rtol=1e-9) and bits(th) != bits(args[0])


def _spec(algorithm, loss, dim, **hp):
    return ModelSpec(algorithm, loss, dim, 1.0, 1.0, 2.0, 0.05, 1.0, 1e-6, 0.01747, hp)


def _stream(seed, n, dim, loss):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (rng.random(n) < 0.5).astype(float) if loss == "logistic" else rng.uniform(-1, 1, n)
    return X, y


@needs_numba
@pytest.mark.parametrize("loss", ["logistic", "squared", "huber"])
@pytest.mark.parametrize("forget_cold", [False, True], ids=["forget-compiled", "forget-cold"])
def test_retrain_learns_across_the_switch_and_forgets_exactly(monkeypatch, loss, forget_cold):
    dim, n = 6, 300
    X, y = _stream(7, n, dim, loss)
    e, store = RetrainOGD(_spec("retrain", loss, dim)), Store(dim)
    calls = []
    real = fast._exact_kernel
    monkeypatch.setattr(fast, "_exact_kernel", lambda *a: (calls.append(1), real(*a)))
    for a, b, cold in ((0, 40, True), (40, 150, True), (150, 300, False)):  # first batches before the switch
        with monkeypatch.context() as m:
            if cold:
                m.setattr(fast, "ready", lambda: False)
            store.add(e.learn(X[a:b], y[a:b], store.view()), X[a:b], y[a:b])
    assert len(calls) == 1  # only the last batch ran compiled
    forgotten = [3, 77, 151, 299]  # learned cold and learned compiled
    with monkeypatch.context() as m:
        if forget_cold:
            m.setattr(fast, "ready", lambda: False)
        e.forget(forgotten, store.view())
    for path in ("compiled", "fallback"):  # the masked stream, learned on one road or the other
        ref = RetrainOGD(_spec("retrain", loss, dim))
        previous = fast.set_enabled(path == "compiled")
        try:
            for g in range(1, n + 1):
                ref.skip(1) if g in forgotten else ref.learn(X[g - 1 : g], y[g - 1 : g])
        finally:
            fast.set_enabled(previous)
        assert bits(e.published()) == bits(ref.published()), path


@needs_numba
@pytest.mark.parametrize("forget_cold", [False, True], ids=["forget-compiled", "forget-cold"])
def test_sisa_learns_across_the_switch_and_forgets_exactly(monkeypatch, forget_cold):
    dim, n = 3, 240
    X, y = _stream(11, n, dim, "logistic")
    e = SISA(_spec("sisa", "logistic", dim, shards=3, slices=4, max_records=n))
    store = Store(dim)
    for a, b, cold in ((0, 50, True), (50, 120, True), (120, 240, False)):
        with monkeypatch.context() as m:
            if cold:
                m.setattr(fast, "ready", lambda: False)
            store.add(e.learn(X[a:b], y[a:b], store.view()), X[a:b], y[a:b])
    forgotten = {5, 61, 130, 200}
    with monkeypatch.context() as m:
        if forget_cold:
            m.setattr(fast, "ready", lambda: False)
        e.forget(sorted(forgotten), store.view())
    store.erase(forgotten)
    # every shard model and checkpoint equals the shard's OGD on the masked stream (learned compiled)
    assert_matches_reference(e, X, y, forgotten, n)
    # and learning goes on exactly: more records, then another forget, on the fallback
    X2, y2 = _stream(12, 30, dim, "logistic")
    Xa, ya = np.vstack([X, X2]), np.concatenate([y, y2])
    with monkeypatch.context() as m:
        m.setattr(fast, "ready", lambda: False)
        store.add(e.learn(X2, y2, store.view()), X2, y2)
        e.forget([250], store.view())
    assert_matches_reference(e, Xa, ya, forgotten | {250}, n + 30)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 60), size=st.integers(1, 17), seed=st.integers(0, 2**16))
def test_array_retained_chunks_read_without_copying_the_whole_set(n, size, seed):
    """A replay reads ArrayRetained in chunks: the same chunks as a masked copy of the set cut every ``size`` kept
    rows, as read-only views when nothing is excluded (no n x d copy per replay; 1e6 records are 256 MB at d = 32)."""
    from app.unlearning import ArrayRetained

    rng = np.random.default_rng(seed)
    steps = np.sort(rng.choice(1000, size=n, replace=False)) + 1
    X, y = rng.standard_normal((n, 3)), rng.standard_normal(n)
    store = ArrayRetained(steps, X, y)
    for exclude in ([], list(rng.choice(steps, size=min(n, 4), replace=False)) if n else [5]):
        keep = ~np.isin(steps, exclude)
        got = list(store.chunks(size, exclude=exclude))
        want = [(steps[keep][a : a + size], X[keep][a : a + size], y[keep][a : a + size])
                for a in range(0, int(keep.sum()), size)]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                assert np.array_equal(a, b)
                if not exclude:
                    assert not a.flags.writeable and np.shares_memory(a, store.steps if a.ndim == 1 and a.dtype
                                                                      == np.int64 else (store.X if a.ndim == 2
                                                                                        else store.y))
