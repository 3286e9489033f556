"""The hashing featurizer (app/features.py): deterministic, bounded by x_norm, signed buckets of a public hash,
ranges scaled by the declared bounds only, independent of key and list order; and the certificates keep holding
on hashed inputs (coupled replay against retraining for passive OLU and active OLU, a data-holding family)."""
from __future__ import annotations

import math

import mmh3
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.features import (HASH, SEED, FeatureError, FeatureSpecError, bucket, dense_rows, featurize, featurize_many,
                          normalize_spec, sparse_rows)
from app.unlearning.families.active import ActiveOLU
from app.unlearning.contract.spec import BOUND_TOLERANCE, ModelSpec
from app.unlearning.contract.unlearner import validate_examples
from app.unlearning.maths.losses import make_loss
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.verification.replay import coupled_replay
from app.unlearning.verification.replay_data import coupled_replay_data

NAMES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"), min_size=1,
                max_size=8)
VALUES = st.text(max_size=12)


@st.composite
def spec_and_rows(draw, n_rows=st.integers(1, 4)):
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    k = draw(st.integers(0, len(names)))
    numeric = {}
    for n in names[:k]:
        lo = draw(st.floats(-1e6, 1e6))
        width = draw(st.floats(1e-3, 1e6))
        numeric[n] = [lo, lo + width]
    categorical = names[k:]
    if not numeric and not categorical:
        categorical = ["c"]
    dim = draw(st.integers(1, 64))
    spec = normalize_spec({"type": "hashed", "dim": dim, "numeric": numeric, "categorical": categorical,
                           "out_of_range": draw(st.sampled_from(["refuse", "clip"]))}, dim)
    rows = []
    for _ in range(draw(n_rows)):
        row = {}
        for n, (lo, hi) in numeric.items():
            if draw(st.booleans()):
                row[n] = draw(st.floats(lo, hi))
        for n in categorical:
            if draw(st.booleans()):
                row[n] = draw(st.one_of(VALUES, st.lists(VALUES, max_size=5)))
        rows.append(row)
    x_norm = draw(st.sampled_from([1e-3, 0.5, 1.0, 3.0, 100.0]))
    return spec, rows, x_norm


@given(spec_and_rows(), st.randoms(use_true_random=False))
def test_deterministic_bounded_and_order_independent(case, rnd):
    spec, rows, x_norm = case
    for row in rows:
        x = featurize(spec, row, x_norm)
        assert x.shape == (spec["dim"],) and np.all(np.isfinite(x))
        # exactly, by the featurizer's own sum of squares; another summation order (np.linalg.norm's) may round one
        # ulp above it, which the engine's bound check and every calibration absorb (BOUND_TOLERANCE)
        assert np.sqrt(np.einsum("ij,ij->i", x[None], x[None]))[0] <= x_norm  # clip_rows's own sum
        assert np.linalg.norm(x) <= x_norm * (1 + BOUND_TOLERANCE)
        assert np.array_equal(x, featurize(spec, dict(row), x_norm))  # deterministic
        keys = list(row)
        rnd.shuffle(keys)
        shuffled = {k: (rnd.sample(row[k], len(row[k])) if isinstance(row[k], list) else row[k]) for k in keys}
        assert np.array_equal(x, featurize(spec, shuffled, x_norm))  # bit for bit, whatever the order
    X = featurize_many(spec, rows, x_norm)
    assert np.array_equal(X, np.array([featurize(spec, r, x_norm) for r in rows]))
    # what the engine's own bound check then accepts
    sp = ModelSpec("passive_olu", "logistic", spec["dim"], x_norm, 1.0, 10.0, 0.01, 1.0, 1e-6, 0.01)
    validate_examples(sp, make_loss("logistic", x_norm, 1.0, 10.0, 0.01, {}), X, np.zeros(len(rows)))


@given(st.text(max_size=20), st.integers(1, 10_000))
def test_buckets_are_public_murmur3_with_sign_from_the_top_bit(token, dim):
    h = mmh3.hash128(token.encode("utf-8", "surrogatepass"), seed=SEED, x64arch=True, signed=False)
    b, s = bucket(token, dim)
    assert 0 <= b < dim and b == (h & (2**64 - 1)) % dim and s == (1.0 if h < 2**127 else -1.0)
    assert HASH == "murmurhash3_x64_128"


