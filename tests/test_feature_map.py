"""Public feature maps (issue 39 item 1): app/feature_map.py and what the families certify on mapped rows.

- the map is a function of its public spec alone (nothing fitted), with its defaults, and refusals naming the field;
- every mapped row lies in the ball of radius ``bound`` (<= 1), whatever the raw row (1e308 included), so every
  mapped feature is in [-1, 1];
- a row's phi does not depend on the other rows of the request nor on a rebuilt precomputation (bit for bit): what
  exact_ridge's integer sums need to cancel at a client-resent forget;
- the coupled replays against retraining hold on mapped rows: passive OLU and active OLU (certificates), exact_ridge
  (the state after forgets is bit for bit that of a model that learned only the rest, in another order and batch
  split), with a negative control (a resent row slightly off leaves a different state).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_info, threadpool_limits

from app import feature_map as fmap
from app.db.state_codec import pack_state, unpack_state
from app.feature_map import FeatureMapError, map_rows, normalize_map
from app.features import FeatureError
from app.unlearning import ArrayRetained
from app.unlearning.contract.spec import ModelSpec
from app.unlearning.families.active import ActiveOLU
from app.unlearning.families.exact_ridge import ExactRidge
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.verification.replay import coupled_replay
from app.unlearning.verification.replay_data import coupled_replay_data


def fm_of(kind="rbf", dim=3, centres=16, x_norm=1.0, **raw) -> dict:
    return normalize_map({"kind": kind, "centres": centres, **raw}, dim, x_norm)


# ---- the spec ------------------------------------------------------------------------------------------------------
def test_defaults_are_public_and_fill_in():
    fm = normalize_map({"kind": "rbf"}, 16, 5.0)
    assert fm["centres"] == fmap.DEFAULT_CENTRES == fm["dim"] and fm["gamma"] == 1 / 16
    assert fm["seed"] == fmap.DEFAULT_SEED and fm["clip"] == fmap.DEFAULT_CLIP
    assert fm["centre"] == [0.0] * 16 and fm["scale"] == [1.0] * 16 and fm["input_dim"] == 16
    assert fm["bound"] == 1.0  # min(1, x_norm)
    assert normalize_map({"kind": "rff", "centres": 8}, 2, 0.25)["bound"] == 0.25
    r = normalize_map({"kind": "rbf", "ranges": [[0, 16], [-2, 2]]}, 2, 1.0)
    assert r["centre"] == [8.0, 0.0] and r["scale"] == [8.0, 2.0] and r["clip"] == 1.0


@pytest.mark.parametrize("raw, field", [
    ({"kind": "poly"}, "feature_map.kind"),
    ({"kind": "rbf", "centres": 0}, "feature_map.centres"),
    ({"kind": "rff", "centres": 7}, "feature_map.centres"),
    ({"kind": "rbf", "gamma": 1e13}, "feature_map.gamma"),
    ({"kind": "rbf", "seed": 2**32}, "feature_map.seed"),
    ({"kind": "rbf", "scale": [1.0, 2.0]}, "feature_map.scale"),
    ({"kind": "rbf", "scale": [1.0, 0.0, 1.0]}, "feature_map.scale"),
    ({"kind": "rbf", "centre": [0.0, math.inf, 0.0]}, "feature_map.centre"),
    ({"kind": "rbf", "ranges": [[0, 1], [0, 1]]}, "feature_map.ranges"),
    ({"kind": "rbf", "ranges": [[0, 1], [1, 1], [0, 1]]}, "feature_map.ranges"),
    ({"kind": "rbf", "ranges": [[0, 1]] * 3, "scale": [1.0] * 3}, "feature_map.ranges"),
    ({"kind": "rbf", "clip": 0.0}, "feature_map.clip"),
])
def test_refusals_name_the_field(raw, field):
    with pytest.raises(FeatureMapError) as e:
        normalize_map(raw, 3, 1.0)
    assert e.value.field == field


def test_the_map_depends_on_its_spec_only():
    X = np.random.default_rng(0).normal(size=(5, 3))
    a, b = map_rows(fm_of(), X), map_rows(fm_of(), X.copy())
    assert np.array_equal(a, b)
    assert not np.array_equal(a, map_rows(fm_of(seed=8), X))  # the seed picks the centres
    assert not np.array_equal(a, map_rows(fm_of(gamma=0.5), X))


# ---- the bound -----------------------------------------------------------------------------------------------------
HUGE = 1.7976931348623157e308
raw_value = st.one_of(st.floats(-HUGE, HUGE, allow_nan=False, allow_infinity=False), st.sampled_from(
    [0.0, 5e-324, -5e-324, 1e308, -1e308, HUGE, -HUGE]))


@settings(deadline=None, max_examples=40)
@given(kind=st.sampled_from(["rbf", "rff"]), centres=st.sampled_from([2, 4, 16, 64]), dim=st.integers(1, 5),
       gamma=st.floats(1e-12, 1e12), x_norm=st.sampled_from([1e-300, 0.3, 1.0, 1e300]), data=st.data())
def test_every_mapped_row_is_within_the_bound(kind, centres, dim, gamma, x_norm, data):
    fm = fm_of(kind, dim, centres, x_norm, gamma=gamma)
    X = np.array(data.draw(st.lists(st.lists(raw_value, min_size=dim, max_size=dim), min_size=1, max_size=6)))
    Phi = map_rows(fm, X)
    assert Phi.shape == (len(X), centres) and np.all(np.isfinite(Phi))
    assert np.all(np.linalg.norm(Phi, axis=1) <= fm["bound"]) and np.all(np.abs(Phi) <= 1.0)


def test_a_nystroem_row_at_a_centre_has_norm_close_to_one():
    """phi is a projection (norm <= 1, reached for rows in the centres' span): a sanity check of the maths."""
    fm = fm_of("rbf", 3, 64)
    C = fmap.prepared(fm).centres
    norms = np.linalg.norm(map_rows(fm, C[:5]), axis=1)  # the centres are in standardised units: centre 0, scale 1
    assert np.all(norms <= 1.0) and np.all(norms > 0.999)


def test_raw_rows_are_checked():
    fm = fm_of()
    with pytest.raises(FeatureError) as e:
        fmap.encode(fm, [[0.0, 1.0, 2.0], [1.0, 2.0]])
    assert e.value.code == "invalid-dimension" and e.value.index == 1
    with pytest.raises(FeatureError) as e:
        fmap.encode(fm, [[0.0, 1.0, 2.0], [1.0, math.nan, 2.0]])
    assert e.value.code == "out-of-bounds-input" and e.value.index == 1
    with pytest.raises(FeatureError) as e:
        fmap.encode({**fm, "max_rows": 1}, [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]])
    assert e.value.code == "batch-too-large"
    assert fmap.encode(None, [[1.0]]) == [[1.0]]


