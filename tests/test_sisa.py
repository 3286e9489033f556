"""SISA (exact sharded, sliced unlearning; Bourtoule et al. 2021): coupled replay against retraining the shard.

The reference of the OLU definition (ARCHITECTURE.md §5) for an exact family is the same algorithm on the masked
stream, clock kept: here every shard is the retrain family's OGD on the shard's records, positions kept, with the
forgotten ones as skip symbols.  After every forget the shard models (published) and every slice checkpoint (secret
state) must equal that reference bit for bit, and learning must go on exactly as the reference does.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.db.state_codec import pack_state, unpack_state
from app.unlearning import ALGORITHMS, ArrayRetained, ForgetError, ModelSpec, SpecError
from app.unlearning.families.retrain import RetrainOGD
from app.unlearning.families.sisa import SISA


def spec(loss="logistic", n_classes=0, **hp):
    return ModelSpec("sisa", loss, 3, 1.0, 1.0, 2.0, 0.05, 1.0, 1e-6, 0.01747, hp, n_classes=n_classes)


def data(seed, T, loss="logistic", K=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, 3))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    if loss == "logistic":
        y = (rng.random(T) < 0.5).astype(float)
    elif loss == "softmax":
        y = rng.integers(0, K, T).astype(float)
    else:
        y = rng.uniform(-1, 1, T)
    return X, y


class Store:
    """The service's retained store as the engine sees it: every example learned and not forgotten."""

    def __init__(self, dim=3):
        self.rows: dict[int, tuple[np.ndarray, float]] = {}
        self.dim = dim

    def add(self, steps, X, y):
        for s, x, v in zip(steps, X, y):
            self.rows[int(s)] = (x, float(v))

    def erase(self, steps):
        for s in steps:
            del self.rows[int(s)]

    def view(self):
        steps = sorted(self.rows)
        X = np.array([self.rows[s][0] for s in steps]).reshape(len(steps), self.dim)
        return ArrayRetained(steps, X, [self.rows[s][1] for s in steps])


def shard_reference(s: ModelSpec, X, y, masked: set[int], t: int, shard: int, S: int, upto: int | None = None):
    """A retrain of one shard: the retrain family's OGD over the shard's records in order, position j as its clock,
    the masked ones skipped (clock kept); stopped after position ``upto``."""
    ref = RetrainOGD(ModelSpec("retrain", s.loss, s.dim, s.x_norm, s.y_abs, s.domain_radius, s.l2, s.epsilon,
                               s.delta, s.rho, {}, n_classes=s.n_classes))
    for j, g in enumerate(range(shard + 1, t + 1, S), start=1):
        if upto is not None and j > upto:
            break
        if g in masked:
            ref.skip(1)
        else:
            ref.learn(X[g - 1 : g], y[g - 1 : g])
    return ref.published()


def assert_matches_reference(e: SISA, X, y, masked: set[int], t: int):
    S, L = e.shards, e.slice_length
    for shard in range(S):
        assert np.array_equal(e.thetas[shard], shard_reference(e.spec, X, y, masked, t, shard, S)), shard
        for r, ck in enumerate(e.checkpoints[shard], start=1):
            assert np.array_equal(ck, shard_reference(e.spec, X, y, masked, t, shard, S, upto=r * L)), (shard, r)


@settings(deadline=None)
@given(seed=st.integers(0, 10_000), loss=st.sampled_from(["logistic", "squared", "huber", "softmax"]),
       shards=st.integers(1, 5), slices=st.integers(1, 4), cap=st.integers(1, 60), chunk=st.integers(1, 7),
       data_=st.data())
def test_forget_equals_retraining_the_shard_on_the_masked_stream(seed, loss, shards, slices, cap, chunk, data_):
    T = data_.draw(st.integers(2, 45))
    X, y = data(seed, T, loss)
    s = spec(loss, n_classes=3 if loss == "softmax" else 0, shards=shards, slices=slices, max_records=cap)
    s = s.with_hyperparameters({**SISA.normalize_hyperparameters(s), "max_records": cap})
    e = SISA(s)
    e.chunk_size = chunk
    store, masked, t = Store(), set(), 0
    for tau in sorted(data_.draw(st.sets(st.integers(1, T), min_size=1, max_size=5))):
        steps = e.learn(X[t:tau], y[t:tau], store.view())
        store.add(steps, X[t:tau], y[t:tau])
        t = tau
        live = sorted(store.rows)
        k = data_.draw(st.integers(0, min(3, len(live))))
        victims = data_.draw(st.lists(st.sampled_from(live), min_size=k, max_size=k, unique=True)) if k else []
        if data_.draw(st.booleans()):  # the secret state goes through the service's codec between requests
            e = SISA.from_state(s, unpack_state(pack_state(e.state())))
            e.chunk_size = chunk
        certs = e.forget(victims, store.view())
        store.erase(victims)
        masked |= set(victims)
        assert [c.learned_step for c in certs] == victims
        for c in certs:
            assert c.mechanism == "exact" and c.sigma == c.sensitivity == c.rho == 0.0
            assert c.details["shard"] == (c.learned_step - 1) % e.shards
            assert 0 <= c.details["records_replayed"] <= e.shard_size(int(c.details["shard"]))
        assert_matches_reference(e, X, y, masked, t)
    # learning goes on from the recomputed state exactly as the reference does
    e.learn(X[t:], y[t:], store.view())
    assert_matches_reference(e, X, y, masked, T)
    assert e.records_held() == T - len(masked)


