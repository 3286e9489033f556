"""Exact-retrain baseline: after a forget the published parameters equal a fresh run on the masked stream."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from app.unlearning.contract.errors import ForgetError, SpecError
from app.unlearning.contract.spec import ModelSpec
from app.unlearning.contract.unlearner import ArrayRetained
from app.unlearning.families.retrain import RetrainOGD


def spec(loss="logistic", **hp):
    return ModelSpec("retrain", loss, 3, 1.0, 1.0, 2.0, 0.05, 1.0, 1e-6, 0.01747, hp)


def data(seed, T, loss="logistic"):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, 3))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (rng.random(T) < 0.5).astype(float) if loss == "logistic" else rng.uniform(-1, 1, T)
    return X, y


def masked_run(s, X, y, masked, T):
    """A fresh run on the stream with ``masked`` steps replaced by the skip symbol (clock kept)."""
    e = RetrainOGD(s)
    for t in range(1, T + 1):
        if t in masked:
            e.skip(1)
        else:
            e.learn(X[t - 1 : t], y[t - 1 : t])
    return e


class Store:
    def __init__(self):
        self.steps, self.X, self.y = [], [], []

    def add(self, steps, X, y):
        self.steps += list(steps); self.X += list(X); self.y += list(y)

    def erase(self, steps):
        keep = [k for k, s in enumerate(self.steps) if s not in set(steps)]
        self.steps = [self.steps[k] for k in keep]; self.X = [self.X[k] for k in keep]; self.y = [self.y[k] for k in keep]

    def view(self):
        return ArrayRetained(self.steps, np.array(self.X).reshape(len(self.steps), 3), self.y)


@given(seed=st.integers(0, 10_000), loss=st.sampled_from(["logistic", "squared", "huber"]), chunk=st.integers(1, 7),
       data_=st.data())
def test_forget_equals_fresh_run_on_masked_stream(seed, loss, chunk, data_):
    T = data_.draw(st.integers(2, 40))
    X, y = data(seed, T, loss)
    s = spec(loss)
    e = RetrainOGD(s)
    e.chunk_size = chunk
    store = Store()
    masked: set[int] = set()
    t = 0
    for tau in sorted(data_.draw(st.sets(st.integers(1, T), min_size=1, max_size=5))):
        steps = e.learn(X[t:tau], y[t:tau], store.view() if store.steps else None)
        store.add(steps, X[t:tau], y[t:tau])
        t = tau
        live = [s_ for s_ in store.steps]
        k = data_.draw(st.integers(0, min(3, len(live))))
        victims = data_.draw(st.lists(st.sampled_from(live), min_size=k, max_size=k, unique=True)) if k else []
        certs = e.forget(victims, store.view())
        store.erase(victims)
        masked |= set(victims)
        assert all(c.mechanism == "exact" and c.sigma == 0 and c.rho == 0 for c in certs)
        ref = masked_run(s, X, y, masked, t)
        if victims:
            assert np.array_equal(e.published(), ref.published())  # bitwise
        else:
            np.testing.assert_allclose(e.published(), ref.published(), rtol=0, atol=1e-12)
    # learning continues from the recomputed state exactly like the masked run
    e.learn(X[t:], y[t:])
    assert np.array_equal(e.published(), masked_run(s, X, y, masked, T).published())


def test_negative_control_reindexed_stream_differs():
    """Dropping the record *and* its clock tick (P7) is not the reference: the equality test catches it."""
    X, y = data(0, 30)
    s = spec()
    e = RetrainOGD(s)
    e.learn(X, y)
    e.forget([5], ArrayRetained(np.arange(1, 31), X, y))
    wrong = RetrainOGD(s)
    keep = [k for k in range(30) if k != 4]
    wrong.learn(X[keep], y[keep])
    assert not np.allclose(e.published(), wrong.published(), atol=1e-6)
    stale = RetrainOGD(s)  # and a forget that did nothing
    stale.learn(X, y)
    assert not np.allclose(e.published(), stale.published(), atol=1e-6)


def test_retrain_recomputes_and_starts_an_epoch():
    X, y = data(1, 20)
    e = RetrainOGD(spec())
    e.learn(X, y)
    keep = [k for k in range(20) if k not in (2, 9)]
    e.retrain(ArrayRetained(np.arange(1, 21)[keep], X[keep], y[keep]))
    assert e.epoch == 1
    assert np.array_equal(e.published(), masked_run(spec(), X, y, {3, 10}, 20).published())


def test_state_round_trip_ledger_and_errors():
    X, y = data(2, 10)
    s = spec()
    e = RetrainOGD(s)
    e.learn(X, y)
    (c,) = e.forget([4], ArrayRetained(np.arange(1, 11), X, y))
    assert (c.learned_step, c.forgotten_step, c.deletion_index) == (4, 10, 1)
    st_ = e.state()
    b = RetrainOGD.from_state(s, st_)
    assert all(np.array_equal(np.asarray(st_[k]), np.asarray(b.state()[k])) for k in st_)
    assert e.ledger() == {"accounting": "per_update", "rho_spent": 0.0, "rho_budget": None, "capacity_total": None,
                          "capacity_left": None, "deletions": 1}
    assert e.needs_retained_data and e.supports_retrain and e.hp == {"schedule": "strongly_convex_capped"}
    with pytest.raises(ForgetError):
        e.forget([11], ArrayRetained(np.arange(1, 11), X, y))
    with pytest.raises(ForgetError):
        e.forget([4], ArrayRetained(np.r_[1:4, 5:11], X[np.r_[0:3, 4:10]], y[np.r_[0:3, 4:10]]))
    with pytest.raises(ForgetError):
        e.forget([3], None)
    with pytest.raises(SpecError):
        RetrainOGD(spec(omega=1.2))
