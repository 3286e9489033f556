"""Coupled replay for data-holding families (ARCHITECTURE.md §5): the test and audit harness for their certificates.

Like ``replay.coupled_replay``, but the engines get a retained store: the actual run's store holds every example
learned and not yet forgotten (the forgotten ones are erased after ``forget`` returns, as the service does), and
each reference run -- the same algorithm on the masked stream, clock kept -- holds only the unmasked examples.
At every deletion event the reference replays the actual run's mechanism through ``engine.replay_event(cert,
retained)`` with the same noise draws, in the same order.

The accumulated contraction between events includes the GD phases of active deletions:
G(j, i) = Gamma_OGD(tau_j, tau_i) * prod_{l in (j, i]} gamma_gd^{I_l}.  The checks, which are theorems for correct
certificates (shift composition plus Cauchy-Schwarz), are
    distance <= shift_bound = sum_j a_j G(j, i)      and      distance^2 / (2 sigma_acc^2) <= sum_j rho_j,
with sigma_acc^2 = sum_j sigma_j^2 G(j, i)^2.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.unlearner import ArrayRetained, Unlearner
from ..mechanism.noise import SeededNoise
from .replay import ReplayPoint

EngineFactory = Callable[[SeededNoise], Unlearner]


class _Store:
    def __init__(self, dim: int):
        self.rows: dict[int, tuple[np.ndarray, float]] = {}
        self.dim = dim

    def add(self, steps: Sequence[int], X: np.ndarray, y: np.ndarray) -> None:
        for s, x, label in zip(steps, X, y):
            self.rows[int(s)] = (x, float(label))

    def erase(self, steps: Sequence[int]) -> None:
        for s in steps:
            self.rows.pop(int(s), None)

    def view(self) -> ArrayRetained:
        keys = sorted(self.rows)
        if not keys:  # ArrayRetained cannot be built empty (reshape(0, -1) fails): start from a blank one
            empty = ArrayRetained([0], np.zeros((1, self.dim)), [0.0])
            empty.steps, empty.X, empty.y = empty.steps[:0], empty.X[:0], empty.y[:0]
            return empty
        X = np.array([self.rows[k][0] for k in keys]).reshape(len(keys), self.dim)
        y = np.array([self.rows[k][1] for k in keys], dtype=np.float64)
        return ArrayRetained(np.array(keys, dtype=np.int64), X, y)


def _learn(engine: Unlearner, store: _Store, X: np.ndarray, y: np.ndarray, lo: int, hi: int, masked: set[int]) -> None:
    """Learn stream positions lo+1..hi (1-based) into engine and store, skipping masked ones (clock kept)."""
    start = lo
    for s in range(lo + 1, hi + 1):
        if s in masked:
            if s - 1 > start:
                steps = engine.learn(X[start : s - 1], y[start : s - 1], store.view())
                store.add(steps, X[start : s - 1], y[start : s - 1])
            engine.skip(1)
            start = s
    if hi > start:
        steps = engine.learn(X[start:hi], y[start:hi], store.view())
        store.add(steps, X[start:hi], y[start:hi])


def event_contraction(schedule, events: Sequence[tuple[int, list[Certificate]]], j: int, k: int, i: int) -> float:
    """G from after the noise of certificate k of event j to the noise time of event i (actual run)."""
    tau_j, tau_i = events[j][0], events[i][0]
    log_g = schedule.log_gamma_sum(tau_j, tau_i)
    later = [c for c in events[j][1][k + 1 :]] + [c for _, cs in events[j + 1 : i + 1] for c in cs]
    for c in later:
        I = c.details.get("gd_steps", 0.0)
        if I:
            log_g += I * math.log(c.details["gamma_gd"]) if c.details["gamma_gd"] > 0 else -math.inf
    return math.exp(log_g)


def coupled_replay_data(make_engine: EngineFactory, X: np.ndarray, y: np.ndarray,
                        deletions: Mapping[int, Sequence[int]], seed: int = 0) -> list[ReplayPoint]:
    """Run X, y; after step tau forget ``deletions[tau]`` (one forget call per tau); check every event."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    T, dim = X.shape
    actual = make_engine(SeededNoise(seed))
    store = _Store(dim)
    events: list[tuple[int, list[Certificate]]] = []
    snapshots: list[np.ndarray] = []
    t = 0
    for tau in sorted(deletions):
        _learn(actual, store, X, y, t, tau, set())
        t = tau
        certs = actual.forget(list(deletions[tau]), store.view())
        store.erase(deletions[tau])
        events.append((tau, certs))
        snapshots.append(actual.published())

    points = []
    for i, (tau_i, _) in enumerate(events):
        masked = {c.learned_step for _, cs in events[: i + 1] for c in cs}
        ref = make_engine(SeededNoise(seed))
        ref_store = _Store(dim)
        pos = 0
        for tau_j, certs_j in events[: i + 1]:
            _learn(ref, ref_store, X, y, pos, tau_j, masked)
            pos = tau_j
            for c in certs_j:  # the same mechanism, the same noise, in the same order
                ref.replay_event(c, ref_store.view())
        m = float(np.linalg.norm(snapshots[i] - ref.published()))
        sigma2 = shift = certified = 0.0
        for j, (_, certs_j) in enumerate(events[: i + 1]):
            for k, c in enumerate(certs_j):
                g = event_contraction(actual.schedule, events, j, k, i)
                sigma2 += (c.sigma * g) ** 2
                shift += c.sensitivity * g
                certified += c.rho
        realized = m * m / (2.0 * sigma2) if sigma2 > 0 else (0.0 if m == 0 else math.inf)
        points.append(ReplayPoint(tau_i, tuple(sorted(masked)), m, math.sqrt(sigma2), realized, certified, shift))
    return points
