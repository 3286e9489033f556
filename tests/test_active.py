"""Active OLU (000 Alg. 2 "single", derived 001 Alg. 2 "two_phase"): certificates checked by coupled replay.

Near-worst-case streams: features at the norm bound, every example the shift meets orthogonal (in augmented
space) to the forgotten one, so OGD and the GD phase contract it by exactly their certified factors; the
domain radius keeps projections inactive.  Negative controls: sigma/10, the P12 shortcut a = gamma^I L and the
P13 step 1/(beta+mu) with the (beta-mu)/(beta+mu) contraction must all be caught.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from app.unlearning.families.active import ActiveOLU
from app.unlearning.contract.errors import ForgetError, SpecError
from app.unlearning.contract.spec import ModelSpec
from app.unlearning.contract.unlearner import ArrayRetained
from app.unlearning.mechanism.noise import SeededNoise
from app.unlearning.verification.replay_data import coupled_replay_data

RHO = 0.01747
E1 = np.array([1.0, 0.0])


def spec(variant="single", mu=0.01, R=10.0, dim=2, **hp):
    return ModelSpec("active_olu", "logistic", dim, 1.0, 1.0, R, mu, 1.0, 1e-6, RHO, {"variant": variant, **hp})


def factory(s, cls=ActiveOLU):
    return lambda noise: cls(s, noise)


def single_worst_case(n_pre=10, n_after=30):
    """anchor (-e1) first in the block, pre-training along e1 so the forgotten example's residual is ~1."""
    X = [-E1] + [E1] * n_pre + [E1] + [-E1] * n_after
    y = [1.0] + [1.0] * n_pre + [0.0] + [1.0] * n_after
    return np.array(X), np.array(y), n_pre + 2


def orthogonal_stream(n_before=10, n_after=30):
    """Everything but the forgotten example is orthogonal to it in augmented space; residual 1/2."""
    X = [-E1] * n_before + [E1] + [-E1] * n_after
    y = [1.0] * n_before + [1.0] + [1.0] * n_after
    return np.array(X), np.array(y), n_before + 1


def check(points, tol=1e-9):
    for p in points:
        assert p.distance <= p.shift_bound * (1 + tol) + 1e-12, p
        assert p.realized <= p.certified * (1 + tol) + 1e-15, p
        assert p.certified <= RHO * (1 + 1e-12)


# ---- negative-control engines ---------------------------------------------------------------------
class UnderNoised(ActiveOLU):
    """Applies sigma/10 but still claims the nominal charge."""

    def noise_multiplier(self, i):
        return super().noise_multiplier(i) / 10.0


class P12Shortcut(ActiveOLU):
    """The paper's a_j = gamma^I L (assumes eta_u <= 1)."""

    def active_shift(self, u, tau, gd_steps):
        d, G, _ = super().active_shift(u, tau, gd_steps)
        return d, G, self.gamma_gd**gd_steps * self.L