def test_known_vector_pins_the_encoding():
    """A change of hash, seed, token layout or scaling would silently move every learned model's buckets."""
    spec = normalize_spec({"type": "hashed", "dim": 8, "numeric": {"age": [0, 120]},
                           "categorical": ["country", "tags"]}, 8)
    x = featurize(spec, {"age": 31, "country": "FR", "tags": ["a", "b"]}, 100.0)
    expected = np.zeros(8)
    for token, v in (("age", 2 * 31 / 120 - 1), ("country\x00FR", 1.0), ("tags\x00a", 1.0), ("tags\x00b", 1.0)):
        b, s = bucket(token, 8)
        expected[b] += s * v
    assert np.allclose(x, expected, rtol=0, atol=1e-15)
    assert SEED == 0x4F4C55
    # pinned literals (mmh3 5.3, MurmurHash3 x64 128, seed 0x4F4C55): a change of any part of the encoding fails here
    assert [bucket(t, 1 << 20) for t in ("age", "country\x00FR", "tags\x00a")] == [
        (592627, 1.0), (673139, -1.0), (32435, 1.0)]
    assert x.tolist() == [0.0, 0.0, 0.0, -0.4833333333333334, 0.0, 0.0, -1.0, 0.0]


@given(st.floats(-50, 50), st.floats(0.01, 100), st.floats(0, 1))
def test_numeric_scaling_uses_the_declared_range_only(lo, width, t):
    hi = lo + width
    v = lo + t * (hi - lo)
    spec = normalize_spec({"type": "hashed", "dim": 1, "numeric": {"v": [lo, hi]}}, 1)
    b, s = bucket("v", 1)
    x = featurize(spec, {"v": v}, 1.0)
    assert math.isclose(x[0], s * (2 * (v - lo) / (hi - lo) - 1), abs_tol=1e-9)
    assert -1.0 <= x[0] <= 1.0
    # the value of one example never depends on the others (no statistics of the data)
    others = featurize_many(spec, [{"v": lo}, {"v": v}, {"v": hi}], 1.0)
    assert others[1][0] == x[0]


def test_out_of_range_refuse_or_clip_and_unknown_fields():
    base = {"type": "hashed", "dim": 4, "numeric": {"age": [0, 100]}, "categorical": ["c"]}
    refuse = normalize_spec(base, 4)
    with pytest.raises(FeatureError) as e:
        featurize(refuse, {"age": 101}, 1.0)
    assert e.value.field == "age" and e.value.code == "out-of-range-feature"
    clip = normalize_spec({**base, "out_of_range": "clip"}, 4)
    assert np.array_equal(featurize(clip, {"age": 1e9}, 1.0), featurize(clip, {"age": 100}, 1.0))
    assert np.array_equal(featurize(clip, {"age": -5}, 1.0), featurize(clip, {"age": 0}, 1.0))
    with pytest.raises(FeatureError) as e:
        featurize(refuse, {"zzz": 1}, 1.0)
    assert e.value.field == "zzz" and e.value.code == "unknown-feature"
    ignore = normalize_spec({**base, "unknown_fields": "ignore"}, 4)
    assert np.array_equal(featurize(ignore, {"zzz": 1, "c": "a"}, 1.0), featurize(ignore, {"c": "a"}, 1.0))
    for bad in ({"age": "3"}, {"age": float("nan")}, {"age": True}, {"c": 3}, {"c": ["a", 3]}, {"c": {"a": 1}}):
        with pytest.raises(FeatureError):
            featurize(refuse, bad, 1.0)
    assert np.array_equal(featurize(refuse, {"age": None, "c": None}, 1.0), np.zeros(4))


def test_list_items_are_a_multiset_and_the_norm_is_clipped():
    spec = normalize_spec({"type": "hashed", "dim": 1 << 16, "categorical": ["tags"]}, 1 << 16)
    one = featurize(spec, {"tags": ["a"]}, 100.0)
    two = featurize(spec, {"tags": ["a", "a"]}, 100.0)
    assert np.array_equal(two, 2 * one)
    many = featurize(spec, {"tags": [f"t{i}" for i in range(400)]}, 2.0)
    assert math.isclose(np.linalg.norm(many), 2.0, rel_tol=1e-12) and np.linalg.norm(many) <= 2.0
    assert np.linalg.norm(featurize(spec, {"tags": [f"t{i}" for i in range(400)]}, 1e6)) > 19  # not scaled up


@pytest.mark.parametrize("raw,field", [
    ({"dim": 5}, "dim"), ({"numeric": {"a": [1, 1]}}, "numeric.a"), ({"numeric": {"a": [2, 1]}}, "numeric.a"),
    ({"numeric": {"a": [-1e308, 1e308]}}, "numeric.a"), ({"categorical": ["n"]}, "categorical"),
    ({"categorical": ["x", "x"]}, "categorical"), ({"numeric": {}, "categorical": []}, "numeric"),
    ({"out_of_range": "wrap"}, "out_of_range"), ({"unknown_fields": "keep"}, "unknown_fields"),
    ({"type": "dense"}, "type"), ({"categorical": ["bad\x00name"]}, "categorical")])
def test_spec_refusals_name_the_field(raw, field):
    with pytest.raises(FeatureSpecError) as e:
        normalize_spec({"type": "hashed", "dim": 4, "numeric": {"n": [0, 1]}, "categorical": ["c"], **raw}, 4)
    assert e.value.field == field