def test_a_forget_recomputes_only_the_record_s_shard_from_the_checkpoint_before_its_slice():
    X, y = data(1, 120)
    e = SISA(spec(shards=4, slices=3, max_records=120))  # slice length 10 per shard
    steps = e.learn(X, y)
    before = e.thetas.copy()
    checkpoints = [[c.copy() for c in cs] for cs in e.checkpoints]
    victim = 4 + 4 * 24  # shard 3, position 25: slice 2 (positions 21-30)
    (cert,) = e.forget([victim], ArrayRetained(steps, X, y))
    assert cert.details == {"shard": 3.0, "from_slice": 2.0, "records_replayed": 9.0}  # positions 21-30 but 25
    assert np.array_equal(e.thetas[:3], before[:3]) and not np.array_equal(e.thetas[3], before[3])
    assert all(np.array_equal(a, b) for a, b in zip(e.checkpoints[3][:2], checkpoints[3][:2]))  # before the slice
    assert len(e.checkpoints[3]) == 3 and not np.array_equal(e.checkpoints[3][2], checkpoints[3][2])


def test_negative_controls_the_equality_can_fail():
    """Replaying from the checkpoint *after* the record's slice (the record's influence kept), or re-indexing the
    shard's clock (P7), is not the reference: the coupled check tells them apart."""
    X, y = data(2, 60)
    s = spec(shards=2, slices=3, max_records=60)  # slice length 10
    e = SISA(s)
    steps = e.learn(X, y)
    victim = 1 + 2 * 12  # shard 0, position 13 (slice 1)
    stale = SISA.from_state(s, e.state())
    stale._replay_shard(0, 2, ArrayRetained(steps, X, y), np.array([victim]))  # starts after the record's slice
    e.forget([victim], ArrayRetained(steps, X, y))
    ref = shard_reference(s, X, y, {victim}, 60, 0, 2)
    assert np.array_equal(e.thetas[0], ref)
    assert not np.allclose(stale.thetas[0], ref, atol=1e-6)
    reindexed = RetrainOGD(ModelSpec("retrain", "logistic", 3, 1.0, 1.0, 2.0, 0.05, 1.0, 1e-6, 0.01747, {}))
    rows = [g - 1 for g in range(1, 61, 2) if g != victim]
    reindexed.learn(X[rows], y[rows])
    assert not np.allclose(reindexed.published(), ref, atol=1e-6)


def test_one_shard_one_slice_is_the_retrain_family():
    X, y = data(3, 50)
    a, b = SISA(spec(shards=1, slices=1)), RetrainOGD(ModelSpec("retrain", "logistic", 3, 1.0, 1.0, 2.0, 0.05, 1.0,
                                                                    1e-6, 0.01747, {}))
    steps = a.learn(X, y)
    b.learn(X, y)
    store = ArrayRetained(steps, X, y)
    a.forget([7, 30], store)
    b.forget([7, 30], store)
    assert np.array_equal(a.published(), b.published())
    assert np.array_equal(a.predict(X)[0], b.predict(X)[0]) and np.allclose(a.predict(X)[1], b.predict(X)[1])


@pytest.mark.parametrize("loss", ["logistic", "squared", "softmax"])
def test_prediction_is_the_mean_of_the_shard_models_outputs(loss):
    K = 3
    X, y = data(4, 40, loss, K)
    s = spec(loss, n_classes=K if loss == "softmax" else 0, shards=4)
    e = SISA(s)
    e.learn(X, y)
    pred, out = e.predict(X)
    members = e.published().reshape(SISA.published_shape(s)[0], -1)
    assert SISA.published_shape(s) == ((4, K, 4) if loss == "softmax" else (4, 4))
    each = [e.loss.score_output(e.loss.linear_scores(theta, X)) for theta in members]
    assert np.allclose(out, np.mean(each, axis=0), rtol=0, atol=1e-15)
    if loss == "softmax":
        assert np.allclose(out.sum(axis=1), 1.0) and np.array_equal(pred, np.argmax(out, axis=1))
    elif loss == "logistic":
        assert np.array_equal(pred, (out > 0.5).astype(float))
    else:
        assert np.array_equal(pred, out)
    assert not all(np.array_equal(members[0], m) for m in members[1:])  # the shards are different models


