"""exact_ridge's stored state (issue 39's forget cost): A = sum q q^T is symmetric, so the service stores its upper
triangle (``stored_state``: "A_upper", and "A_upper_hi" for two-word sums), half the bytes to pack, seal, write and
checkpoint at each forget, and its low words (and B's) in fewer bytes (narrow_words.py: test_narrow_words.py).  Whatever was learned and forgotten, the stored form loads as the very state (every sum
bit for bit) and the same published weights; an A that were not symmetric is stored whole; states stored whole
(before) still load; a triangle of the wrong length is refused.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.db.state_codec import pack_state, unpack_state
from app.unlearning import ArrayRetained
from app.unlearning.families.exact_ridge import ExactRidge
from app.unlearning.families.ridge_sums import from_upper, upper_state

from .test_exact_ridge import data, spec
from .test_exact_ridge_wide import base_state, spec as wide_spec


def _through_the_codec(e: ExactRidge) -> ExactRidge:
    return ExactRidge.from_state(e.spec, unpack_state(pack_state(e.stored_state())))


def _same(a: ExactRidge, b: ExactRidge) -> bool:
    sa, sb = a.state(), b.state()
    return (sa.keys() == sb.keys() and all(np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])) for k in sa)
            and a.published().tobytes() == b.published().tobytes())


@settings(deadline=None, max_examples=25)
@given(seed=st.integers(0, 10_000), K=st.sampled_from([0, 2, 5]), dim=st.integers(1, 12),
       gcv=st.booleans(), data_=st.data())
def test_the_stored_triangle_loads_as_the_very_state(seed, K, dim, gcv, data_):
    T = data_.draw(st.integers(1, 50))
    X, y = data(seed, T, dim, K)
    e = ExactRidge(spec(dim, K, l2_selection="gcv" if gcv else "fixed"))
    steps = list(e.learn(X, y))
    gone = data_.draw(st.lists(st.sampled_from(range(T)), unique=True, max_size=T))
    if gone:
        e.forget([steps[i] for i in gone], ArrayRetained([steps[i] for i in gone], X[gone], y[gone]))
    stored = e.stored_state()
    p = dim + 1
    narrow_keys = {f"{n}_{part}" for n in ("A_upper", "B") for part in ("nw", "nlo", "nhi", "nxi", "nxv")}
    assert "A" not in stored and "B" not in stored and narrow_keys <= set(stored)
    assert stored["A_upper_nlo"].size + stored["A_upper_nhi"].size == stored["A_upper_nw"] * (p * (p + 1) // 2)
    assert set(stored) - narrow_keys == set(e.state()) - {"A", "B"}
    again = _through_the_codec(e)
    assert _same(again, e)
    assert np.array_equal(again.A, e.A) and np.array_equal(again.A, again.A.T)


def test_the_stored_state_is_about_half_at_1025():
    e = ExactRidge(spec(1024, 26))
    X, y = data(1, 40, 1024, 26)
    e.learn(X, y)
    whole, upper = len(pack_state(e.state())), len(pack_state(e.stored_state()))
    assert upper < 0.52 * whole and whole > 8 << 20  # A halves; B (26 x 1 025) stays
    assert _same(_through_the_codec(e), e)


@pytest.mark.parametrize("K", [0, 3])
def test_two_word_sums_store_both_triangles(K):
    s = wide_spec(3, K)
    e = ExactRidge.from_state(s, base_state(ExactRidge(s), 3 * 10**8, np.array([0.9, -0.3, 0.2]), 1.0))
    assert e.sums[0].hi is not None and e.sums[0].hi.any()
    stored = e.stored_state()
    assert {"A_upper_nlo", "A_upper_hi"} <= stored.keys() and "A" not in stored and "A_hi" not in stored
    again = _through_the_codec(e)
    assert _same(again, e) and (again.sums[0].exact() == e.sums[0].exact()).all()


def test_an_asymmetric_a_is_stored_whole_and_a_whole_a_still_loads():
    e = ExactRidge(spec(3))
    X, y = data(2, 10, 3)
    e.learn(X, y)
    whole = e.state()
    assert "A" in whole and "A_upper" not in whole  # state() itself is unchanged: A whole
    assert _same(ExactRidge.from_state(e.spec, unpack_state(pack_state(whole))), e)  # as stored before
    e.sums[0].lo[0, 1] += 1  # not a state any schedule reaches: the check, not an assumption, decides the form
    stored = e.stored_state()
    assert "A" in stored and "A_upper" not in stored
    assert np.array_equal(_through_the_codec(e).A, e.A)


def test_a_triangle_of_the_wrong_size_is_refused():
    e = ExactRidge(spec(3))
    e.learn(*data(3, 5, 3))
    stored = e.stored_state()
    legacy = {k: v for k, v in stored.items() if not k.startswith("A_upper")} | upper_state(e.sums[0], "A_upper")
    assert _same(ExactRidge.from_state(e.spec, legacy), e)  # a triangle of int64 words (stored before) loads
    for bad in (legacy["A_upper"][:-1], legacy["A_upper"].astype(np.float64)):
        with pytest.raises(ValueError):
            ExactRidge.from_state(e.spec, {**legacy, "A_upper": bad})
    with pytest.raises(ValueError):  # narrow words of another size
        ExactRidge.from_state(e.spec, {**stored, "A_upper_nlo": stored["A_upper_nlo"][:-1]})
    with pytest.raises(ValueError):
        from_upper(np.zeros(5, dtype=np.int64), None, 3)


def test_a_solve_beside_the_state_that_leaves_the_float_range_is_a_422_and_changes_nothing(tmp_path, monkeypatch):
    """A large state's weights are solved on a worker thread while the state is packed (model_core._prepare): a
    NumericError there is the same 422 non-finite-result as on the request's thread, and nothing is written."""
    from app.config import Settings
    from app.errors import Problem
    from app.main import create_app
    from app.services import model_core
    from app.unlearning.contract.errors import NumericError

    (tmp_path / "data").mkdir()
    app = create_app(Settings(data_dir=tmp_path / "data", log_level="WARNING"))
    ctx = app.state.ctx
    t = ctx.tenants.create_tenant("beside")["id"]
    d = 200  # 165 kB stored: the test lowers BESIDE_STATE_BYTES below it
    m = ctx.models.create(t, {"name": "r", "algorithm": "exact_ridge", "loss": "squared", "dim": d,
                              "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
                              "privacy": {"epsilon": 1.0, "delta": 1e-6}})["id"]
    X, y = data(4, 3, d)
    ctx.models.learn(t, m, ["a"], X[:1], y[:1])
    version = ctx.models.get(t, m)["version"]
    monkeypatch.setattr(model_core, "BESIDE_STATE_BYTES", 1)
    solved_beside = []

    def overflow(self):
        import threading
        solved_beside.append(threading.current_thread().name)
        raise NumericError("the published parameters are not finite")

    monkeypatch.setattr(ExactRidge, "published", overflow)
    with pytest.raises(Problem) as e:
        ctx.models.learn(t, m, ["b"], X[1:2], y[1:2])
    assert e.value.status == 422 and e.value.slug == "non-finite-result"
    assert solved_beside and solved_beside[0].startswith("olu-publish")
    assert ctx.models.get(t, m)["version"] == version
    ctx.db.dispose()


@settings(deadline=None, max_examples=200)
@given(rows=st.lists(st.integers(-1100, 1100), min_size=1, max_size=4),
       cols=st.lists(st.integers(-1100, 1100), min_size=1, max_size=4),
       near=st.sampled_from([0, 511, -511, 1022, -1022]), data_=st.data())
def test_the_solves_scaling_is_ldexp_bit_for_bit(rows, cols, near, data_):
    """ridge_sums.Scale (one multiplication by exact powers of two where they are normal floats, else ldexp) gives
    ldexp's bits for integer-valued sums of any size: zeros, overflow to inf and subnormal results included."""
    from app.unlearning.families.ridge_sums import Scale

    rows = np.array(rows) + near // 2
    cols = np.array(cols) + near // 2
    words = data_.draw(st.lists(st.integers(-2**115, 2**115), min_size=len(rows) * len(cols),
                                max_size=len(rows) * len(cols)))
    x = np.array([float(w) for w in words]).reshape(len(rows), len(cols))
    want = np.ldexp(x, -(rows[:, None] + cols[None, :]))
    with np.errstate(over="ignore"):
        got = Scale(rows, cols).apply(x.copy())
    assert got.tobytes() == want.tobytes()