def test_dense_rows_refuses_the_wrong_shape():
    spec = normalize_spec({"type": "hashed", "dim": 3, "categorical": ["c"]}, 3)
    with pytest.raises(FeatureError) as e:
        dense_rows(spec, 1.0, [[0.0, 0.0, 0.0], None], [None, {"c": "a"}])
    assert e.value.code == "features-required" and e.value.index == 0
    with pytest.raises(FeatureError) as e:
        dense_rows(None, 1.0, [[0.0, 0.0, 0.0], None], [None, {"c": "a"}])
    assert e.value.code == "features-not-declared" and e.value.index == 1
    X = [[0.1, 0.2, 0.3]]
    assert dense_rows(None, 1.0, X, None) is X


# ---- the certificates keep holding on hashed inputs ------------------------------------------------------
def _hashed_stream(T: int, dim: int, x_norm: float, seed: int):
    rng = np.random.default_rng(seed)
    spec = normalize_spec({"type": "hashed", "dim": dim, "numeric": {"age": [0, 100], "score": [-5, 5]},
                           "categorical": ["country", "tags"], "out_of_range": "clip"}, dim)
    rows = [{"age": float(rng.uniform(0, 130)), "score": float(rng.normal()), "country": str(rng.integers(0, 6)),
             "tags": [str(t) for t in rng.integers(0, 10, size=rng.integers(0, 5))]} for _ in range(T)]
    X = featurize_many(spec, rows, x_norm)
    y = np.array([1.0 if (r["age"] > 50) != (r["country"] in ("0", "1")) else 0.0 for r in rows])
    return X, y


@given(st.integers(0, 2**31), st.sampled_from(["logistic", "huber"]), st.integers(2, 12))
def test_coupled_replay_passive_on_hashed_inputs(seed, loss, dim):
    T = 40
    X, y = _hashed_stream(T, dim, 1.5, seed)
    sp = ModelSpec("passive_olu", loss, dim, 1.5, 1.0, 10.0, 0.05, 1.0, 1e-6, 0.0175, {})
    sp = sp.with_hyperparameters(PassiveOLU.normalize_hyperparameters(sp))
    rng = np.random.default_rng(seed)
    forgotten = sorted(rng.choice(np.arange(1, 31), size=3, replace=False).tolist())
    deletions = {32: forgotten[:1], 36: forgotten[1:], 40: [35]}
    points = coupled_replay(lambda n: PassiveOLU(sp, n), X, y, deletions, seed=seed)
    assert len(points) == 3
    for p in points:
        assert p.realized <= p.certified * (1 + 1e-9) + 1e-300, p
        assert p.distance <= p.shift_bound * (1 + 1e-9) + 1e-12, p


@pytest.mark.parametrize("variant", ["single", "two_phase"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_coupled_replay_active_on_hashed_inputs(variant, seed):
    dim = 8
    X, y = _hashed_stream(40, dim, 1.0, seed)
    sp = ModelSpec("active_olu", "logistic", dim, 1.0, 1.0, 10.0, 0.01, 1.0, 1e-6, 0.01747, {"variant": variant})
    sp = sp.with_hyperparameters(ActiveOLU.normalize_hyperparameters(sp))
    points = coupled_replay_data(lambda noise: ActiveOLU(sp, noise), X, y, {30: [5], 40: [12, 33]}, seed=seed)
    assert len(points) >= 2
    for p in points:
        assert p.distance <= p.shift_bound * (1 + 1e-9) + 1e-12, p
        assert p.realized <= p.certified * (1 + 1e-9) + 1e-15, p


@given(spec_and_rows())
def test_sparse_rows_are_the_dense_rows_up_to_the_clipping_rounding(case):
    """What a prediction scores (features.sparse_rows): the same buckets and sums as featurize_many; a row that is
    clipped may differ in its last bits (its norm summed over the non-zeros alone), never above x_norm's tolerance."""
    spec, rows, x_norm = case
    dense = featurize_many(spec, rows, x_norm)
    sparse = sparse_rows(spec, rows, x_norm)
    assert sparse.shape == dense.shape
    np.testing.assert_allclose(sparse.toarray(), dense, rtol=1e-14, atol=0)
    if len(rows):
        assert np.all(np.linalg.norm(sparse.toarray(), axis=1) <= x_norm * (1 + BOUND_TOLERANCE))
    unclipped = np.sqrt(np.einsum("ij,ij->i", dense, dense)) < 0.5 * x_norm  # not scaled: the very bits
    assert np.array_equal(sparse.toarray()[unclipped], dense[unclipped])
    with pytest.raises(FeatureError) as e:
        sparse_rows(spec, list(rows) + [None], x_norm)
    assert e.value.code == "features-required" and e.value.index == len(rows)