# ---- determinism ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, dim, centres", [("rbf", 4, 256), ("rff", 4, 256), ("rbf", 64, 128), ("rbf", 2, 8),
                                                ("rff", 64, 32), ("rbf", 16, 1024)])
def test_a_rows_phi_does_not_depend_on_the_request(kind, dim, centres):
    """Every batch split, order and position gives each row the same phi, bit for bit (OpenBLAS orders a product's
    sums by its shape: a 64 x 128 kernel product of 2 to 15 rows differed from one of 16 rows and more, which the
    service's check code caught as example-mismatch on digits, until every product got the map's one shape)."""
    fm = fm_of(kind, dim, centres)
    X = np.random.default_rng(1).normal(size=(600, dim)) * 2
    whole = map_rows(fm, X)
    rng = np.random.default_rng(2)
    for _ in range(5):  # other batch splits, other orders, one row alone
        order = rng.permutation(len(X))
        cuts = np.sort(rng.choice(np.arange(1, len(X)), size=7, replace=False))
        parts = np.split(order, cuts)
        again = np.empty_like(whole)
        for part in parts:
            again[part] = map_rows(fm, X[part])
        assert np.array_equal(again, whole)
    for i in (0, 17, 599):
        assert np.array_equal(map_rows(fm, X[i:i + 1]), whole[i:i + 1])


@pytest.mark.parametrize("kind, dim, centres", [("rbf", 16, 1024), ("rff", 4, 256), ("rbf", 2, 8)])
def test_predicts_unpadded_products_agree_with_the_fixed_shape(kind, dim, centres):
    """Predict's map (``fixed=False``: the last block not padded to 32 rows) gives the learned phi up to round-off,
    within the bound, and bit for bit wherever the rows fill whole blocks (the same products)."""
    fm = fm_of(kind, dim, centres)
    X = np.random.default_rng(3).normal(size=(70, dim)) * 2
    whole = map_rows(fm, X)
    for n in (1, 2, 31, 33, 70):
        fast = map_rows(fm, X[:n], fixed=False)
        assert fast.shape == (n, centres)
        assert np.allclose(fast, whole[:n], rtol=0, atol=1e-12)
        assert np.all(np.linalg.norm(fast, axis=1) <= fm["bound"])
    assert np.array_equal(map_rows(fm, X[:64], fixed=False), whole[:64])
    assert np.array_equal(fmap.encode(fm, X[:1].tolist(), fixed=False), map_rows(fm, X[:1], fixed=False))


def test_the_precomputation_rebuilds_bit_for_bit():
    fm = fm_of("rbf", 5, 300)
    X = np.random.default_rng(3).normal(size=(9, 5))
    first = map_rows(fm, X)
    M = fmap.prepared(fm).M.copy()
    fmap._cache.clear()
    assert np.array_equal(fmap.prepared(fm).M, M) and np.array_equal(map_rows(fm, X), first)
    fmap._cache.clear()
    with threadpool_limits(2):  # a process whose BLAS runs on several threads: the map still computes on one
        assert np.array_equal(fmap.prepared(fm).M, M) and np.array_equal(map_rows(fm, X), first)
        assert all(lib["num_threads"] <= 2 for lib in threadpool_info() if lib["user_api"] == "blas")  # restored


