"""Online DP baseline (digest §1.7, §2.9; 001 Table 2 / 000 Table 1, "Online DP"): a learner that is
differentially private from the start, so forgetting costs nothing.

Learner: private follow-the-regularised-leader with linearised losses (Guha Thakurta & Smith 2013, "(Nearly)
Optimal Algorithms for Private Online Learning in Full-information and Bandit Settings", PFTAL with the quadratic
regulariser).  At step t the model plays the published w_t, receives f_t, and linearises it at the played point:
g_t = grad f_t(w_t).  The next play is

    w_{t+1} = argmin_{w in K} <G^_t, w> + (lambda/2) ||w||^2 = Pi_K( -G^_t / lambda ),    w_1 = 0,

where G^_t is the prefix sum G_t = g_1 + ... + g_t released by **tree-based aggregation** (the binary counting
mechanism, Dwork, Naor, Pitassi & Rothblum 2010; Chan, Shi & Song 2011, Alg. 2): every dyadic interval
[j 2^h + 1, (j + 1) 2^h] is a node; when it completes (at step (j + 1) 2^h, the step whose lowest set bit is h) its
gradient sum is released once with its own noise N(0, sigma^2 I); G^_t is the sum of the released nodes of the
binary decomposition of t (one per set bit of t, popcount(t) nodes), so G^_t - G_t has covariance
popcount(t) sigma^2 I.  We keep the exact G_t and the noise of the currently completed node of every level and
compute G^_t = G_t + sum_{bits j of t} noise_j: the same number as summing the noisy nodes (exactly, up to float
rounding), and with zero noise it is bit for bit the non-private FTRL.  Cost O(d log T) per step, O(d) per forget.

Privacy (derived, GTS13 Thm 3 / Chan et al. Thm 3.5 in zCDP form).  Neighbouring streams: the OLU reference run
replaces the deleted record f_u by the skip symbol (digest §1.4), i.e. leaf u contributes 0 instead of g_u:
*removal*, so a node's sensitivity is ||g_u|| <= L (2L would be for replacing a record by another).  Conditioned
on the earlier releases (which fix the played points w_s, hence every other g_s), the two streams' node sums differ
only in the nodes containing u: one per level, and a horizon T has levels = floor(log2 T) + 1 = T.bit_length()
levels of nodes that ever complete.  Each node is a Gaussian mechanism with rho = L^2 / (2 sigma^2) (Bun & Steinke
2016 Prop. 1.6) and zCDP composes adaptively, so the whole published sequence is

    rho_tree = levels * L^2 / (2 sigma^2)  -zCDP  for one skipped record.

OLU (Proposition 1, digest §1.7).  The stream with the first i <= k deletions skipped differs in at most k records.
``group_privacy``:
  "proposition_1" (default, the papers' statement): Mironov 2017 Prop. 2 (group privacy of RDP, groups of 2^c):
      (alpha, alpha rho_tree)-RDP with alpha >= 2^(c+1)  =>  D_{alpha/2^c} <= 3^c alpha rho_tree.  With
      k_bar = 2^c = k rounded up to a power of two and alpha' = alpha / k_bar: D_{alpha'} <= alpha' (6^c rho_tree)
      for every alpha' >= 2, i.e. rho_olu = k_bar^(log2 6) rho_tree = k_bar^(1 + log2 3) rho_tree (the digest's
      (alpha/k, k^1.6 eps) with eps = alpha rho_tree).  Only orders >= 2 are covered, so the (epsilon, delta) the
      ledger reports is CKS20's conversion minimised over alpha >= 2 only.
  "gaussian_group" (tighter, derived): with k skipped records a node's sums differ by at most n_node L, n_node the
      skipped records inside it; per level sum n_node^2 <= k^2, so rho_olu = k^2 rho_tree for every alpha > 1
      (zCDP group privacy, Bun & Steinke 2016 Prop. 1.9, made exact for this mechanism).
The node sigma is calibrated so that rho_olu equals the model's budget rho: sigma = L sqrt(levels * group / (2 rho)).
The whole budget is charged when the model is created (the declared horizon T and max_deletions k): the ledger
shows rho_spent = rho_olu from the start, and every deletion is free (certificate mechanism "dp_from_start",
rho = 0, referring to the creation charge).  Learning beyond T, or deletion k + 1, is refused.

Strongly convex losses (``variant`` "strongly_convex", opt-in; GTS13's PFTAL for strongly convex losses): f_s is mu-strongly convex (mu = l2), so f_s(w) >= f_s(w_s) + <g_s, w - w_s> + (mu/2)||w - w_s||^2 and FTRL
runs on these quadratic lower bounds:

    w_{t+1} = argmin_{w in K} <G^_t, w> + (mu/2) sum_{s<=t} ||w - w_s||^2 + (lambda/2)||w||^2
            = Pi_K( (mu W_t - G^_t) / (mu t + lambda) ),    W_t = w_1 + ... + w_t (the played points, public),

(an isotropic quadratic, so the minimiser over the ball is the projection of the free one).  Only G_t is private;
the noise and the privacy analysis are the same.  lambda defaults to 0 here (mu t > 0 from t = 1).  The noise
moves the play by ||b_t|| / (mu t): with a small l2 and a short stream this is far worse than the convex variant
(measured: d = 16, l2 = 0.01, T = 10^4, k = 10: average online logistic loss 1.98 against 1.04), so "convex"
is the default.

Regularisation (``variant`` "convex"): ``lambda`` defaults to sqrt(2 T L (L + sigma sqrt((d+1) levels))) / R, the minimiser over lambda of
the derived bound lambda R^2/2 + T L^2/lambda + T L E||noise||/lambda (FTRL stability plus the shift ||b||/lambda
the noise causes in the play; E||noise|| <= sigma sqrt((d+1) levels)).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from .base import CapacityExhausted, ForgetError, InputError, ModelSpec, RetainedData, SpecError, Unlearner
from .certificate import Certificate
from .domain import project_l2_ball
from .losses import augment
from .noise import NoiseSource
from .passive import _number, _positive_int

GROUP_PRIVACY = ("proposition_1", "gaussian_group")
VARIANTS = ("convex", "strongly_convex")
MAX_HORIZON = 10**12  # 40 tree levels; the state holds one noise vector per level
_LOG2_6 = math.log2(6.0)

WORDS = (
    "The model is differentially private from the moment it is created: everything it ever publishes is "
    "statistically almost indistinguishable (the stated (epsilon, delta)) from what it would publish had up to "
    "max_deletions records never been given to it. A deletion therefore adds no noise and changes nothing; its "
    "whole privacy cost was charged when the model was created, for the declared horizon."
)


def levels_for(horizon: int) -> int:
    """Tree levels whose nodes can complete within the horizon: h = 0..floor(log2 T)."""
    return int(horizon).bit_length()


def group_factor(k: int, group_privacy: str) -> float:
    """rho_olu / rho_tree for k deletions (module docstring)."""
    if group_privacy == "gaussian_group":
        return float(k) ** 2
    c = max(0, math.ceil(math.log2(k) - 1e-12))  # k_bar = 2^c >= k
    return 6.0**c


def cks20_epsilon_from_order(rho: float, delta: float, min_order: float = 2.0) -> float:
    """min over alpha >= min_order of CKS20's per-order conversion of (alpha, alpha rho)-RDP to (eps, delta)-DP:
    eps_alpha = alpha rho + (alpha log(1 - 1/alpha) - log(alpha - 1) + log(1/delta)) / (alpha - 1).  Every alpha
    gives a valid epsilon, so the grid minimum (refined around its best point) is a valid, near-tight bound."""
    log_inv_delta = -math.log(delta)

    def eps(s: np.ndarray) -> np.ndarray:  # s = log(alpha - 1)
        t = np.exp(s)
        a = 1.0 + t
        return a * rho + (a * np.log1p(-1.0 / a) - s + log_inv_delta) / t

    lo = math.log(min_order - 1.0)
    s = np.linspace(lo, lo + 40.0, 4001)
    for _ in range(3):
        e = eps(s)
        i = int(np.argmin(e))
        best = float(e[i])
        step = s[1] - s[0]
        s = np.linspace(max(lo, s[i] - step), s[i] + step, 401)
    return float(np.nextafter(best, np.inf) * (1.0 + 1e-12))


class TreeAggregator:
    """Binary counting mechanism over vectors (Chan, Shi & Song 2011, Alg. 2) in the form the engine stores.

    ``G`` is the exact prefix sum (secret), ``node_noise[j]`` the noise of the last completed node of level j
    (part of the decomposition of t iff bit j of t is set).  ``add(g, draw)`` consumes step t + 1; ``draw(n)``
    returns the new node's noise (sigma * N(0, I), or the discrete mechanism)."""

    def __init__(self, levels: int, n: int):
        self.G = np.zeros(n)
        self.node_noise = np.zeros((levels, n))
        self.t = 0

    def add(self, g: np.ndarray, draw) -> None:
        t = self.t + 1
        h = (t & -t).bit_length() - 1       # the node of level h = lowest set bit of t completes at t
        self.G = self.G + g
        self.node_noise[:h] = 0.0           # merged into the new node: no longer in the decomposition of t
        self.node_noise[h] = draw(self.G.shape[0])
        self.t = t

    def noise(self) -> np.ndarray:
        """G^_t - G_t: the noise of the popcount(t) nodes of the binary decomposition of t."""
        t, b = self.t, np.zeros(self.G.shape[0])
        j = 0
        while t:
            if t & 1:
                b = b + self.node_noise[j]
            t >>= 1
            j += 1
        return b

    def released(self) -> np.ndarray:
        return self.G + self.noise()