class P13Step(ActiveOLU):
    """001 Alg. 2 as printed: GD step 1/(beta+mu) but the contraction of step 2/(beta+mu)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.eta_gd = 1.0 / (self.beta + self.mu)


# ---- hyperparameters, state ----------------------------------------------------------------------
def test_defaults_and_validation():
    e = ActiveOLU(ModelSpec("active_olu", "logistic", 2, 1.0, 1.0, 1.0, 0.1, 1.0, 1e-6, RHO, {}))
    assert e.hp == {"variant": "two_phase", "schedule": "strongly_convex_capped", "omega": 1.2, "max_gd_steps": 2000}
    assert e.needs_retained_data and e.supports_retrain
    for bad in ({"variant": "x"}, {"omega": 1.0}, {"max_gd_steps": -1}, {"max_gd_steps": 1.5}, {"foo": 1}):
        with pytest.raises(SpecError):
            ActiveOLU(spec(**bad))
    with pytest.raises(SpecError):
        ActiveOLU(spec(mu=0.0))


@pytest.mark.parametrize("variant", ["single", "two_phase"])
def test_state_round_trip_is_exact(variant):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(40) < 0.5).astype(float)
    s = spec(variant, dim=3, R=3.0)
    a = ActiveOLU(s, SeededNoise(0))
    a.learn(X[:20], y[:20])
    store = ArrayRetained(np.arange(1, 21), X[:20], y[:20])
    a.forget([15, 3], store)  # one active, one fallback
    st_ = a.state()
    for v in st_.values():
        assert isinstance(v, (int, float)) or v.dtype in (np.float64, np.int64)
    b = ActiveOLU.from_state(s, st_, SeededNoise(5))
    assert all(np.array_equal(np.asarray(st_[k]), np.asarray(b.state()[k])) for k in st_)
    a.noise = SeededNoise(5)
    keep = [i for i in range(20) if i + 1 not in (15, 3)]
    store2 = ArrayRetained(np.r_[np.arange(1, 21)[keep], np.arange(21, 31)], np.r_[X[:20][keep], X[20:30]],
                           np.r_[y[:20][keep], y[20:30]])
    for e in (a, b):
        e.learn(X[20:30], y[20:30])
        e.forget([25], store2)
    assert np.array_equal(a.published(), b.published())


def test_forget_errors():
    e = ActiveOLU(spec())
    X, y, _ = orthogonal_stream(2, 2)
    e.learn(X, y)
    store = ArrayRetained(np.arange(1, 6), X, y)
    with pytest.raises(ForgetError):
        e.forget([6], store)
    with pytest.raises(ForgetError):
        e.forget([2, 2], store)
    with pytest.raises(ForgetError):
        e.forget([2], None)
    with pytest.raises(ForgetError):
        e.forget([2], ArrayRetained([1, 3], X[[0, 2]], y[[0, 2]]))


# ---- worst-case tightness and negative controls --------------------------------------------------
def test_single_worst_case_is_tight_and_controls_fail():
    X, y, u = single_worst_case()
    tau = len(y)
    (p,) = coupled_replay_data(factory(spec("single")), X, y, {tau: [u]})
    check([p])
    assert p.distance / p.shift_bound > 0.9 and p.ratio > 0.8
    (q,) = coupled_replay_data(factory(spec("single"), UnderNoised), X, y, {tau: [u]})
    assert q.realized > q.certified
    # P12: with eta_u = 2/(beta+mu) > 1 in the capped regime, gamma^I L under-states the shift
    X, y, u = single_worst_case(n_pre=4, n_after=0)
    (r,) = coupled_replay_data(factory(spec("single")), X, y, {len(y): [u]})
    check([r])
    (r12,) = coupled_replay_data(factory(spec("single"), P12Shortcut), X, y, {len(y): [u]})
    assert r12.distance > r12.shift_bound and r12.realized > r12.certified


@pytest.mark.parametrize("variant", ["single", "two_phase"])
def test_orthogonal_stream_tightness(variant):
    X, y, u = orthogonal_stream(10, 30)
    # a few noise draws: where the projection onto K binds it shrinks the gap, so the bound is attained on the others
    pts = [coupled_replay_data(factory(spec(variant)), X, y, {len(y): [u]}, seed=s)[0] for s in range(4)]
    check(pts)
    p = max(pts, key=lambda q: q.distance / q.shift_bound)
    assert p.distance / p.shift_bound > 0.45  # residual 1/2 at the forgotten step: 0.5 sqrt(2)/L
    (q,) = coupled_replay_data(factory(spec(variant), UnderNoised), X, y, {len(y): [u]})
    assert q.realized > q.certified


def test_two_phase_p13_erratum_fails():
    X, y, u = orthogonal_stream(10, 30)
    pts = [coupled_replay_data(factory(spec("two_phase"), P13Step), X, y, {len(y): [u]}, seed=s)[0] for s in range(4)]
    assert any(p.distance > p.shift_bound and p.realized > p.certified for p in pts)


# ---- adversarial schedules: step 1, bursts, old records, anchors --------------------------------
def test_deletion_at_step_one_has_no_anchor_and_is_passive():
    X, y, _ = orthogonal_stream(0, 5)
    pts = coupled_replay_data(factory(spec("single")), X, y, {1: [1]})
    check(pts)
    e = ActiveOLU(spec("single"), SeededNoise(0))
    e.learn(X[:1], y[:1])
    (c,) = e.forget([1], ArrayRetained([1], X[:1], y[:1]))
    assert c.details["gd_steps"] == 0 and c.details["fallback"] == 0
    assert c.details["shift"] == pytest.approx(e.schedule.eta(1) * e.L)
    assert c.sigma * c.details["shift"] / c.sensitivity == pytest.approx(e.noise_multiplier(1) * c.details["shift"])


@pytest.mark.parametrize("variant", ["single", "two_phase"])
def test_burst_and_old_record_fall_back(variant):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(60) < 0.5).astype(float)
    dels = {1: [1], 10: [7, 8, 2], 20: [15], 21: [12], 40: [40], 41: [41, 39]}
    pts = coupled_replay_data(factory(spec(variant, R=3.0)), X, y, dels)
    check(pts)
    e = ActiveOLU(spec(variant, R=3.0), SeededNoise(0))
    e.learn(X[:10], y[:10])
    certs = e.forget([7, 8, 2], ArrayRetained(np.arange(1, 11), X[:10], y[:10]))
    assert [c.details["fallback"] for c in certs] == [0.0, 1.0, 1.0]
    assert [c.deletion_index for c in certs] == [1, 2, 3]
    if variant == "single":  # two_phase: I_1 = I_2 = 0 here (mu D tau < L, i = 1): honest passive noise
        assert certs[0].details["gd_steps"] > 0
    for c in certs:
        assert c.rho == pytest.approx(c.sensitivity**2 / (2 * c.sigma**2), rel=1e-8)  # sigma' rounded up (release.py)
    assert e.ledger()["rho_spent"] == pytest.approx(sum(c.rho for c in certs))


def test_deleted_anchor_uses_the_diameter_bound():
    X, y, _ = orthogonal_stream(6, 6)
    s = spec("single", R=3.0)
    pts = coupled_replay_data(factory(s), X, y, {4: [3], 9: [1]})  # step 1 is the anchor of the first deletion
    check(pts)
    e = ActiveOLU(s, SeededNoise(0))
    e.learn(X[:4], y[:4])
    (c1,) = e.forget([3], ArrayRetained(np.arange(1, 5), X[:4], y[:4]))
    assert c1.details["anchor_step"] == 1
    e.learn(X[4:9], y[4:9])
    keep = [0, 1, 3, 4, 5, 6, 7, 8]
    (c2,) = e.forget([1], ArrayRetained(np.arange(1, 10)[keep], X[keep], y[keep]))
    assert c2.details["fallback"] == 1 and c2.details["diameter_bound"] == 1
    # the diameter bound after the anchored phase, plus the re-rounding of the release that followed it (issue 21)
    grid1 = c1.details["grid"]
    assert c2.details["shift"] == pytest.approx(e.D * e.ogd_gamma(4, 9) + grid1 * math.sqrt(3) * e.ogd_gamma(4, 9))
    assert c2.details["shift"] > e.D * e.ogd_gamma(4, 9)


class IgnoresAnchor(ActiveOLU):
    """Erratum: treat a deleted anchor like any old record (passive shift only)."""

    def fallback_shift(self, u, tau, n_phases=None):
        d, G, a, _ = super().fallback_shift(u, tau, n_phases)
        return d, G, d * G, False


def test_ignoring_the_anchor_mismatch_is_caught():
    # block (10, 200]: anchor step 11 = (0, 1), then (0, -1) examples.  The reference that never saw step 11
    # descends on step 12 instead: the two GD phases end ~2.7 apart, far above the passive shift L/(mu tau).
    X = np.array([[0.0, -1.0]] * 10 + [[0.0, 1.0]] + [[0.0, -1.0]] * 190)
    y = np.ones(len(X))
    s = spec("single", mu=0.05, R=10.0)
    dels = {10: [10], 200: [200], 201: [11]}
    good = coupled_replay_data(factory(s), X, y, dels)
    check(good)
    pts = coupled_replay_data(factory(s, IgnoresAnchor), X, y, dels)
    assert pts[2].distance > pts[2].shift_bound and pts[2].realized > pts[2].certified


class IgnoresMismatch(ActiveOLU):
    """Erratum: a record that sat in earlier GD averages treated like any old record (passive shift only)."""

    def fallback_shift(self, u, tau, n_phases=None):
        d, G, a, _ = super().fallback_shift(u, tau, n_phases)
        return d, G, d * G, False


def test_two_phase_ignoring_the_average_mismatch_is_caught():
    # step 1 is in the average of the GD phase at tau = 600; the reference that never saw it descends on a
    # different average: its ERM shift ~ g/(mu n) exceeds the OGD shift of an early (capped-step) record.
    X = np.array([E1] + [-E1] * 605)
    y = np.ones(len(X))
    s = spec("two_phase", mu=0.01, R=10.0)
    dels = {600: [600], 601: [1]}
    good = coupled_replay_data(factory(s), X, y, dels)
    check(good)
    bad = coupled_replay_data(factory(s, IgnoresMismatch), X, y, dels)
    assert bad[1].distance > bad[1].shift_bound  # the necessary condition fails (the rho check alone would not)


@given(seed=st.integers(0, 10_000), variant=st.sampled_from(["single", "two_phase"]),
       data=st.data())
def test_random_and_adversarial_schedules(seed, variant, data):
    rng = np.random.default_rng(seed)
    T = data.draw(st.integers(4, 30))
    X = rng.normal(size=(T, 2))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(T) < 0.5).astype(float)
    taus = sorted(data.draw(st.sets(st.integers(1, T), min_size=1, max_size=4)))
    available = set()
    dels, prev = {}, 0
    for tau in taus:
        available |= set(range(prev + 1, tau + 1))
        prev = tau
        if not available:
            continue
        k = data.draw(st.integers(1, min(3, len(available))))
        chosen = data.draw(st.lists(st.sampled_from(sorted(available)), min_size=k, max_size=k, unique=True))
        dels[tau] = chosen
        available -= set(chosen)
    if not dels:
        return
    s = spec(variant, R=data.draw(st.sampled_from([1.0, 3.0, 10.0])), max_gd_steps=data.draw(st.sampled_from([0, 5, 2000])))
    check(coupled_replay_data(factory(s), X, y, dels, seed=seed))


def test_retrain_starts_a_new_epoch():
    X, y, _ = orthogonal_stream(5, 5)
    e = ActiveOLU(spec("two_phase"), SeededNoise(0))
    e.learn(X, y)
    store = ArrayRetained(np.arange(1, 12), X, y)
    e.forget([8], store)
    keep = [i for i in range(11) if i != 7]
    e.retrain(ArrayRetained(np.arange(1, 12)[keep], X[keep], y[keep]))
    assert e.ledger()["rho_spent"] == 0 and e.ledger()["deletions"] == 0 and e.epoch == 1
    ref = ActiveOLU(spec("two_phase"))
    ref.learn(X[:7], y[:7]); ref.skip(1); ref.learn(X[8:], y[8:])
    assert np.array_equal(e.published(), ref.published())
    (c,) = e.forget([2], ArrayRetained(np.arange(1, 12)[keep], X[keep], y[keep]))
    assert c.details["fallback"] == 1 and c.deletion_index == 1
    assert c.details["shift"] == pytest.approx(e.schedule.eta(2) * e.L * e.ogd_gamma(2, 11))


def test_gd_steps_follow_app_c1_and_the_cap():
    e = ActiveOLU(spec("single", max_gd_steps=50))
    raw = (1.2 * math.log(3) + 2 * math.log(500) + 2 * math.log(e.L)) / (2 * math.log(1 / e.gamma_gd))
    assert ActiveOLU(spec("single")).planned_gd_steps(3, 500) == math.ceil(raw)
    assert e.planned_gd_steps(3, 500) == 50


def test_steps_named_in_one_request_are_never_anchors():
    X, y, _ = orthogonal_stream(6, 6)
    s = spec("single", R=3.0)
    check(coupled_replay_data(factory(s), X, y, {10: [7, 1]}))
    store = ArrayRetained(np.arange(1, 11), X[:10], y[:10])
    e = ActiveOLU(s, SeededNoise(0))
    e.learn(X[:10], y[:10])
    c7, c1 = e.forget([7, 1], store)
    assert c7.details["anchor_step"] == 2 and c1.details["fallback"] == 1 and c1.details["diameter_bound"] == 0
    # in two requests the first anchor (step 1) is used, so forgetting it afterwards needs the diameter bound
    e = ActiveOLU(s, SeededNoise(0))
    e.learn(X[:10], y[:10])
    (c7,) = e.forget([7], store)
    keep = [k for k in range(10) if k != 6]
    (c1,) = e.forget([1], ArrayRetained(np.arange(1, 11)[keep], X[keep], y[keep]))
    assert c7.details["anchor_step"] == 1 and c1.details["diameter_bound"] == 1


def test_two_phase_chunking_and_streaming_agree(monkeypatch):
    import app.unlearning.families.active as active_mod

    rng = np.random.default_rng(7)
    X = rng.normal(size=(50, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(50) < 0.5).astype(float)
    store = ArrayRetained(np.arange(1, 51), X, y)
    out = []
    for chunk, cache in ((4096, True), (3, True), (3, False)):
        monkeypatch.setattr(active_mod, "CACHE_FLOATS", 4_000_000 if cache else 0)
        e = ActiveOLU(spec("two_phase", dim=3, R=3.0), SeededNoise(0))
        e.chunk_size = chunk
        e.learn(X, y)
        (c,) = e.forget([45], store)
        assert c.details["gd_steps"] > 0 and c.details["gd_set_size"] == 49
        out.append(e.published())
    np.testing.assert_allclose(out[1], out[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out[2], out[0], rtol=0, atol=1e-12)


# ---- the fallback carries a shift through earlier discrete releases: their re-rounding (issue 21 item 3) -----------
class NoRoundingTerms(ActiveOLU):
    """Negative control: the fallback bound as it was, without the re-rounding of the releases since the record."""

    def rounding_terms(self, since, tau):
        return 0.0


def hybrid_replay(cls, s, X, y, deletions, u, seed=0):
    """Couple the actual run with the run that never saw record ``u`` (clock kept) and is otherwise the actual run:
    the same other deletions, mirrored through ``replay_event`` with the same draws.  Returns, per event,
    (tau, ||theta - theta'|| just before the forget, certificates).  The fallback's ``shift`` for u claims exactly
    this gap: the part of the two OLU worlds' gap that is u's, which the lattice split of every earlier release leaves
    to u's own noise (module docstring of app/unlearning/families/active.py)."""
    from app.unlearning.verification.replay_data import _learn, _Store
    dim = X.shape[1]
    a, h = cls(s, SeededNoise(seed)), cls(s, SeededNoise(seed))
    sa, sh = _Store(dim), _Store(dim)
    t, out = 0, []
    for tau in sorted(deletions):
        _learn(a, sa, X, y, t, tau, set())
        _learn(h, sh, X, y, t, tau, {u})
        t = tau
        gap = float(np.linalg.norm(a.published() - h.published()))
        certs = a.forget(deletions[tau], sa.view())
        sa.erase(deletions[tau])
        sh.erase(deletions[tau])
        for c in certs:
            h.replay_event(c, sh.view())
        out.append((tau, gap, certs))
    return out


@pytest.mark.parametrize("seed", [2, 4])
def test_fallback_adds_the_re_rounding_of_earlier_releases(seed):
    """single variant, d = 15: a block's phase at N anchors on step 1; record u = N + 1 is learned; forgetting the
    anchor at N + 1 is a diameter-bound fallback whose release has a large grid g (a = D); u is then forgotten at
    N + 2 (a fallback: u precedes that release).  The two worlds round u's small gap (~ eta_u L < g) to the lattice
    independently, so a coordinate that straddles a rounding boundary makes the gap g: 1.3x-1.9x the old bound
    eta_u L Gamma, within the new one (+ g sqrt(d + 1) Gamma).  A large budget keeps the noised point inside K (the
    projection would otherwise shrink the gap).  The OLU coupled replay of the same stream holds too."""
    from app.unlearning.verification.replay_data import coupled_replay_data
    N, dim = 8000, 15
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N + 2, dim))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(N + 2) < 0.5).astype(float)
    s = ModelSpec("active_olu", "logistic", dim, 1.0, 1.0, 1.5, 1.0, 1.0, 1e-6, 1e4, {"variant": "single"})
    dels = {N: [N], N + 1: [1], N + 2: [N + 1]}
    ratios = {}
    for cls in (ActiveOLU, NoRoundingTerms):
        out = hybrid_replay(cls, s, X, y, dels, N + 1, seed)
        (c2,), (c3,) = out[1][2], out[2][2]
        assert c2.details["diameter_bound"] == 1.0 and c3.details["fallback"] == 1.0
        ratios[cls] = out[2][1] / max(c3.details["shift"], c3.details["roundoff_floor"])
    e = ActiveOLU(s)
    assert ratios[ActiveOLU] <= 1.0 < ratios[NoRoundingTerms], ratios
    assert e.rounding_terms(1, N) == 0.0  # no release yet on a fresh engine
    for p in coupled_replay_data(factory(s), X, y, dels, seed=seed):
        assert p.distance <= p.shift_bound * (1 + 1e-9) and p.realized <= p.certified * (1 + 1e-9), p


def test_release_history_round_trips_and_legacy_states_get_a_conservative_one():
    X, y, _ = orthogonal_stream(10, 10)
    s = spec("two_phase")
    a = ActiveOLU(s, SeededNoise(0))
    a.learn(X[:15], y[:15])
    certs = a.forget([12, 3], ArrayRetained(np.arange(1, 16), X[:15], y[:15]))
    assert a.release_tau == [15, 15] and a.release_grid == [c.details["grid"] for c in certs]
    b = ActiveOLU.from_state(s, a.state())
    assert (b.release_tau, b.release_grid) == (a.release_tau, a.release_grid)
    # the second event (a fallback at the same tau) carried step 3's shift through the first one's release
    assert certs[1].details["shift"] >= certs[1].details["Delta_u"] * certs[1].details["Gamma"] + certs[0].details["grid"] * math.sqrt(3)
    legacy = {k: v for k, v in a.state().items() if not k.startswith("release_")}
    c = ActiveOLU.from_state(s, legacy)
    assert c.release_tau == [15, 15] and all(g >= max(a.release_grid) for g in c.release_grid)