def test_concurrent_requests_map_alike():
    from concurrent.futures import ThreadPoolExecutor

    fm = fm_of("rbf", 6, 200)
    X = np.random.default_rng(4).normal(size=(64, 6))
    alone = map_rows(fm, X)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: map_rows(fm, X[i:]), range(16)))
    assert all(np.array_equal(o, alone[i:]) for i, o in enumerate(outs))


# ---- the families on mapped rows -----------------------------------------------------------------------------------
def _mapped_stream(T: int, fm: dict, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, fm["input_dim"])) * 1.5
    y = (np.linalg.norm(X, axis=1) > 1.8).astype(float)  # not linearly separable in x
    return X, map_rows(fm, X), y


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**31), kind=st.sampled_from(["rbf", "rff"]), loss=st.sampled_from(["logistic", "huber"]))
def test_coupled_replay_passive_on_mapped_rows(seed, kind, loss):
    fm = fm_of(kind, 3, 8)
    _, Phi, y = _mapped_stream(40, fm, seed)
    sp = ModelSpec("passive_olu", loss, fm["dim"], fm["bound"], 1.0, 10.0, 0.05, 1.0, 1e-6, 0.0175, {})
    sp = sp.with_hyperparameters(PassiveOLU.normalize_hyperparameters(sp))
    rng = np.random.default_rng(seed)
    forgotten = sorted(rng.choice(np.arange(1, 31), size=3, replace=False).tolist())
    points = coupled_replay(lambda n: PassiveOLU(sp, n), Phi, y, {32: forgotten[:1], 36: forgotten[1:], 40: [35]},
                            seed=seed)
    assert len(points) == 3
    for p in points:
        assert p.realized <= p.certified * (1 + 1e-9) + 1e-300, p
        assert p.distance <= p.shift_bound * (1 + 1e-9) + 1e-12, p


@pytest.mark.parametrize("seed", [1, 2])
def test_coupled_replay_active_on_mapped_rows(seed):
    fm = fm_of("rbf", 3, 8)
    _, Phi, y = _mapped_stream(40, fm, seed)
    sp = ModelSpec("active_olu", "logistic", fm["dim"], fm["bound"], 1.0, 10.0, 0.01, 1.0, 1e-6, 0.01747,
                   {"variant": "single"})
    sp = sp.with_hyperparameters(ActiveOLU.normalize_hyperparameters(sp))
    points = coupled_replay_data(lambda noise: ActiveOLU(sp, noise), Phi, y, {30: [5], 40: [12, 33]}, seed=seed)
    assert len(points) >= 2
    for p in points:
        assert p.distance <= p.shift_bound * (1 + 1e-9) + 1e-12, p
        assert p.realized <= p.certified * (1 + 1e-9) + 1e-15, p


def _ridge(fm: dict) -> ExactRidge:
    sp = ModelSpec("exact_ridge", "squared", fm["dim"], fm["bound"], 1.0, 10.0, 1e-3, 1.0, 1e-6, 0.01747, {},
                   n_classes=2)
    return ExactRidge(sp.with_hyperparameters(ExactRidge.normalize_hyperparameters(sp)))


def _fingerprint(e: ExactRidge) -> tuple[bytes, bytes, bytes]:
    s = unpack_state(pack_state(e.state()))
    return s["A"].tobytes(), s["B"].tobytes(), e.published().tobytes()


@pytest.mark.parametrize("kind", ["rbf", "rff"])
def test_exact_ridge_on_mapped_rows_forgets_bit_for_bit(kind):
    """Learn 300 raw rows mapped in batches of 50; forget 30 by resending them (mapped again, in other batches);
    the state and weights are those of a model that learned only the other 270, mapped in another order and split.
    Negative control: a resent row slightly off leaves another state."""
    fm = fm_of(kind, 3, 64)
    X, _, y = _mapped_stream(300, fm, 5)
    model = _ridge(fm)
    for a in range(0, 300, 50):
        model.learn(map_rows(fm, X[a:a + 50]), y[a:a + 50])
    gone = np.random.default_rng(6).choice(300, size=30, replace=False)
    for part in np.array_split(gone, 4):
        steps = [int(i) + 1 for i in part]
        model.forget(steps, ArrayRetained(steps, map_rows(fm, X[part]), y[part]))
    rest = np.setdiff1d(np.arange(300), gone)[::-1]
    ref = _ridge(fm)
    for part in np.array_split(rest, 7):
        ref.learn(map_rows(fm, X[part]), y[part])
    assert _fingerprint(model) == _fingerprint(ref)

    bad = _ridge(fm)  # negative control
    bad.learn(map_rows(fm, X[:10]), y[:10])
    off = X[3:4].copy()
    off[0, 0] += 1e-3  # (one ulp may vanish on the sums' grid; the service's check code refuses even that)
    bad.forget([4], ArrayRetained([4], map_rows(fm, off), y[3:4]))
    clean = _ridge(fm)
    clean.learn(map_rows(fm, np.delete(X[:10], 3, axis=0)), np.delete(y[:10], 3))
    assert _fingerprint(bad) != _fingerprint(clean)