def decomposition(t: int) -> list[tuple[int, int]]:
    """The dyadic nodes (start, end) whose union is [1, t] (one per set bit of t, highest first)."""
    out, start = [], 1
    for h in reversed(range(int(t).bit_length())):
        if t >> h & 1:
            out.append((start, start + (1 << h) - 1))
            start += 1 << h
    return out


class OnlineDPTree(Unlearner):
    algorithm = "online_dp_tree"
    accounting = "dp_from_start"
    guarantee_definition = ("(alpha, alpha*rho)-OLU for all alpha >= 2 (Proposition 1: the DP learner's group "
                            "privacy over max_deletions records), charged at creation")
    guarantee_words = WORDS

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.declare_loss(hp)
        self.horizon = int(hp["horizon"])
        self.k = int(hp["max_deletions"])
        self.group_privacy = hp["group_privacy"]
        if self.group_privacy == "gaussian_group":
            self.guarantee_definition = ("(alpha, alpha*rho)-OLU for all alpha > 1 (zCDP group privacy of the DP "
                                         "learner over max_deletions records), charged at creation")
        self.levels = levels_for(self.horizon)
        self.group = group_factor(self.k, self.group_privacy)
        # rho_olu = group * levels * L^2 / (2 sigma^2) = rho  (module docstring)
        self.sigma = self.L * math.sqrt(self.levels * self.group / (2.0 * spec.rho))
        self.rho_olu = self.group * self.levels * self.L**2 / (2.0 * self.sigma**2)
        self.rho_tree = self.rho_olu / self.group
        n = spec.dim + 1
        self.variant = hp["variant"]
        self.strongly_convex = self.variant == "strongly_convex"
        if self.strongly_convex and hp.get("lambda") is None:
            self.lam = 0.0
        elif hp.get("lambda") is None:
            noise_norm = self.sigma * math.sqrt(n * self.levels)
            self.lam = math.sqrt(2.0 * self.horizon * self.L * (self.L + noise_norm)) / spec.domain_radius
        else:
            self.lam = float(hp["lambda"])
        if not (math.isfinite(self.sigma) and self.sigma > 0 and math.isfinite(self.lam)
                and (self.lam > 0 or self.strongly_convex and self.lam >= 0)):
            raise SpecError("the declared bounds give no finite noise scale or regularisation")
        self.epsilon_olu: float | None = None
        if self.group_privacy == "proposition_1":
            # Proposition 1 covers orders >= 2 only: the (epsilon, delta) statement is converted over those
            self.epsilon_olu = cks20_epsilon_from_order(self.rho_olu, spec.delta, 2.0)
            if self.epsilon_olu > spec.epsilon * (1.0 + 1e-6):
                raise SpecError(
                    f"with group_privacy proposition_1 (orders >= 2 only) this budget certifies epsilon = "
                    f"{self.epsilon_olu:.6g} > {spec.epsilon:.6g} at this delta; use group_privacy gaussian_group "
                    "or a smaller epsilon")
        self.tree = TreeAggregator(self.levels, n)
        self.theta = np.zeros(n)
        self.W = np.zeros(n)  # strongly convex variant: sum of the played points (public)
        self.n_deletions = 0

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = dict(spec.hyperparameters)
        unknown = set(hp) - {"horizon", "max_deletions", "lambda", "group_privacy", "variant", "huber_delta"}
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        hp["horizon"] = _positive_int(hp, "horizon", f"for {cls.algorithm} (the privacy cost is charged for it)")
        if hp["horizon"] > MAX_HORIZON:
            raise SpecError(f"horizon must be at most {MAX_HORIZON}")
        hp["max_deletions"] = _positive_int(hp, "max_deletions", f"for {cls.algorithm} (group privacy over k)")
        if hp["max_deletions"] > hp["horizon"]:
            raise SpecError("max_deletions must be at most horizon")
        hp.setdefault("group_privacy", "proposition_1")
        if hp["group_privacy"] not in GROUP_PRIVACY:
            raise SpecError(f"group_privacy must be one of {', '.join(GROUP_PRIVACY)}")
        hp.setdefault("variant", "convex")
        if hp["variant"] not in VARIANTS:
            raise SpecError(f"variant must be one of {', '.join(VARIANTS)}")
        if hp["variant"] == "strongly_convex" and not spec.l2 > 0:
            raise SpecError("variant strongly_convex needs l2 > 0 (strong convexity mu = l2)")
        if hp.get("lambda") is not None:
            lam = _number(hp, "lambda", "a positive number")
            if not (lam > 0 or hp["variant"] == "strongly_convex" and lam >= 0):
                raise SpecError("lambda must be a positive number (>= 0 for variant strongly_convex)")
            hp["lambda"] = lam
        else:
            hp.pop("lambda", None)
        if spec.loss == "huber":
            hp.setdefault("huber_delta", 1.0)
        if not spec.l2 >= 0:
            raise SpecError("l2 must be >= 0")
        return hp

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"theta": self.theta.copy(), "t": self.tree.t, "G": self.tree.G.copy(),
                "node_noise": self.tree.node_noise.copy(), "W": self.W.copy(), "n_deletions": self.n_deletions}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.theta = self.stored_theta(state)
        self.tree.t = int(state["t"])
        self.tree.G = self.stored_theta(state, "G")
        self.W = self.stored_theta(state, "W")
        nodes = np.asarray(state["node_noise"], dtype=np.float64)
        if nodes.shape != self.tree.node_noise.shape:
            raise ValueError("stored tree does not match the model's horizon")
        self.tree.node_noise = nodes.copy()
        self.n_deletions = int(state["n_deletions"])

    @property
    def step(self) -> int:
        return self.tree.t

    def published(self) -> np.ndarray:
        return self.theta.copy()

    def constants(self) -> dict[str, float]:
        return {"L": self.L, "beta": self.beta, "mu": self.mu, "D": 2.0 * self.spec.domain_radius,
                "sigma": self.sigma, "lambda": self.lam, "levels": float(self.levels)}

    def ledger(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "accounting": self.accounting,
            "rho_spent": self.rho_olu,          # charged at creation for the declared horizon and k
            "rho_budget": self.spec.rho,
            "capacity_total": self.k,
            "capacity_left": max(0, self.k - self.n_deletions),
            "deletions": self.n_deletions,
            "rho_tree": self.rho_tree,
            "group_factor": self.group,
            "horizon": self.horizon,
            "learn_left": self.horizon - self.tree.t,
        }
        if self.epsilon_olu is not None:
            out["epsilon"] = self.epsilon_olu
            out["conversion"] = "cks20_order_ge_2"
        return out

    def creation_charge(self) -> dict[str, float]:
        return {"sigma": self.sigma, "rho": self.rho_olu}

    def learn_capacity(self) -> int:
        return self.horizon - self.tree.t

    @property
    def status(self) -> str:
        return "retrain_required" if self.n_deletions >= self.k else "ready"

    # ---- learning ---------------------------------------------------------------------------------
    def node_noise(self, n: int) -> np.ndarray:
        """The noise of one tree node: N(0, sigma^2 I) from the model's noise source (the one place to switch to
        the discrete Gaussian mechanism)."""
        return self.sigma * self.noise.standard_normal(n)

    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        first = self.tree.t + 1
        if len(y) > self.learn_capacity():
            raise InputError(f"the model's horizon is {self.horizon} examples and it has learned {self.tree.t}: "
                             f"it can learn {self.learn_capacity()} more", code="horizon-reached")
        theta, R, lam, tree, mu, W = self.theta, self.spec.domain_radius, self.lam, self.tree, self.mu, self.W
        for x_aug, label in zip(augment(X), y):
            tree.add(self.loss.grad(theta, x_aug, label), self.node_noise)  # linearised at the played w_t
            if self.strongly_convex:  # FTRL on the quadratic lower bounds (module docstring)
                W = W + theta
                theta = project_l2_ball((mu * W - tree.released()) / (mu * tree.t + lam), R)
            else:                     # FTRL with (lambda/2)||w||^2 on the linearised losses
                theta = project_l2_ball(-tree.released() / lam, R)
        self.theta, self.W = theta, W
        return np.arange(first, self.tree.t + 1, dtype=np.int64)

    # ---- unlearning -------------------------------------------------------------------------------
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = [int(s) for s in steps]
        for u in steps:
            if not 1 <= u <= self.tree.t:
                raise ForgetError(f"step {u} was never learned by this model")
        if self.n_deletions + len(steps) > self.k:
            raise CapacityExhausted(
                f"the model's privacy covers {self.k} deletions (max_deletions) and {self.n_deletions} were made; "
                f"it can certify {max(0, self.k - self.n_deletions)} more")
        certs = []
        for u in steps:  # nothing to do: the published sequence was private with respect to u from the start
            self.n_deletions += 1
            certs.append(Certificate(
                learned_step=u, forgotten_step=self.tree.t, deletion_index=self.n_deletions,
                mechanism="dp_from_start", sigma=self.sigma, sensitivity=self.L, rho=0.0,
                details={"rho_charged_at_creation": self.rho_olu, "rho_tree": self.rho_tree,
                         "group_factor": self.group, "levels": float(self.levels), "horizon": float(self.horizon),
                         "max_deletions": float(self.k)}))
        return certs
