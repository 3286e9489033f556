"""Issue 29 item 7: passive_olu's (and passive_olu_restart's) certified shift carries the re-rounding of the discrete
releases made by other forgets between learning a record and forgetting it (app/unlearning/families/passive.py).

The stream is the issue's: dim 1, huber, radius 100, l2 0, convex_constant eta 0.05; steps 1 (x 0.49985, y 0.61017),
2 = u (+1, -1), 3 (0, 0); step 3 is forgotten after step 3, step 4 (-0.993, 0) is learned, then u is forgotten.
The PAI argument of the forget of u (000 Lemma B.3, discrete release of app/unlearning/mechanism/release.py) splits
the gap between the actual run and the reference that never saw steps 2 and 3 at the first release: that release's
noise absorbs step 3's shift (the actual run against the run that never saw step 3), and u's part -- the run that
never saw step 3 against the one that never saw either -- is carried on.  Both of these round their own point to the
first release's lattice, so u's part can grow by up to g_1 sqrt(d + 1).  The test couples exactly these two runs
(same noise draws, same public mechanism) and checks their gap at u's forget against the certified shift, and their
lattice gap on that release's grid against its lattice sensitivity a' = a + g sqrt(d + 1).

memory_pair and descent_to_delete's perfect variant (which warm-starts every round from its published lattice point)
carry the same term (tests at the end); the other descent_to_delete variants, rewind_to_delete and second_order_olu
need none (docs/receipts.md says why).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.unlearning import ModelSpec, SeededNoise
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.families.restart import PassiveOLURestart

X = np.array([[0.49985], [1.0], [0.0], [-0.993]])
Y = np.array([0.61017, -1.0, 0.0, 0.0])


class NoRerounding(PassiveOLU):
    """Negative control: the shift bound as it was, without the re-rounding of the releases since the record."""

    def rerounding(self, u, tau):
        return 0.0


class RestartNoRerounding(PassiveOLURestart):
    def rerounding(self, u, tau):
        return 0.0


def issue_spec(algorithm="passive_olu", rho=0.5, **hp):
    hp = {"schedule": "convex_constant", "eta": 0.05, **hp}
    return ModelSpec(algorithm, "huber", 1, 1.0, 1.0, 100.0, 0.0, 1.0, 1e-6, rho, hp)


def restart_spec(rho=0.5):
    # c large: the restart test (000 Alg. 3 line 5) never fires on this stream, every forget is Gaussian
    return issue_spec("passive_olu_restart", rho, max_deletions=4, c=1e9)


def carried_gaps(cls, s, seed):
    """(gap / certified shift, lattice gap / certified lattice sensitivity) at the forget of u = step 2, between the
    run that never saw step 3 and the run that never saw steps 2 and 3, both driven by the actual run's releases."""
    actual = cls(s, SeededNoise(seed))
    no3, ref = cls(s, SeededNoise(seed)), cls(s, SeededNoise(seed))
    actual.learn(X[:3], Y[:3])
    no3.learn(X[:2], Y[:2])
    no3.skip(1)
    ref.learn(X[:1], Y[:1])
    ref.skip(2)
    (c1,) = actual.forget([3])
    assert c1.mechanism == "discrete_gaussian"
    for e in (no3, ref):
        e.theta = e.apply_noise(c1.sigma, c1.details["grid"])
    for e in (actual, no3, ref):
        e.learn(X[3:4], Y[3:4])
    gap = float(np.linalg.norm(no3.published() - ref.published()))
    (c2,) = actual.forget([2])
    d, g = c2.details, c2.details["grid"]
    assert c2.mechanism == "discrete_gaussian" and g > 0
    lattice = g * float(np.linalg.norm(np.rint(no3.published() / g) - np.rint(ref.published() / g)))
    certified = max(d["shift"], d["roundoff_floor"])
    return gap / certified, lattice / c2.sensitivity, c1, c2


@pytest.mark.parametrize("make_spec,cls,control", [
    (issue_spec, PassiveOLU, NoRerounding),
    (restart_spec, PassiveOLURestart, RestartNoRerounding),
], ids=["passive_olu", "passive_olu_restart"])
@pytest.mark.parametrize("rho", [0.5, 0.01747])
def test_the_issue_stream_is_covered_and_fails_without_the_term(make_spec, cls, control, rho):
    s = make_spec(rho=rho)
    ok = np.array([carried_gaps(cls, s, seed)[:2] for seed in range(200)])
    bad = np.array([carried_gaps(control, s, seed)[:2] for seed in range(200)])
    assert ok.max() <= 1.0, ok.max(axis=0)
    # without the term the carried gap exceeds the certified shift on every realisation, and the lattice gap
    # exceeds a' on some (the issue: 41 of 200, ratio 1.000061)
    assert (bad[:, 0] > 1.0).sum() >= 100 and (bad[:, 1] > 1.0).sum() >= 5, bad.max(axis=0)


