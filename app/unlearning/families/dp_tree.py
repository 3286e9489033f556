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
gradient sum is released once with its own noise; G^_t is the sum of the released nodes of the binary
decomposition of t (one per set bit of t, popcount(t) nodes), so G^_t - G_t has covariance popcount(t) sigma'^2 I.
Cost O(d log T) per step, O(d) per forget.

Discrete noise (issue 14 item 1; app/unlearning/mechanism/release.py).  Every node is released through the exact discrete
Gaussian on a public power-of-two grid g = release.grid_resolution(L, d + 1, L T) (L T bounds |node sum|, so node
sums stay below ~2^53 grid units):
    leaf      r_t = round(g_t / g)  (nearest, ties to even; an int64 vector, clipped in exact integers to
              ||r_t||^2 <= M = ceil((L/g + sqrt(d+1)/2)^2), which binds only if float round-off pushes ||g_t|| past L)
    node      S = sum of the leaves r_s in the dyadic interval (exact integer arithmetic: Chan et al. Alg. 2's
              alpha_h = r_t + alpha_0 + ... + alpha_{h-1})
    released  g (S + k),  k ~ N_Z(0, (sigma'/g)^2)^(d+1)  (noise.discrete_gaussian: CKS20's exact sampler)
    prefix    G^_t = g * (sum of the released integers of the decomposition of t), one exact multiplication.
Rounding each leaf (rather than each float node sum, g round(s_node/g)) keeps the node sums exact: the two worlds'
other leaves are bit-identical (conditioned on the earlier releases the played points, hence the other gradients,
are the same floats), so their node sums differ by exactly r_u, ||r_u|| <= sqrt(M) <= L/g + sqrt(d+1)/2 -- no
float summation error enters, and the lattice sensitivity Delta' = g sqrt(M) <= L + g sqrt(d+1)/2 (+ the ceil) is
below the L + g sqrt(d+1) of rounding the node sums.  The node scale is sigma' = sigma Delta'/L, with sigma'/g
rounded up to 30 significant bits for the compiled sampler (sigma_for_fast_path), so by CKS20 Thm 14 each node is
rho_node = Delta'^2 / (2 sigma'^2) <= L^2 / (2 sigma^2)-zCDP: the per-node charge the analysis below uses, and
the charge made at creation is unchanged.  Every integer held stays below 2^62 (checked at creation, with the
noise's 64 sigma'/g tail), so int64 never overflows.  The state stores the exact integer node sums (secret) and
the released integers of the decomposition's nodes.  With k = 0 the engine is, bit for bit, FTRL on the
grid-rounded gradients (integer sums do not depend on the tree's summation order).

Privacy (derived, GTS13 Thm 3 / Chan et al. Thm 3.5 in zCDP form).  Neighbouring streams: the OLU reference run
replaces the deleted record f_u by the skip symbol (digest §1.4), i.e. leaf u contributes 0 instead of r_u:
*removal*, so a node's lattice sensitivity is g ||r_u|| <= Delta' (about L; 2L would be for replacing a record by
another).  Conditioned on the earlier releases (which fix the played points w_s, hence every other g_s), the two
streams' node sums differ only in the nodes containing u: one per level, and a horizon T has
levels = floor(log2 T) + 1 = T.bit_length() levels of nodes that ever complete.  Each node is a discrete Gaussian
mechanism with rho_node = Delta'^2 / (2 sigma'^2) <= L^2 / (2 sigma^2) (CKS20 Thm 14; the continuous Gaussian's
Bun & Steinke 2016 Prop. 1.6 figure) and zCDP composes adaptively, so the whole published sequence is

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
      skipped records inside it (n_node Delta' on the lattice); per level sum n_node^2 <= k^2, so
      rho_olu = k^2 rho_tree for every alpha > 1
      (zCDP group privacy, Bun & Steinke 2016 Prop. 1.9, made exact for this mechanism).
The node sigma is calibrated so that rho_olu equals the model's budget rho: sigma = L sqrt(levels * group / (2 rho)).
The whole budget is charged when the model is created (the declared horizon T and max_deletions k): the ledger
shows rho_spent = rho_olu from the start (ledger entry kind "creation" with sigma = sigma'; the engine ledger's
details name mechanism "discrete_gaussian", the grid, sigma' and Delta'), and every deletion is free (certificate
mechanism "dp_from_start", rho = 0, sigma = sigma', sensitivity = Delta', details["grid"] = g; its receipt names
the grid and the rounding, referring to the creation charge).  Learning beyond T is refused.

Deletion k + 1 of an epoch (issue 29 item 5): the tree's privacy covers k skipped records and the model keeps no
data, so there is nothing to retrain on.  Such a forget is an exact **restart**: the tree, the play and the strongly
convex sums go back to the initial state (w = 0, no node), the step clock keeps counting (a record keeps its step;
the horizon T stays the model's), and a new epoch begins whose tree is charged rho_olu afresh (the service writes
that epoch's ``creation`` ledger entry).  Every record learned before the restart -- those of the request included
-- is then forgotten exactly: nothing published from the restart on depends on them (the plays and gradients of the
new epoch are functions of its own records and noise only), and the run that never saw them restarts at the same
public time (the deletion count).  The receipts say so (mechanism "exact", ``restart`` on the request's first); a
later forget of a record learned before the restart is exact and free.  Before, the forget answered 409 "retrain it"
while the model could not retrain, and no record could be forgotten again.

Strongly convex losses (``variant`` "strongly_convex"): withdrawn at creation (issue 21 item 3).  GTS13's PFTAL for
mu-strongly convex f_s (mu = l2) runs FTRL on the quadratic lower bounds <g_s, w - w_s> + (mu/2)||w - w_s||^2:

    w_{t+1} = Pi_K( (mu W_t - G^_t) / (mu n_t + lambda) ),   W_t = sum of the played points w_s of the received
                                                            losses, n_t = how many losses were received.

The papers' reference run replaces the deleted f_u by the skip symbol, which "does not update the output and is
ignored in all future updates" (001 §2, 000 eq. (4)): FTRL's leader is over the *received* losses, so the run that
never saw f_u drops its whole surrogate -- the linear term (leaf u = 0) *and* its quadratic term (mu w_u leaves W_t,
n_t = t - 1 for t >= u).  The engine as built kept the quadratic term (mu W_t and mu t + lambda include it).  Only the
linear term goes through the tree's noise; the quadratic term changes the map from the released prefix sums to the
plays, so conditioned on the same releases the two worlds play different points at every step after u (before the
deletion is even asked for, so nothing at forget time can undo it) and every later leaf differs: the node sums of
nodes that do not contain u differ too, and the per-level charge Delta'^2/(2 sigma'^2) covers none of it (a leaf can
move by up to 2L, so a calibration for it would be T L per node: no usable budget).  Dropping the term at forget time
does not help for the same reason.  Hence: a new model with ``variant`` strongly_convex is refused at creation
(``check_calibration``, 422 naming ``hyperparameters.variant``); the constructor still loads the models created
before, whose certificates say which comparator they hold against (``LEGACY_SC_DEFINITION``): the skip symbol that
keeps its tick of the clock-indexed proximal term (mu/2)||w - w_u||^2 -- the FTRL form of the papers' OGD reference
with eta_t = 1/(mu t) indexed by the clock, which it equals for lambda = 0 and an inactive projection.
tests/test_dp_tree.py (coupled node replay) shows both: conditioned on the releases, the convex variant's node sums
differ from the never-saw world's by r_u in the nodes containing u and by nothing elsewhere, while the withdrawn
variant's differ in later nodes and exceed the per-level charge.

Regularisation (``variant`` "convex"): ``lambda`` defaults to sqrt(2 T L (L + sigma sqrt((d+1) levels))) / R, the minimiser over lambda of
the derived bound lambda R^2/2 + T L^2/lambda + T L E||noise||/lambda (FTRL stability plus the shift ||b||/lambda
the noise causes in the play; E||noise|| <= sigma sqrt((d+1) levels)).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.errors import ForgetError, InputError, SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData, Unlearner
from ..maths import work_budget as wb
from ..maths.domain import project_l2_ball
from ..maths.losses import augment
from ..mechanism import release
from ..mechanism.calibration import Checks, common_checks, construct
from ..mechanism.fast_dgauss import route as fast_dgauss_route, sigma_for_fast_path
from ..mechanism.noise import NoiseSource, SecureGaussianNoise
from .dp_tree_aggregation import TreeAggregator, cks20_epsilon_from_order, group_factor, levels_for
from .passive_calibration import _number, _positive_int

GROUP_PRIVACY = ("proposition_1", "gaussian_group")
VARIANTS = ("convex", "strongly_convex")
MAX_HORIZON = 10**12  # 40 tree levels; the state holds two integer vectors per level
INT_BOUND = 2**62     # every integer the tree holds (node sums plus noise) stays below this (int64, no overflow)
NOISE_TAILS = 64.0    # |k| <= 64 sigma'/g except with probability < exp(-2000) per draw (CKS20 Prop. 25 tail)
_LOG2_6 = math.log2(6.0)

WORDS = (
    "The model is differentially private from the moment it is created: everything it ever publishes is "
    "statistically almost indistinguishable (the stated (epsilon, delta)) from what it would publish had up to "
    "max_deletions records never been given to it. A deletion therefore adds no noise and changes nothing; its "
    "whole privacy cost was charged when the model was created, for the declared horizon."
)
# models created with the withdrawn variant strongly_convex (module docstring) say which comparator they hold against
LEGACY_SC_COMPARATOR = ("; the reference run's skipped steps keep their clock-indexed proximal term "
                        "(mu/2)||w - w_u||^2 (withdrawn variant strongly_convex: not the run that never saw the record)")
LEGACY_SC_WORDS = (
    "This model was created with the withdrawn variant strongly_convex. Everything it publishes is statistically "
    "almost indistinguishable (the stated (epsilon, delta)) from what it would publish had up to max_deletions "
    "records been replaced by skips that still count one step of its strong-convexity regularisation, centred at "
    "the point it played at that step. A run that never saw the records would not count those steps; this "
    "certificate does not cover that difference. A deletion adds no noise; the privacy cost was charged at creation."
)
WITHDRAWN_SC = ("variant strongly_convex is withdrawn: its FTRL keeps a deleted record's quadratic term "
                "(mu W_t and mu t + lambda include it) in every later play, the run that never saw the record drops "
                "it, and the tree's noise does not cover the difference (issue 21); use variant convex")


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
        n = spec.n_params
        self.variant = hp["variant"]
        self.strongly_convex = self.variant == "strongly_convex"
        if self.strongly_convex:  # a model created before the variant was withdrawn: say what it certifies
            self.guarantee_definition = self.guarantee_definition + LEGACY_SC_COMPARATOR
            self.guarantee_words = LEGACY_SC_WORDS
        if self.strongly_convex and hp.get("lambda") is None:
            self.lam = 0.0
        elif hp.get("lambda") is None:
            noise_norm = self.sigma * math.sqrt(n * self.levels)
            self.lam = math.sqrt(2.0 * self.horizon * self.L * (self.L + noise_norm)) / spec.domain_radius
        else:
            self.lam = float(hp["lambda"])
        if not (math.isfinite(self.sigma) and self.sigma > 0 and math.isfinite(self.lam)
                and (self.lam > 0 or self.strongly_convex and self.lam >= 0)):
            raise SpecError("the declared bounds give no finite noise scale or regularisation",
                            fields=("privacy.epsilon", "bounds.x_norm", "domain_radius", "hyperparameters.lambda"))
        self.epsilon_olu: float | None = None
        if self.group_privacy == "proposition_1":
            # Proposition 1 covers orders >= 2 only: the (epsilon, delta) statement is converted over those
            self.epsilon_olu = cks20_epsilon_from_order(self.rho_olu, spec.delta, 2.0)
            if self.epsilon_olu > spec.epsilon * (1.0 + 1e-6):
                raise SpecError(
                    f"with group_privacy proposition_1 (orders >= 2 only) this budget certifies epsilon = "
                    f"{self.epsilon_olu:.6g} > {spec.epsilon:.6g} at this delta; use group_privacy gaussian_group "
                    "or a smaller epsilon", fields=("privacy.epsilon", "privacy.delta"))
        # the discrete mechanism of every node (module docstring, "Discrete noise"): public grid g, leaf cap M
        self.grid = release.grid_resolution(self.L, n, self.L * self.horizon)
        self.leaf_cap = math.ceil((self.L / self.grid + 0.5 * math.sqrt(n)) ** 2)  # M: ||r_t||^2 <= M (integers)
        self.node_sensitivity = math.nextafter(self.grid * math.sqrt(self.leaf_cap), math.inf)  # Delta' >= L
        # sigma' = sigma Delta'/L (rho per node unchanged), sigma'/g rounded UP for the compiled sampler
        self.sigma_grid = sigma_for_fast_path(self.sigma * self.node_sensitivity / (self.L * self.grid))
        self.node_sigma = self.sigma_grid * self.grid  # exact: g is a power of two
        self.rho_node = self.node_sensitivity**2 / (2.0 * self.node_sigma**2)  # <= L^2 / (2 sigma^2)
        if not (self.horizon * math.sqrt(self.leaf_cap) + self.levels * NOISE_TAILS * self.sigma_grid < INT_BOUND):
            raise SpecError("the declared horizon, max_deletions and budget need a noise scale beyond the 64-bit "
                            "lattice the tree is summed on; declare fewer deletions or a larger budget",
                            fields=("privacy.epsilon", "hyperparameters.max_deletions", "hyperparameters.horizon"))
        self.n_deletions = 0
        self.epoch_start = 0  # the step before this epoch's first record (restarts, module docstring)
        self.n_restarts = 0
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        """The initial state of an epoch: no node, w = 0, no deletion charged to the epoch's tree."""
        n = self.spec.n_params
        self.tree = TreeAggregator(self.levels, n, self.grid)
        self.theta = np.zeros(n)
        self.W = np.zeros(n)  # strongly convex variant: sum of the played points (public)
        self.n_charged = 0    # deletions of this epoch's records, covered by its tree's group privacy (<= k)

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Each learned example: its gradient, one node's discrete Gaussian draw of p coordinates and the sums over
        the tree's levels (log2 horizon); a forget changes nothing.  The tree holds 2 x levels x p integers.

        The draws dominate at large p, and their cost depends on the node scale sigma'/g (fast_dgauss.route): the
        compiled kernel's ~0.3 us per coordinate below 2^29, but the pure path's ~50 us beyond 2^30.5 (issue 29:
        dim 50 000, x_norm 9.25, epsilon 0.0874, horizon 10^6, 10 deletions has sigma'/g = 2.2e9, and the estimate
        that counted the kernel was 100x short)."""
        p, levels = spec.n_params, levels_for(int(spec.hyperparameters["horizon"]))
        sigma_grid = cls(spec, SecureGaussianNoise()).sigma_grid  # public constants only: it never draws
        route = fast_dgauss_route(sigma_grid)
        per = wb.STEP + p * (wb.draw(route) + (2.0 * levels + 12.0) * wb.FLOP)
        hint = "" if route == "kernel" else (
            f", or raise privacy.epsilon, or lower hyperparameters.max_deletions, hyperparameters.horizon or "
            f"bounds.x_norm: the node noise of {sigma_grid:.3g} grid steps is beyond the compiled sampler's range "
            "(2^29), and each coordinate drawn there costs up to 200 times more")
        # a forget builds its certificate (20-50 us measured, issue 36): 2 STEP
        return wb.Cost(learn=batch * per, forget=2 * wb.STEP, forget_each=wb.STEP, array_bytes=wb.F64 * levels * p,
                       learn_fields=("dim", "n_classes"), memory_fields=("dim", "hyperparameters.horizon"), hint=hint)

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """The worst case of the tree (module docstring): the loss constants, the node sigma for the declared horizon
        and max_deletions, the grid and leaf cap (the constructor refuses integers beyond INT_BOUND = 2^62, which
        also keeps every draw k ~ N_Z(0, (sigma'/g)^2) inside int64), and the largest play before the projection:
        |G^_t| <= g (T sqrt(M) + levels 64 sigma'/g) = G_max, so ||-G^/lambda|| <= G_max/lambda, checked squared.
        The withdrawn variant strongly_convex is refused first (module docstring)."""
        if spec.hyperparameters.get("variant") == "strongly_convex":  # withdrawn (module docstring); creation only
            raise SpecError(WITHDRAWN_SC, fields=("hyperparameters.variant",))
        checks = Checks(cls.algorithm)
        eng = construct(cls, spec)
        common_checks(checks, eng.loss, spec)
        eps = ("privacy.epsilon", "privacy.delta")
        hp = ("hyperparameters.max_deletions", "hyperparameters.horizon")
        checks.finite("rho", spec.rho, *eps, positive=True)
        checks.squared("sigma", eng.sigma, *eps, *hp, "bounds.x_norm", positive=True)
        checks.finite("grid", eng.grid, "bounds.x_norm", positive=True)
        checks.finite("L/g", eng.L / eng.grid, "bounds.x_norm")
        checks.finite("sigma'/g", eng.sigma_grid, *eps, *hp, positive=True)
        checks.finite("rho_node", eng.rho_node, *eps, "bounds.x_norm", positive=True)
        g_max = checks.finite("G_max", eng.grid * (eng.horizon * math.sqrt(eng.leaf_cap)
                                                   + eng.levels * NOISE_TAILS * eng.sigma_grid), *eps, *hp)
        lam = ("hyperparameters.lambda", "domain_radius")
        checks.finite("lambda", eng.lam, *lam, positive=True)
        checks.squared("play_norm", g_max / eng.lam, *lam, *eps, "bounds.x_norm")
        # every number the ledger, the creation charge and each deletion's receipt publish (a huge budget once
        # gave epsilon_olu = inf: the receipt's canonical JSON refused it, a 500 at unlearn)
        published = {**eng.ledger(), **eng.creation_charge(), "rho_olu": eng.rho_olu, "rho_tree": eng.rho_tree}
        for k, v in published.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                checks.finite(f"ledger {k}", v, *eps, *hp, "bounds.x_norm")

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
        # the tree as integers on the public grid: exact node sums (secret) and released node values
        return {"theta": self.theta.copy(), "t": self.tree.t, "node_sums": self.tree.acc.copy(),
                "node_released": self.tree.rel.copy(), "W": self.W.copy(), "n_deletions": self.n_deletions,
                "epoch_start": self.epoch_start, "n_charged": self.n_charged, "n_restarts": self.n_restarts}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if "node_sums" not in state:
            raise ValueError("stored tree predates the discrete mechanism (continuous node noise)")
        self.theta = self.stored_theta(state)
        self.tree.t = int(state["t"])
        self.W = self.stored_theta(state, "W")
        for key, attr in (("node_sums", "acc"), ("node_released", "rel")):
            nodes = np.asarray(state[key])
            if nodes.shape != getattr(self.tree, attr).shape or nodes.dtype.kind not in "iu":
                raise ValueError("stored tree does not match the model's horizon")
            setattr(self.tree, attr, nodes.astype(np.int64))
        self.n_deletions = int(state["n_deletions"])
        # states stored before restarts existed: one epoch from step 0, every deletion charged to it
        self.epoch_start = int(state.get("epoch_start", 0))
        self.n_charged = int(state.get("n_charged", self.n_deletions))
        self.n_restarts = int(state.get("n_restarts", 0))

    @property
    def step(self) -> int:
        return self.epoch_start + self.tree.t

    def published(self) -> np.ndarray:
        return self.theta.copy()

    def constants(self) -> dict[str, float]:
        return {"L": self.L, "beta": self.beta, "mu": self.mu, "D": 2.0 * self.spec.domain_radius,
                "sigma": self.sigma, "lambda": self.lam, "levels": float(self.levels), "grid": self.grid,
                "node_sigma": self.node_sigma, "node_sensitivity": self.node_sensitivity}

    def ledger(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "accounting": self.accounting,
            "rho_spent": self.rho_olu,          # charged at creation for the declared horizon and k
            "rho_budget": self.spec.rho,
            "capacity_total": self.k,
            "capacity_left": max(0, self.k - self.n_charged),  # this epoch's; the next deletion restarts at 0
            "deletions": self.n_deletions,
            "rho_tree": self.rho_tree,
            "group_factor": self.group,
            "horizon": self.horizon,
            "learn_left": self.horizon - self.step,
            # the node releases' mechanism (public, from the spec): CKS20 Thm 14 on the grid
            "mechanism": release.MECHANISM, "grid": self.grid, "rounding": release.ROUNDING,
            "node_sigma": self.node_sigma, "node_sensitivity": self.node_sensitivity,
        }
        if self.epsilon_olu is not None:
            out["epsilon"] = self.epsilon_olu
            out["conversion"] = "cks20_order_ge_2"
        return out

    def creation_charge(self) -> dict[str, Any]:
        """The creation charge: rho_olu for node releases of the discrete Gaussian of scale sigma' on ``grid``."""
        return {"sigma": self.node_sigma, "rho": self.rho_olu, "mechanism": release.MECHANISM, "grid": self.grid,
                "sensitivity": self.node_sensitivity}

    def learn_capacity(self) -> int:
        return self.horizon - self.step

    # ---- learning ---------------------------------------------------------------------------------
    def node_noise(self, n: int) -> np.ndarray:
        """The integer noise of one tree node: k ~ N_Z(0, (sigma'/g)^2)^n, exact (CKS20), from the noise source."""
        return self.noise.discrete_gaussian(self.sigma_grid, n)

    def leaf(self, g: np.ndarray) -> np.ndarray:
        """r = round(g / grid) (nearest, ties to even; g / grid is exact), clipped in exact integers to
        ||r||^2 <= M (it only binds if the float gradient's norm exceeds L by round-off)."""
        q = np.rint(g / self.grid)
        cap = self.leaf_cap
        norm2 = float(q @ q)
        if not (math.isfinite(norm2) and norm2 <= cap * (1.0 - 1e-9)):
            if not np.all(np.isfinite(q)):
                raise InputError("a gradient is not finite")
            if norm2 > 0.0:  # shrink toward zero (truncation only lowers each |r_j|)
                q = np.trunc(q * (math.sqrt(cap) / math.sqrt(norm2) * (1.0 - 1e-12)))
            r = q.astype(np.int64)
            while sum(int(v) * int(v) for v in r) > cap:  # exact check; at most a step or two
                r = np.trunc(r * (1.0 - 1e-9)).astype(np.int64)
            return r
        return q.astype(np.int64)

    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        first = self.step + 1
        if len(y) > self.learn_capacity():
            raise InputError(f"the model's horizon is {self.horizon} examples and it has learned {self.step}: "
                             f"it can learn {self.learn_capacity()} more", code="horizon-reached")
        theta, R, lam, tree, mu, W = self.theta, self.spec.domain_radius, self.lam, self.tree, self.mu, self.W
        for x_aug, label in zip(augment(X), y):
            tree.add(self.leaf(self.loss.grad(theta, x_aug, label)), self.node_noise)  # linearised at w_t
            if self.strongly_convex:  # FTRL on the quadratic lower bounds (module docstring)
                W = W + theta
                theta = project_l2_ball((mu * W - tree.released()) / (mu * tree.t + lam), R)
            else:                     # FTRL with (lambda/2)||w||^2 on the linearised losses
                theta = project_l2_ball(-tree.released() / lam, R)
        self.theta, self.W = theta, W
        return np.arange(first, self.step + 1, dtype=np.int64)

    # ---- unlearning -------------------------------------------------------------------------------
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = [int(s) for s in steps]
        tau = self.step
        for u in steps:
            if not 1 <= u <= tau:
                raise ForgetError(f"step {u} was never learned by this model")
        if len(set(steps)) != len(steps):
            raise ForgetError("a step is named twice in one forget request")
        current = [u for u in steps if u > self.epoch_start]  # earlier records have no influence left
        if self.n_charged + len(current) > self.k:
            # beyond the tree's group privacy: an exact restart forgets every record learned so far
            self._reset_epoch()
            self.epoch_start = tau
            self.n_restarts += 1
            return [self._exact(u, tau, restart=j == 0) for j, u in enumerate(steps)]
        certs = []
        for u in steps:  # nothing to do: the published sequence was private with respect to u from the start
            if u <= self.epoch_start:
                certs.append(self._exact(u, tau, restart=False))
                continue
            self.n_deletions += 1
            self.n_charged += 1
            certs.append(Certificate(
                learned_step=u, forgotten_step=tau, deletion_index=self.n_deletions,
                mechanism="dp_from_start", sigma=self.node_sigma, sensitivity=self.node_sensitivity, rho=0.0,
                details={"rho_charged_at_creation": self.rho_olu, "rho_tree": self.rho_tree, "grid": self.grid,
                         "rho_node": self.rho_node,
                         "group_factor": self.group, "levels": float(self.levels), "horizon": float(self.horizon),
                         "max_deletions": float(self.k), "epoch": float(self.n_restarts)}))
        return certs

    def _exact(self, u: int, tau: int, restart: bool) -> Certificate:
        """A record with no influence left on anything published from now on (learned before the epoch)."""
        self.n_deletions += 1
        return Certificate(learned_step=u, forgotten_step=tau, deletion_index=self.n_deletions, mechanism="exact",
                           sigma=0.0, sensitivity=0.0, rho=0.0,
                           details={"restart": 1.0 if restart else 0.0, "epoch_start": float(self.epoch_start)})