def test_retrain_recomputes_every_shard_and_starts_an_epoch():
    X, y = data(5, 40)
    e = SISA(spec(shards=3, slices=2, max_records=40))
    steps = e.learn(X, y)
    e.forget([9], ArrayRetained(steps, X, y))
    after = e.published()
    keep = steps != 9
    e.thetas[:] = 0.0  # the retrain must not start from the current models
    e.retrain(ArrayRetained(steps[keep], X[keep], y[keep]))
    assert e.epoch == 1 and np.array_equal(e.published(), after)


@pytest.mark.parametrize("hp,field", [({"shards": 0}, "hyperparameters.shards"), ({"shards": 1025}, "hyperparameters.shards"),
                                      ({"shards": True}, "hyperparameters.shards"), ({"slices": 2.5}, "hyperparameters.slices"),
                                      ({"slices": 0}, "hyperparameters.slices"), ({"schedule": "x"}, "hyperparameters.schedule")])
def test_bad_hyperparameters_are_refused_naming_the_field(hp, field):
    with pytest.raises(SpecError) as err:
        SISA.normalize_hyperparameters(spec(**hp))
    assert err.value.fields == (field,)
    with pytest.raises(SpecError):
        SISA.normalize_hyperparameters(spec(epochs=3))
    assert SISA.normalize_hyperparameters(spec(shards=2.0))["shards"] == 2


def test_forget_refuses_what_it_does_not_hold():
    X, y = data(6, 10)
    e = SISA(spec(shards=2))
    steps = e.learn(X, y)
    store = ArrayRetained(steps, X, y)
    for bad in ([11], [0], [3, 3]):
        with pytest.raises(ForgetError):
            e.forget(bad, store)
    with pytest.raises(ForgetError):
        e.forget([3], None)
    assert ALGORITHMS["sisa"] is SISA and SISA.needs_retained_data and SISA.supports_retrain


def test_work_budget_counts_each_shard_once_per_request():
    """A forget request replays each shard it touches once: k records cost at most min(k, S) shard replays, so the
    retained-record cap the service derives is within a small factor of the retrain family's (one replay of
    everything), not S times less."""
    from app.unlearning.families.retrain import RetrainOGD as Retrain

    c = SISA.cost(SISA_SPEC := spec(shards=4, max_records=1000).with_hyperparameters(
        {**SISA.normalize_hyperparameters(spec(shards=4)), "max_records": 1000}), 10)
    assert c.forget_request(1) < c.forget_request(2) < c.forget_request(4) == c.forget_request(50) == c.forget_most
    whole = Retrain.cost(ModelSpec("retrain", "logistic", 3, 1.0, 1.0, 2.0, 0.05, 1.0, 1e-6, 0.01747,
                                   {"max_records": 1000}), 10).forget
    # every shard once is a bounded multiple of one replay of everything: a shard's chunks are smaller (more of them
    # opened: app/db/retained.py), a look-up in the store per shard, a call per slice; one shard of four costs
    # under the whole (at this small size the store's fixed costs weigh: ~0.75 at 10^3 records, ~0.4 at 10^6)
    assert whole <= c.forget_most <= 2.0 * whole and c.forget_request(1) <= 0.8 * whole
    assert SISA_SPEC.hyperparameters["shards"] == 4


def test_default_shards_grow_with_max_records():
    """Issue 32: the default S = clamp(ceil(sqrt(N) / 16), 8, 1024) for the cap N given at creation; 8 without a cap
    and up to N = 16 384 (every small model keeps its 8); a given shards is kept; the cap itself is kept too."""
    def shards(**hp):
        s = spec(**hp)
        return SISA.normalize_hyperparameters(s)

    assert shards()["shards"] == 8 and "max_records" not in shards()
    assert [shards(max_records=n)["shards"] for n in (1, 1000, 16_384, 16_385, 100_000, 10**6, 10**7, 10**9)] == \
        [8, 8, 8, 9, 20, 63, 198, 1024]
    hp = shards(max_records=10**6, shards=8, slices=2)
    assert (hp["shards"], hp["slices"], hp["max_records"]) == (8, 2, 10**6)
    with pytest.raises(SpecError):
        shards(max_records=0)
    e = SISA(spec(max_records=40_000).with_hyperparameters(shards(max_records=40_000)))
    assert e.shards == 13 and e.slice_length == -(-40_000 // (13 * 4))