def test_the_term_is_the_first_release_grid_and_is_charged():
    s = issue_spec()
    _, _, c1, c2 = carried_gaps(PassiveOLU, s, 0)
    _, _, d1, d2 = carried_gaps(NoRerounding, s, 0)
    g1 = c1.details["grid"]
    assert c1.details["rerounding"] == 0.0  # no release before the first forget
    # gamma = 1 (l2 = 0): the whole g_1 sqrt(d + 1) is carried to tau = 4
    assert c2.details["rerounding"] == pytest.approx(g1 * math.sqrt(2), rel=1e-15)
    # charged honestly: the certified sensitivity and sigma grow with the shift, rho_i is the series' charge
    a_new = c2.details["shift"]
    assert a_new == c2.details["Delta_u"] * c2.details["Gamma"] + c2.details["rerounding"]
    assert c2.sensitivity > d2.sensitivity and c2.sigma > d2.sigma
    assert c2.rho == pytest.approx(d2.rho, rel=1e-12)
    assert a_new < c2.sensitivity  # a' = a + g sqrt(d + 1) on the release's own grid
    assert c2.sigma / c2.sensitivity == pytest.approx(PassiveOLU(s).noise_multiplier(2), rel=1e-7)


def test_releases_at_one_tau_merge_and_only_releases_since_u_count():
    """Several forgets after the stream (one tau): one history row whose grid is their sum; a record learned after a
    release does not carry it; contraction (l2 > 0) shrinks an older release's term by Gamma(tau_r, tau)."""
    s = ModelSpec("passive_olu", "logistic", 2, 1.0, 1.0, 10.0, 0.05, 1.0, 1e-6, 0.5, {})
    rng = np.random.default_rng(0)
    Xs = rng.normal(size=(60, 2)) / 2.0
    ys = (rng.random(60) < 0.5).astype(float)
    e = PassiveOLU(s, SeededNoise(0))
    e.learn(Xs[:40], ys[:40])
    c = e.forget([3, 5, 7])
    assert e.release_tau == [40] and e.release_grid == [sum(x.details["grid"] for x in c)]
    assert c[0].details["rerounding"] == 0.0
    assert c[2].details["rerounding"] == pytest.approx((c[0].details["grid"] + c[1].details["grid"]) * math.sqrt(3))
    e.learn(Xs[40:], ys[40:])
    (late,) = e.forget([50])  # learned after the release at 40: nothing to carry
    assert late.details["rerounding"] == 0.0
    (old,) = e.forget([9])  # learned before both releases: both, the older one contracted to tau = 60
    G = math.exp(e.log_gamma(40, 60))
    assert G < 1.0
    expect = (e.release_grid[0] * G + late.details["grid"]) * math.sqrt(3)
    assert old.details["rerounding"] == pytest.approx(expect, rel=1e-12)


def test_release_history_round_trips_restarts_clear_it_and_legacy_states_are_conservative():
    s = issue_spec()
    e = PassiveOLU(s, SeededNoise(1))
    e.learn(X, Y)
    e.forget([3])
    e.forget([1])
    b = PassiveOLU.from_state(s, e.state())
    assert (b.release_tau, b.release_grid) == (e.release_tau, e.release_grid) == ([4], [e.release_grid[0]])
    legacy = {k: v for k, v in e.state().items() if not k.startswith("release_")}
    c = PassiveOLU.from_state(s, legacy)
    # every release counted, at the latest time (Gamma(t, tau) >= Gamma(tau_r, tau)), on the largest grid
    assert c.release_tau == [e.t] and c.release_grid[0] >= e.release_grid[0]
    assert c.rerounding(2, e.t) >= e.rerounding(2, e.t) > 0.0
    r = PassiveOLURestart(restart_spec(), SeededNoise(1))
    r.learn(X, Y)
    r.forget([3])
    assert r.release_tau == [4]
    r.restart()
    assert r.release_tau == [] and "release_tau" not in r.state()


