"""Coupled replay for descent-to-delete (ARCHITECTURE.md §5, paper 002 Def. 2.4).

After every update i the unlearning run's Gaussian mean mu'_i (the secret iterate, or for the perfect variant the
pre-noise GD output) is compared with the retrain-from-scratch reference mu_i = A(D_i): the same training
algorithm, with the same epoch constants (T, eta, m), on the current dataset, publishing with the *same* noise
draw.  The theorems bound ||mu'_i - mu_i|| by the sensitivity Delta the sigma was calibrated on (both are within
a radius of the optimum theta*_i); Lemma A.3 then turns the measured distance into a realized epsilon at the
mechanism's delta, which must not exceed the target epsilon.  For the distributed variant the reference is A run
on the current bootstrap slots (which are distributed as a fresh P^B(D_i), Lemma 4.2), compared copy by copy.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..contract.unlearner import ArrayRetained
from ..families.descent_to_delete import DescentToDelete
from ..families.descent_to_delete_data import DatasetView
from ..maths import d2d_constants as dm
from ..maths.domain import project_l2_ball
from ..mechanism import fast, release
from ..mechanism.noise import SeededNoise


class RecordingNoise:
    """Wraps a noise source and remembers the last draw (so the reference publishes with the same Z)."""

    def __init__(self, inner):
        self.inner = inner
        self.last = None

    def standard_normal(self, size: int) -> np.ndarray:
        self.last = self.inner.standard_normal(size)
        return self.last

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        self.last = self.inner.discrete_gaussian(sigma, size)
        return self.last


@dataclass(frozen=True)
class D2DReplayPoint:
    index: int                 # event number (1-based)
    kind: str                  # "add" | "delete"
    round: int                 # update counter of the epoch after the event (0 after a full retrain)
    mechanism: str
    distance: float            # ||mu'_i - mu_i|| (max over copies for distributed)
    published_distance: float  # ||published - reference published with the same Z|| (copy l* for distributed)
    certified: float           # Delta the sigma was calibrated on
    sigma: float
    realized_epsilon: float    # Lemma A.3 at the measured distance and the mechanism's delta
    epsilon: float
    radius: float              # theorem's bound on ||mu'_i - theta*_i|| (nan if not checked)
    to_optimum: float          # measured ||mu'_i - theta*_i|| (nan if not checked)
    ref_to_optimum: float      # measured ||mu_i - theta*_i|| (nan if not checked)

    @property
    def ratio(self) -> float:
        return self.distance / self.certified if self.certified > 0 else 0.0


Event = tuple  # ("delete", step) or ("add", x, y)


def optimum(engine: DescentToDelete, view: DatasetView, start: np.ndarray, tol: float = 1e-13,
            max_iter: int = 200_000) -> np.ndarray:
    """theta*_i = argmin over Theta of the epoch's objective on D_i, by projected GD run to a fixed point."""
    saved = engine.grad_evals
    theta = start.copy()
    eta = engine.c.eta
    for _ in range(max_iter):
        new = project_l2_ball(theta - eta * engine._grad(theta, view), engine.R)
        if np.linalg.norm(new - theta) < tol:
            theta = new
            break
        theta = new
    engine.grad_evals = saved
    # linear convergence at rate gamma: the remaining error is at most step / (1 - gamma)
    return theta


def d2d_replay(
    make_engine: Callable[[RecordingNoise], DescentToDelete],
    X: np.ndarray,
    y: np.ndarray,
    n_initial: int,
    events: Sequence[Event],
    seed: int = 0,
    check_optimum: bool = False,
) -> list[D2DReplayPoint]:
    noise = RecordingNoise(SeededNoise(seed))
    eng = make_engine(noise)
    eng.sampler = np.random.default_rng(seed + 1)
    steps = eng.learn(X[:n_initial], y[:n_initial], None)
    store_s, store_X, store_y = list(steps), [*X[:n_initial]], list(y[:n_initial])
    points = []
    for idx, ev in enumerate(events, start=1):
        retained = ArrayRetained(store_s, np.asarray(store_X).reshape(len(store_s), -1), store_y)
        if ev[0] == "delete":
            certs = eng.forget([ev[1]], retained)
            mech = certs[0].mechanism
            j = store_s.index(ev[1])
            del store_s[j], store_X[j], store_y[j]
        else:
            x_new, y_new = np.asarray(ev[1], float).reshape(1, -1), float(ev[2])
            new = eng.learn(x_new, [y_new], retained)
            mech = release.MECHANISM if eng.round > 0 else "exact"
            store_s.append(int(new[0])), store_X.append(x_new[0]), store_y.append(y_new)
        view = DatasetView(ArrayRetained(store_s, np.asarray(store_X).reshape(len(store_s), -1), store_y))
        k, grid = noise.last, eng.last_release.get("grid", 0.0)  # the same lattice draw for the reference

        def publish_ref(theta: np.ndarray) -> np.ndarray:
            return fast.grid_noise_step(theta, k, grid, eng.R) if grid > 0 else project_l2_ball(theta, eng.R)
        saved = eng.grad_evals
        if eng.variant == "distributed":
            refs = eng.reference_partitions(view)
            means = eng.part_theta.mean(axis=1)
            dist = float(np.max(np.linalg.norm(means - refs, axis=1)))
            ref_pub = publish_ref(refs[eng.selected])
            radius = to_opt = ref_opt = math.nan
        else:
            ref = eng.train_from_scratch(view)
            mean = eng._last_mean
            dist = float(np.linalg.norm(mean - ref))
            ref_pub = publish_ref(ref)
            radius = to_opt = ref_opt = math.nan
            if check_optimum and eng.round > 0:
                opt = optimum(eng, view, mean)
                radius = eng.invariant_radius(eng.round)
                to_opt = float(np.linalg.norm(mean - opt))
                ref_opt = float(np.linalg.norm(ref - opt))
        eng.grad_evals = saved
        pub_dist = float(np.linalg.norm(eng.published() - ref_pub))
        points.append(D2DReplayPoint(
            idx, ev[0], eng.round, mech, dist, pub_dist, eng.sensitivity, eng.sigma,
            dm.gaussian_epsilon(dist, eng.sigma, eng.mechanism_delta), eng.spec.epsilon, radius, to_opt, ref_opt,
        ))
    return points
