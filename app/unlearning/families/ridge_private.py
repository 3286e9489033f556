"""exact_ridge with ``publication: "private"`` (issue 38): exact inside, differentially private outside.

Why.  An exact forget publishes two versions that differ by exactly the forgotten record's influence: with
H = D A D + l2 I before it, H (W_after^T - W_before^T) = x~ (W_after x~ - t)^T, a rank-one matrix whose intercept
coordinate is 1, so whoever knows H (or estimates it) reads the record off two versions (issue 38 measured it
bit for bit).  In this mode the exact integer sums stay secret and every forget stays exact inside; what is
published is solved from *noisy* sums.

* **Continual release over the write stream** (the binary-tree mechanism: Dwork, Naor, Pitassi & Rothblum 2010;
  Chan, Shi & Song 2011, Alg. 2; sufficient-statistics perturbation as in Wang 2018).  Time steps are the model's
  write requests (learns and forgets: public events; a step's records are private).  Every ``release_every``
  requests the model makes a release r = 1, 2, ..., at most ``release_horizon`` = R of them; the tree's leaves are
  releases, its levels = bit_length(R).  Release r publishes the exact sums *now* plus the noise of the dyadic
  nodes of the binary decomposition of r (one per set bit of r):
      A^_r = A_r + sum_{nodes of r} N_node,    B^_r = B_r + sum_{nodes of r} M_node,
  which is exactly the binary mechanism's sum of noisy node sums (a node's sum is the change of the exact sums over
  its releases).  At release r the node of level h = lowest set bit of r completes: its noise is drawn fresh and
  the nodes below it are dropped.  **The state keeps only the nodes' noise, never a noisy sum** (a noisy sum
  would keep a forgotten record): after a forget, every later release is the exact sums without the record plus
  noise that does not depend on data.
* **Noise on the integer grid.**  N_node is a symmetric matrix whose upper triangle (p (p + 1) / 2 entries) is
  drawn i.i.d. from the exact discrete Gaussian N_Z(0, sigma_A^2), M_node (K x p) from N_Z(0, sigma_B^2) (CKS20,
  the service's secure source: app/unlearning/mechanism/noise.py); both in the sums' own integer units.
* **Sensitivity.**  One record adds q q^T to A (upper triangle: sum_{i<=j} (q_i q_j)^2 <= ||q||^4) and q_t q^T to B,
  with ||q||^2 <= Delta_A = (X 2^kx + sqrt(d)/2)^2 + 4^kc and ||q_t q^T|| <= Delta_B = ||q_t|| sqrt(Delta_A)
  (RidgeGrid.feature_norm2, target_norm): integer vectors, so each node is a discrete Gaussian mechanism with
  rho_node = Delta_A^2 / (2 sigma_A^2) + Delta_B^2 / (2 sigma_B^2) (CKS20 Thm 14, zCDP composition).
* **Privacy.**  Neighbouring streams differ in one record: its learn (in some release's leaf) and, if it was
  forgotten, its forget (in a later leaf), or neither.  At each level at most two nodes contain one of the two
  events (a node containing both has the same sum in both worlds: the add and the remove cancel exactly, in
  integers), so the whole published sequence -- every release, adaptively -- is
      rho_pub = 2 levels rho_node  -zCDP,
  calibrated to the spec's rho: sigma_A = Delta_A sqrt(2 levels / rho) and sigma_B likewise (half of rho_node
  each), rounded up to 29 significant bits for the compiled sampler (more noise, never less).  The whole rho_pub
  is charged when the model is created (ledger entry "creation"); a forget spends nothing.  Group privacy for k
  records: k^2 rho_pub.
* **Published weights** from the noisy sums, positive definite in a data-independent way:
      W_r solves (D A^_r D + (l2 + s_r) I) W^T = D B^_r^T 2^-ky  by the eigendecomposition, eigenvalues clipped at l2,
  with s_r = 2^(-2 min(kx, kc)) sigma_A sqrt(popcount r) (2 sqrt(p) + SHIFT_TAIL): a bound on the spectral norm of
  the release's noise D N D (a Wigner matrix of entry scale sigma_A sqrt(popcount r) has norm about 2 sigma sqrt(p);
  SHIFT_TAIL adds its Gaussian-concentration margin at probability ~1e-6), so that D A^ D + s_r I dominates
  D A D and the noise does not flip small eigenvalues; the clip makes the system positive definite for every draw.
  All of it is post-processing of the release.  Predictions use the published weights only (as for every family).
* **Horizon.**  After R releases the model publishes nothing more: a learn is refused (409 horizon-reached, naming
  the remedy: a new model with a larger release_horizon or release_every); a forget is still exact inside and
  changes nothing published (the last release was private already).
* **No exact count leaves.**  The model's metadata withholds its step and record counts, the ledger has no deletion
  count and receipts carry no steps (``publishes_counts``); the number of records is only in the noisy corner of A^.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..contract.errors import SpecError
from ..contract.spec import ModelSpec
from ..mechanism import release as release_mechanism
from ..mechanism.fast_dgauss import sigma_for_fast_path
from .ridge_solve import clipped_solve
from .ridge_sums import RidgeGrid, WideInt

PUBLICATIONS = ("exact", "private")
PRIVATE_GRID_BITS = 10        # default grid in private mode: node noise stays in the compiled sampler's range
MAX_RELEASE_HORIZON = 2**40
NOISE_TAILS = 64.0            # |k| <= 64 sigma except with probability < exp(-2000) per draw (CKS20 tail)
NOISE_BOUND = 2**61           # the noise summed over the levels stays below this (the sums' lo words take it)
SHIFT_TAIL = 2.0 * math.sqrt(2.0 * math.log(1e6))

DEFINITION = ("exact unlearning of the secret state (rho = 0 per forget); every published version (epsilon, "
              "delta)-differentially private with respect to each record's learn and forget (binary-tree continual "
              "release over release_horizon releases), charged at creation")
WORDS = (
    "The model's secret state is two integer sums over the records it holds, on a public fixed-point grid, and a "
    "deletion subtracts the record's terms exactly: the state after it is bit for bit the state of a model that "
    "never learned the record. What the model publishes is not that state: every release is solved from the "
    "sums plus discrete Gaussian noise of a binary tree over its releases, so that everything it publishes, over "
    "all its versions, is statistically almost indistinguishable (the stated (epsilon, delta)) from what it would "
    "publish had any one record never been learned (nor forgotten). That cost was charged when the model was "
    "created, for its release_horizon; this deletion spends nothing, and no release after it depends on the record."
)


def normalize_private(hp: dict[str, Any]) -> None:
    """``release_horizon`` (required, 1..2^40) and ``release_every`` (default 1) of a private model, in place."""
    for name, default in (("release_horizon", None), ("release_every", 1)):
        v = hp.get(name, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= MAX_RELEASE_HORIZON:
            need = " (required with publication private: the releases the privacy cost is charged for)" \
                if name == "release_horizon" else ""
            raise SpecError(f"{name} must be an integer in [1, {MAX_RELEASE_HORIZON}]{need}",
                            fields=(f"hyperparameters.{name}",))
        hp[name] = int(v)


def levels_for(horizon: int) -> int:
    return int(horizon).bit_length()


class PrivatePublication:
    """The public calibration of a private model and its secret noise nodes (module docstring)."""

    def __init__(self, spec: ModelSpec, grid: RidgeGrid, hp: Mapping[str, Any]):
        self.horizon = int(hp["release_horizon"])
        self.every = int(hp["release_every"])
        self.levels = levels_for(self.horizon)
        p = spec.dim + 1
        self.p, self.outputs = p, grid.outputs
        self.m_a = p * (p + 1) // 2
        self.m_b = grid.outputs * p
        self.sens_a = grid.feature_norm2()
        self.sens_b = math.nextafter(grid.target_norm() * math.sqrt(self.sens_a), math.inf)
        scale = math.sqrt(2.0 * self.levels / spec.rho) if spec.rho > 0 else math.inf
        self.sigma_a = _sigma(self.sens_a * scale)
        self.sigma_b = _sigma(self.sens_b * scale)
        self.rho_node = (self.sens_a**2 / (2.0 * self.sigma_a**2) + self.sens_b**2 / (2.0 * self.sigma_b**2))
        self.rho = 2.0 * self.levels * self.rho_node
        k = min(grid.kx, grid.kc)
        try:  # beyond the float range for extreme bounds: check() refuses the spec
            self.shift_unit = math.ldexp(self.sigma_a, -2 * k) * (2.0 * math.sqrt(p) + SHIFT_TAIL)
        except OverflowError:
            self.shift_unit = math.inf
        iu = np.triu_indices(p)
        self._upper = iu
        self.nodes = np.zeros((self.levels, self.m_a + self.m_b), dtype=np.int64)
        self.releases = 0
        self.pending = 0
        self.weights: np.ndarray | None = None  # the last release's published W (public), None before any

    def check(self) -> None:
        """Refuse (SpecError) a calibration whose noise would leave the integer words or the float range."""
        fields = ("privacy.epsilon", "hyperparameters.release_horizon", "hyperparameters.grid_bits")
        worst = self.levels * NOISE_TAILS * max(self.sigma_a, self.sigma_b)
        if not (math.isfinite(worst) and worst < NOISE_BOUND and self.rho <= 1.0e300):
            raise SpecError("the privacy budget and release_horizon need node noise beyond the 62-bit integers the "
                            "sums are held in: lower grid_bits, raise privacy.epsilon or lower release_horizon",
                            fields=fields)
        if not (math.isfinite(self.shift_unit) and self.shift_unit * math.sqrt(self.levels) < 1e300):
            raise SpecError("the noise's positive-definite shift is not a finite number at these bounds",
                            fields=("bounds.x_norm", *fields))

    # ---- state --------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"noise_nodes": self.nodes.copy(), "releases": self.releases,
                               "pending": self.pending}
        if self.weights is not None:
            out["released_weights"] = self.weights.copy()
        return out

    def load(self, state: Mapping[str, Any]) -> None:
        nodes = np.asarray(state["noise_nodes"])
        if nodes.shape != self.nodes.shape or nodes.dtype.kind not in "iu":
            raise ValueError("stored noise nodes do not match the model's release_horizon or dimension")
        self.nodes = nodes.astype(np.int64)
        self.releases = int(state["releases"])
        self.pending = int(state["pending"])
        w = state.get("released_weights")
        self.weights = None if w is None else np.asarray(w, dtype=np.float64).reshape(self.outputs, self.p).copy()

    # ---- the tree ----------------------------------------------------------------------------------------
    @property
    def releases_left(self) -> int:
        return self.horizon - self.releases

    def step(self, noise) -> bool:
        """One write request: True when it completes a release (every ``release_every`` requests, within the
        horizon); then the new node's noise is drawn and the nodes below it dropped (Chan et al. Alg. 2)."""
        if self.releases >= self.horizon:
            return False
        self.pending += 1
        if self.pending < self.every:
            return False
        self.pending = 0
        r = self.releases + 1
        h = (r & -r).bit_length() - 1
        node = np.empty(self.m_a + self.m_b, dtype=np.int64)
        node[: self.m_a] = noise.discrete_gaussian(self.sigma_a, self.m_a)
        node[self.m_a :] = noise.discrete_gaussian(self.sigma_b, self.m_b)
        self.nodes[:h] = 0
        self.nodes[h] = node
        self.releases = r
        return True

    def noise(self) -> tuple[np.ndarray, np.ndarray]:
        """The current release's noise: the symmetric p x p matrix for A and the K x p one for B (int64)."""
        total = self.nodes.sum(axis=0)  # levels whose bit of r is clear hold zeros
        N = np.zeros((self.p, self.p), dtype=np.int64)
        N[self._upper] = total[: self.m_a]
        N.T[self._upper] = total[: self.m_a]
        return N, total[self.m_a :].reshape(self.outputs, self.p)

    def noisy_sums(self, A: WideInt, B: WideInt) -> tuple[WideInt, WideInt]:
        """A^ = A + N, B^ = B + M as exact integers (|N|, |M| < 2^61 and lo in [-2^61, 2^61): no int64 wraps)."""
        N, M = self.noise()
        out = []
        for S, Z in ((A, N), (B, M)):
            S2 = S.copy()
            S2.normalise()
            S2.add_words(Z, 1)
            S2.normalise()
            out.append(S2)
        return out[0], out[1]

    def shift(self) -> float:
        """s_r (module docstring): from the release index alone."""
        return self.shift_unit * math.sqrt(bin(self.releases).count("1"))

    def solve(self, M: np.ndarray, R: np.ndarray, l2: float) -> np.ndarray:
        """The published W from the scaled noisy sums M = D A^ D, R = D B^^T 2^-ky (module docstring)."""
        M = M.copy()
        M.flat[:: M.shape[0] + 1] += l2 + self.shift()
        return clipped_solve(M, R, l2)

    # ---- what the service shows -------------------------------------------------------------------------
    def constants(self) -> dict[str, float | int]:
        return {"release_horizon": self.horizon, "release_every": self.every, "levels": self.levels,
                "node_sigma_sums": self.sigma_a, "node_sigma_targets": self.sigma_b,
                "node_sensitivity_sums": self.sens_a, "node_sensitivity_targets": self.sens_b,
                "rho_publication": self.rho}

    def ledger(self, spec: ModelSpec) -> dict[str, Any]:
        return {"accounting": "dp_from_start", "rho_spent": self.rho, "rho_budget": spec.rho,
                "capacity_total": None, "capacity_left": None, "release_horizon": self.horizon,
                "release_every": self.every, "releases_left": self.releases_left,
                "mechanism": release_mechanism.MECHANISM, "node_sigma_sums": self.sigma_a,
                "node_sigma_targets": self.sigma_b}

    def creation_charge(self) -> dict[str, Any]:
        return {"sigma": self.sigma_a, "rho": self.rho, "mechanism": release_mechanism.MECHANISM,
                "sensitivity": self.sens_a}

    def certificate_details(self) -> dict[str, float]:
        return {"rho_charged_at_creation": self.rho, "rho_node": self.rho_node, "levels": float(self.levels),
                "release_horizon": float(self.horizon), "exact_state": 1.0}


def _sigma(s: float) -> float:
    """sigma rounded up for the compiled sampler (sigma_for_fast_path), or inf where it is not a finite number."""
    if not (math.isfinite(s) and s > 0.0):
        return math.inf
    return sigma_for_fast_path(s)