# ---- memory_pair: the removal bound carried through the epoch's earlier releases --------------------------------
def test_memory_pair_carries_the_re_rounding_of_the_releases_since_u():
    """memory_pair's Delta bounds the gap to the replay without the record, measured noise-free
    (bench/memory_pair/memory_pair_replay.py); with the noise switched on, both worlds round their own point at every earlier
    release of the epoch, which the noise-free gap cannot see: Delta carries g_r sqrt(p) per release since u (no
    contraction is certified for the quasi-Newton steps)."""
    from app.unlearning.contract.unlearner import ArrayRetained
    from app.unlearning.families.memory_pair import MemoryPair
    s = ModelSpec("memory_pair", "logistic", 4, 1.0, 1.0, 5.0, 0.05, 1.0, 1e-5, 0.5, {"capacity": 8})
    rng = np.random.default_rng(0)
    Xs = rng.normal(size=(60, 4))
    Xs /= np.maximum(1.0, np.linalg.norm(Xs, axis=1))[:, None]
    ys = (rng.random(60) < 0.5).astype(float)
    e = MemoryPair(s, SeededNoise(0))
    steps = e.learn(Xs[:50], ys[:50])
    c1, c2 = e.forget([3, 7], ArrayRetained(steps, Xs[:50], ys[:50]))
    p = s.n_params
    assert c1.details["rerounding"] == 0.0
    assert c2.details["rerounding"] == pytest.approx(c1.details["grid"] * math.sqrt(p), rel=1e-15)
    # charged: Delta = shift + rerounding (above the floor), the lattice sensitivity and sigma on top of it
    assert c2.sensitivity == pytest.approx(c2.details["shift"] + c2.details["rerounding"]
                                           + c2.details["grid"] * math.sqrt(p), rel=1e-15)
    assert c2.rho == pytest.approx(c1.rho, rel=1e-12)
    e.learn(Xs[50:], ys[50:])
    retained = ArrayRetained(np.arange(1, 61), Xs, ys)
    (late,) = e.forget([55], retained)
    assert late.details["rerounding"] == 0.0  # learned after both releases
    (old,) = e.forget([9], retained)
    assert old.details["rerounding"] == pytest.approx(
        (c1.details["grid"] + c2.details["grid"] + late.details["grid"]) * math.sqrt(p), rel=1e-12)
    b = MemoryPair.from_state(s, e.state())
    assert (b.release_tau, b.release_grid) == (e.release_tau, e.release_grid) == ([50, 60], e.release_grid)
    legacy = {k: v for k, v in e.state().items() if not k.startswith("release_")}
    assert MemoryPair.from_state(s, legacy).rerounding(9) >= e.rerounding(9)
    e.retrain(retained)
    assert e.release_tau == [] and e.rerounding(1) == 0.0


# ---- descent_to_delete, perfect variant: the warm start from the published lattice point ----------------------------
def _d2d_spec(**kw):
    from tests.test_descent_to_delete import make_spec
    return make_spec("perfect", **{"loss": "logistic", "dim": 2, "x_norm": 1.0, "y_abs": 1.0, "radius": 3.0,
                                   "l2": 0.2, **kw})


class _Draws:
    """A noise source that keeps every lattice draw (the twin publishes the same k)."""

    def __init__(self, inner):
        self.inner, self.k = inner, []

    def discrete_gaussian(self, sigma, size):
        self.k.append(np.asarray(self.inner.discrete_gaussian(sigma, size), dtype=np.int64))
        return self.k[-1]


def _perfect_twin_gaps(spec, seed, n=60, forgets=(3, 11, 17, 29, 41, 52)):
    """Couple the service's perfect variant (discrete release: the mean rounded to the grid g, noise g k with
    k ~ N_Z(0, (sigma'/g)^2)) with the paper's Algorithm 3 on the same draws (theta~ = Pi(mean + (sigma/sigma') g k):
    no lattice, the calibrated sigma), both warm-starting every round from their own published point (Thm 3.2).
    Thm 3.2's radius (eq. 13) is proved for the paper's publication; the service's means differ from the twin's by
    what the lattice added at the earlier releases (rounding, and the noise's sigma' > sigma), carried and
    contracted, which the paper's radius does not contain.  Returns per forget (gap, certificate)."""
    from app.unlearning.contract.unlearner import ArrayRetained
    from app.unlearning.families.descent_to_delete import DescentToDelete
    from app.unlearning.maths.domain import project_l2_ball

    draws = _Draws(SeededNoise(seed))
    eng = DescentToDelete(spec, draws)
    releases = []  # (k, grid, sigma') of every release of the engine, in order

    class Twin(DescentToDelete):
        def _publish(self, mean):
            self._last_mean = mean.copy()
            k, g, s_rel = releases[len(self.seen)]
            self.seen.append(1)
            self.published_ = project_l2_ball(mean + (self.perfect_release["sigma"] / s_rel) * g * k, self.R)

    twin = Twin(spec, SeededNoise(seed + 1))
    twin.seen = []
    rng = np.random.default_rng(seed)
    Xs = rng.normal(size=(n, 2))
    Xs /= np.maximum(1.0, np.linalg.norm(Xs, axis=1, keepdims=True))
    ys = (Xs @ np.array([1.0, -0.5]) + 0.3 * rng.normal(size=n) > 0).astype(float)
    steps = eng.learn(Xs, ys, None)
    releases.append((draws.k[-1], eng.last_release["grid"], eng.last_release["sigma"]))
    twin.learn(Xs, ys, None)
    keep = list(range(n))
    out = []
    for u in forgets:
        retained = ArrayRetained(steps[keep], Xs[keep], ys[keep])
        (cert,) = eng.forget([u], retained)
        releases.append((draws.k[-1], eng.last_release["grid"], eng.last_release["sigma"]))
        twin.forget([u], retained)
        keep.remove(u - 1)
        out.append((float(np.linalg.norm(eng._last_mean - twin._last_mean)), cert))
    return out


