"""Coupled replay for the minibatch-SGD family (paper 004): unlearning run vs retraining without the deleted points.

The coupling is the one of the paper's proofs (Lemma 17 / Theorem 18, digest §3.4):

* training draws T x b positions uniformly with replacement from D;
* the retrain reference on D' = D \\ Z uses the *same* positions, except that every draw that hit Z is replaced
  by a fresh uniform draw from D' (so the reference batches are still i.i.d. uniform on D');
* the unlearning run's K batches are the reference's last K batches (R2D: that is what rewinding couples to);
* the unlearned release and the reference release share one noise vector.

With shared noise the published distance equals ||theta''_K - theta'_T||, the quantity the theorems bound in
expectation (R2D: first moment; D2D: second moment).  Several requests are cumulative: request j is compared with
a retrain on D minus every record deleted in requests 1..j.  The realized distance of one coupled run is a single
draw; tests average over seeds before comparing with Sigma.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..contract.unlearner import ArrayRetained, Unlearner


class ScriptedSampler:
    """Returns prescribed (steps, b) position arrays in call order; checks the pool size of every call."""

    def __init__(self, script: Sequence[tuple[int, np.ndarray]]):
        self._script = list(script)

    def positions(self, pool_size: int, steps: int, batch: int) -> np.ndarray:
        pool, pos = self._script.pop(0)
        if pool != pool_size or pos.shape != (steps, batch):
            raise AssertionError(f"scripted sampler: expected pool {pool} and shape {pos.shape}, "
                                 f"got pool {pool_size} and shape {(steps, batch)}")
        return pos


class ScriptedNoise:
    """Returns prescribed N(0, I) vectors (or their lattice versions) in call order."""

    def __init__(self, draws: Sequence[np.ndarray]):
        self._draws = list(draws)

    def standard_normal(self, size: int) -> np.ndarray:
        v = self._draws.pop(0)
        assert v.shape == (size,)
        return v

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        """The prescribed vector xi as lattice noise round(sigma xi) (sigma in grid units): the same k for every
        run that is given the same xi and sigma (a scripted coupling, not an exact N_Z sample)."""
        return np.rint(sigma * self.standard_normal(size)).astype(np.int64)


@dataclass(frozen=True)
class SGDReplayPoint:
    deleted: tuple[int, ...]   # 0-based positions in X deleted so far (cumulative)
    distance: float            # ||theta''_K - theta'_T|| = published distance under shared noise
    sigma: float               # noise the release used
    sensitivity: float         # calibrated Sigma (at the capacity the sigma was fixed for)
    sigma_at_m: float          # Sigma at the cumulative m of this request


EngineFactory = Callable[[object, object], Unlearner]  # (noise, sampler) -> engine


def coupled_sgd_replay(make_engine: EngineFactory, X: np.ndarray, y: np.ndarray,
                       requests: Sequence[Sequence[int]], seed: int = 0) -> list[SGDReplayPoint]:
    """Train on all of (X, y), then forget ``requests`` (lists of 0-based positions) one after the other."""
    rng = np.random.Generator(np.random.PCG64(seed))
    n = len(y)
    probe = make_engine(ScriptedNoise([]), ScriptedSampler([]))
    T, K, b, dim = probe.T, probe.K, probe.b, probe.dim
    P = rng.integers(0, n, size=(T, b), dtype=np.int64)
    xi_train = rng.standard_normal(dim)

    cum: list[int] = []
    refs = []  # (cumulative Z, reference batches, unlearning batches, shared noise)
    for req in requests:
        cum = sorted(set(cum) | {int(i) for i in req})
        keep = np.setdiff1d(np.arange(n), np.asarray(cum, dtype=np.int64))
        rank = np.full(n, -1, dtype=np.int64)
        rank[keep] = np.arange(len(keep))
        Pp = rank[P]
        hit = Pp < 0
        Pp[hit] = rng.integers(0, len(keep), size=int(hit.sum()))
        if K <= T:
            U = Pp[T - K:].copy()
        else:  # D2D with K > T: any coupling is allowed by Theorem 4; prepend fresh draws
            U = np.vstack([rng.integers(0, len(keep), size=(K - T, b)), Pp])
        refs.append((tuple(cum), keep, Pp, U, rng.standard_normal(dim)))

    actual = make_engine(ScriptedNoise([xi_train] + [r[4] for r in refs]),
                         ScriptedSampler([(n, P)] + [(len(r[1]), r[3]) for r in refs]))
    steps = np.arange(1, n + 1, dtype=np.int64)
    actual.learn(X, y, None)
    if not actual.trained:
        raise AssertionError("initial_size must be <= len(y) for the replay")
    held = np.ones(n, dtype=bool)
    points = []
    for req, (cumZ, keep, Pp, U, xi) in zip(requests, refs):
        store = ArrayRetained(steps[held], X[held], y[held])
        actual.forget([int(i) + 1 for i in req], store)
        held[list(req)] = False
        ref = make_engine(ScriptedNoise([xi]), ScriptedSampler([(len(keep), Pp)]))
        ref.learn(X[keep], y[keep], None)
        theta_u, theta_r = actual.last_mean, ref.last_mean  # the pre-noise iterates (the same k is added to both)
        points.append(SGDReplayPoint(
            deleted=cumZ, distance=float(np.linalg.norm(theta_u - theta_r)), sigma=actual.sigma,
            sensitivity=actual.sensitivity, sigma_at_m=actual.sensitivity_bound(actual.n_train, len(cumZ))))
    return points


class SeededSampler:
    """Deterministic with-replacement positions for tests (the service uses rewind.SecureBatchSampler)."""

    def __init__(self, seed: int):
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def positions(self, pool_size: int, steps: int, batch: int) -> np.ndarray:
        return self._rng.integers(0, pool_size, size=(steps, batch), dtype=np.int64)
