"""Coupled replay against retraining (ARCHITECTURE.md §5): the test and audit harness for certificates.

The unlearning run and, for every deletion event i, the reference run on the masked stream (the examples
forgotten up to event i replaced by the skip symbol, the clock kept) are driven with the *same* noise draws and
the same public mechanism: discrete Gaussian noise of the certified sigma on the certified grid at the same
times (the same integer draws k in every run), restarts (exact
certificates with ``details["restart"]``) at the same times with the same random initial draw, and, for adaptive
schedules, the actual run's public step sizes.  At each deletion time tau_i we measure m = ||z - z'|| and
compare the realized divergence m^2 / (2 sigma_acc^2), sigma_acc^2 = sum_j sigma_j^2 Gamma(tau_j, tau_i)^2 over
the noise injected since the last restart, with the certified charge sum_j rho_j since the last restart (a
restart erases everything before it in both runs, and opens a new ledger epoch).

The deletion schedule is fixed in advance (oblivious adversary), so all runs advance event by event together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.unlearner import Unlearner
from ..mechanism.noise import SeededNoise
from ..mechanism.release import MECHANISM


@dataclass(frozen=True)
class ReplayPoint:
    tau: int
    deleted: tuple[int, ...]       # every step forgotten up to and including this event
    distance: float                # m = ||z_tau - z'_tau||
    sigma_acc: float
    realized: float                # m^2 / (2 sigma_acc^2)
    certified: float               # sum of rho over the certificates so far (since the last restart)
    shift_bound: float             # sum_j a_j Gamma(tau_j, tau): the certified bound on m (nonlinear losses)

    @property
    def ratio(self) -> float:
        return self.realized / self.certified if self.certified > 0 else (0.0 if self.realized == 0 else math.inf)


EngineFactory = Callable[[SeededNoise], Unlearner]


def _log_gamma(engine: Unlearner, t1: int, t2: int) -> float:
    if hasattr(engine, "log_gamma"):
        return engine.log_gamma(t1, t2)
    return engine.schedule.log_gamma_sum(t1, t2)


def _is_restart(c: Certificate) -> bool:
    return c.mechanism == "exact" and bool(c.details.get("restart", 0.0))


def mirror(ref: Unlearner, certs: Sequence[Certificate]) -> None:
    """Apply to a reference run the public mechanism the actual run applied, in the same order."""
    for c in certs:
        if c.mechanism == MECHANISM:
            ref.theta = ref.apply_noise(c.sigma, c.details["grid"])
        elif _is_restart(c):
            ref.restart()


def coupled_replay(
    make_engine: EngineFactory,
    X: np.ndarray,
    y: np.ndarray,
    deletions: Mapping[int, Sequence[int]],
    seed: int = 0,
) -> list[ReplayPoint]:
    """Run the stream X, y; after step tau forget the steps ``deletions[tau]``; check every event.

    ``make_engine(noise)`` builds a fresh engine.  Engines must provide ``skip(n)`` (advance the clock with
    no update), ``apply_noise(sigma, grid)`` (the reference run's copy of the deletion mechanism), ``restart()`` if
    they issue restart certificates, and ``data_dependent_steps`` / ``eta_script`` / ``last_eta`` if their step sizes
    depend on the data (the reference runs then use the actual run's public step sizes).
    """
    T = len(y)
    taus = sorted(deletions)
    masks: list[set[int]] = []
    acc: set[int] = set()
    for tau in taus:
        acc = acc | {int(s) for s in deletions[tau]}
        masks.append(set(acc))
    actual = make_engine(SeededNoise(seed))
    refs = [make_engine(SeededNoise(seed)) for _ in taus]
    scripted = bool(getattr(actual, "data_dependent_steps", False))
    eta_trace: dict[int, float] = {}
    if scripted:
        for ref in refs:
            ref.eta_script = eta_trace
    noise_log: list[tuple[int, float, float]] = []   # (tau_j, sigma_j, a_j) since the last restart
    certified = 0.0
    points = []
    t = 0
    for i, tau in enumerate(taus):
        if scripted:
            for s in range(t + 1, tau + 1):      # one step at a time so the public step sizes are known
                actual.learn(X[s - 1 : s], y[s - 1 : s])
                eta_trace[s] = float(actual.last_eta)
        elif tau > t:
            actual.learn(X[t:tau], y[t:tau])
        for ref, mask in zip(refs[i:], masks[i:]):
            _advance(ref, X, y, t, tau, mask)
        t = max(t, tau)
        certs = actual.forget(list(deletions[tau]))
        for ref in refs[i:]:
            mirror(ref, certs)
        for c in certs:
            if _is_restart(c):
                noise_log.clear()
                certified = 0.0
            elif c.mechanism == MECHANISM:
                noise_log.append((tau, c.sigma, c.sensitivity))
                certified += c.rho
        m = float(np.linalg.norm(actual.published() - refs[i].published()))
        sigma2 = 0.0
        shift = 0.0
        for tau_j, sigma_j, a_j in noise_log:
            g = math.exp(_log_gamma(actual, tau_j, tau))
            sigma2 += (sigma_j * g) ** 2
            shift += a_j * g
        realized = m * m / (2.0 * sigma2) if sigma2 > 0 else (0.0 if m == 0 else math.inf)
        points.append(ReplayPoint(tau, tuple(sorted(masks[i])), m, math.sqrt(sigma2), realized, certified, shift))
    if t < T:
        actual.learn(X[t:T], y[t:T])
    return points


def _advance(engine: Unlearner, X: np.ndarray, y: np.ndarray, pos: int, until: int, skipped: set[int]) -> int:
    """Learn positions pos+1..until (1-based), skipping the masked ones but keeping the clock."""
    start = pos
    for s in range(pos + 1, until + 1):
        if s in skipped:
            if s - 1 > start:
                engine.learn(X[start : s - 1], y[start : s - 1])
            engine.skip(1)
            start = s
    if until > start:
        engine.learn(X[start:until], y[start:until])
    return until