@pytest.mark.parametrize("l2,eps", [(0.2, 1.0), (0.05, 0.3)])
def test_d2d_perfect_carries_its_releases_lattice_and_fails_without_the_term(l2, eps):
    """The service's means leave the paper's (Thm 3.2 holds for those) on every round, by at most the certified
    ``rerounding`` = G (sqrt(2d) (sigma' - sigma) + g sqrt(d)/2); the bound without it (the paper's radius and
    Delta, term 0) leaves that gap uncovered on every round of every realisation."""
    spec = _d2d_spec(l2=l2, eps=eps)
    ratios, uncovered = [], 0
    for seed in range(12):
        for gap, cert in _perfect_twin_gaps(spec, seed):
            assert cert.mechanism == "discrete_gaussian"
            term = cert.details["rerounding"]
            ratios.append(gap / term if term > 0.0 else math.inf)
            uncovered += gap > 0.0  # a bound without the term certifies 0 for this part
    # measured 1e-4..1e-3 of the term: the bound is the worst case (every step contracting by gamma exactly, the
    # noise at its tail bound sigma' sqrt(2d) log(4di/delta), every coordinate rounded by g/2)
    assert max(ratios) <= 1.0, max(ratios)
    assert uncovered == len(ratios) == 72


def test_d2d_perfect_term_is_charged_and_sigma_raised_where_the_papers_does_not_cover():
    """Delta = the paper's (E4) Delta + the term; sigma, the receipts' sensitivity (Delta + g sqrt(d)) and rho with
    it; Lemma A.3 at delta/2 on the complete Delta gives at most epsilon.  At epsilon 0.001 and l2 6598.15
    (I_min = 0.99999, I = 1: the E4 split leaves almost no slack) the paper's sigma no longer covers it and is
    raised."""
    from app.unlearning.families.descent_to_delete import DescentToDelete
    from app.unlearning.maths import d2d_constants as dm
    for spec in (_d2d_spec(), _d2d_spec(l2=6598.15, eps=0.001, radius=10.0)):
        eng = DescentToDelete(spec, SeededNoise(0))
        rng = np.random.default_rng(0)
        X = rng.normal(size=(200, 2))
        X /= np.linalg.norm(X, axis=1, keepdims=True) * 1.01
        steps = eng.learn(X, (X[:, 0] > 0).astype(float), None)
        from app.unlearning.contract.unlearner import ArrayRetained
        (c,) = eng.forget([5], ArrayRetained(steps, X, (X[:, 0] > 0).astype(float)))
        pr, c_, d = eng.perfect_release, eng.c, eng.d
        G = c_.gamma**eng.I / (1 - c_.gamma**eng.I)
        term = G * (math.sqrt(2 * d) * (pr["sigma_released"] - eng.sigma) + pr["grid"] * math.sqrt(d) / 2)
        assert c.details["rerounding"] == pytest.approx(term, rel=1e-12) and term > 0
        paper = dm.perfect_sensitivity(c_, eng.I, eng.n_epoch, eng.sigma, d)
        assert c.details["shift"] == pytest.approx(paper + term, rel=1e-14) == eng.sensitivity
        assert c.sensitivity == pytest.approx(eng.sensitivity + c.details["grid"] * math.sqrt(d), rel=1e-14)
        assert c.details["grid"] == pr["grid"] and c.sigma == pr["sigma_released"]
        assert c.rho == pytest.approx(0.5 * (eng.sensitivity / eng.sigma) ** 2, rel=1e-14)
        assert dm.gaussian_epsilon(eng.sensitivity, eng.sigma, spec.delta / 2) <= spec.epsilon
        sigma_paper = dm.perfect_sigma(c_, eng.I, eng.n_epoch, spec.epsilon, spec.delta)
        if spec.epsilon == 1.0:  # the usual case: the paper's sigma covers the term, nothing released changes
            assert eng.sigma == sigma_paper
        else:
            assert eng.I == 1 and eng.sigma > sigma_paper
            assert dm.gaussian_epsilon(paper + term, sigma_paper, spec.delta / 2) > spec.epsilon
