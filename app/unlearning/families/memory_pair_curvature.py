"""Memory-pair's curvature memory (paper draft 003; reference/memory-pair.md): the limited-memory quasi-Newton pairs
(s, y) it keeps, their acceptance test, the initial scaling and the compact form that applies the inverse."""
from __future__ import annotations

import math

import numpy as np


class CurvatureMemory:
    """B = lam I + M, M the direct BFGS recursion over the stored data-term pairs from M0 = m0 I.

    The pairs are kept oldest first in fixed-size arrays (``S``, ``R``: memory x p) with a count, so they
    round-trip through ``state()`` as plain float64 arrays.
    """

    def __init__(self, lam: float, curvature_bound: float, memory: int, p: int, m0_fraction: float | None = 1e-3):
        self.lam = float(lam)
        self.m0_fraction = None if m0_fraction is None else float(m0_fraction)
        self.kappa = float(curvature_bound)  # beta - lam: smoothness of the data term
        self.memory = int(memory)
        self.S = np.zeros((memory, p))
        self.R = np.zeros((memory, p))
        self.count = 0
        self.skipped = 0
        self._factor: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None

    # ---- pairs ---------------------------------------------------------------------------------
    def acceptable(self, s: np.ndarray, r: np.ndarray) -> bool:
        ss = float(s @ s)
        sr = float(s @ r)
        if not (ss > 0.0 and math.isfinite(sr)):
            return False
        if sr <= 1e-10 * self.kappa * ss:  # curvature of the data term must be positive (draft Lemma 9.1)
            return False
        return float(r @ r) <= self.kappa * sr * (1.0 + 1e-9)  # co-coercivity: ||r||^2 <= kappa r.s

    def add(self, s: np.ndarray, r: np.ndarray) -> bool:
        if not self.acceptable(s, r):
            self.skipped += 1
            return False
        if self.count == self.memory:
            self.S[:-1] = self.S[1:]
            self.R[:-1] = self.R[1:]
            self.count -= 1
        self.S[self.count] = s
        self.R[self.count] = r
        self.count += 1
        self._factor = None
        return True

    def clear(self) -> None:
        self.S[:] = 0.0
        self.R[:] = 0.0
        self.count = 0
        self._factor = None

    # ---- the operator --------------------------------------------------------------------------------
    def initial_scaling(self) -> float:
        """m0 of M0 = m0 I: kappa with no pairs (nothing known: the most conservative step); otherwise
        ``m0_fraction * kappa``, or with m0_fraction = None the Shanno-Phua r.r / s.r of the newest pair.

        In directions no stored pair has explored, the only curvature known for sure is lam; a small m0 keeps
        B close to lam I there (the plain strongly convex OGD step).  Shanno-Phua puts the newest example's
        curvature into *every* direction: the learner is slower and early records' influence decays slowly (the
        public bound Delta was exceeded for the first records in bench/memory_pair/memory_pair_replay.py), but its
        influence structure matches the removal step.  docs/memory_pair.md has the numbers.
        """
        if self.count == 0:
            return self.kappa
        if self.m0_fraction is None:
            s, r = self.S[self.count - 1], self.R[self.count - 1]
            return min(self.kappa, max(1e-12 * self.kappa, float(r @ r) / float(s @ r)))
        return self.m0_fraction * self.kappa

    def _factorize(self) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        if self._factor is not None:
            return self._factor
        m0 = self.initial_scaling()
        a = self.lam + m0
        k = self.count
        p = self.S.shape[1]
        if k == 0:
            self._factor = (a, np.zeros((p, 0)), np.zeros(0), np.zeros((0, 0)))
            return self._factor
        # Unrolled BFGS: M_i = M_{i-1} - (M_{i-1}s)(M_{i-1}s)^T / s^T M_{i-1} s + r r^T / r^T s.
        A = np.zeros((p, k))  # normalised M_{i-1} s_i
        Bv = np.zeros((p, k))  # normalised r_i
        for i in range(k):
            s, r = self.S[i], self.R[i]
            Ms = m0 * s - A[:, :i] @ (A[:, :i].T @ s) + Bv[:, :i] @ (Bv[:, :i].T @ s)
            sMs = float(s @ Ms)
            A[:, i] = Ms / math.sqrt(sMs) if sMs > 0 else 0.0
            Bv[:, i] = r / math.sqrt(float(r @ s))
        U = np.hstack([A, Bv])
        signs = np.concatenate([-np.ones(k), np.ones(k)])
        Q, Ru = np.linalg.qr(U, mode="reduced")
        core = a * np.eye(Q.shape[1]) + (Ru * signs) @ Ru.T  # B restricted to range(Q)
        evals, evecs = np.linalg.eigh(0.5 * (core + core.T))
        evals = np.maximum(evals, self.lam)  # B >= lam I holds in exact arithmetic; keep it in floating point
        self._factor = (a, Q, evals, evecs)
        return self._factor

    def inverse_apply(self, v: np.ndarray) -> np.ndarray:
        """B^-1 v."""
        a, Q, evals, evecs = self._factorize()
        if Q.shape[1] == 0:
            return v / a
        qv = Q.T @ v
        inside = Q @ (evecs @ ((evecs.T @ qv) / evals))
        return (v - Q @ qv) / a + inside

    def inverse_matrix(self) -> np.ndarray:
        """Dense B^-1 (tests and audits on small dimensions)."""
        p = self.S.shape[1]
        return np.column_stack([self.inverse_apply(e) for e in np.eye(p)])
