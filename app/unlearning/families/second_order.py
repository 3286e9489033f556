"""Second-order active OLU: OGD, and at a deletion warm-started GD, a Newton removal step, then Gaussian noise.

Paper 001 Algorithm 3 (digest §2.8), which gives no theorem; its printed step has the wrong sign and its sigma is
broken (alpha inside sigma, j for i, M undefined; pitfall P14).  Re-derived here after Sekhari, Acharya, Kamath and
Suresh 2021 ("Remember What You Want to Forget", Alg. 1 / Lemma 3 / Thm 3); the full derivation with every constant
is docs/second_order_olu.md.

Learning: projected OGD (the active family's capped strongly convex schedule).  At the deletion of record u at
time tau, with S the retained set (n records, u included), S' = S - u (n' records), F_S the regularised average loss,
G = F_{S'}: step 5, K steps of unconstrained GD on F_S (step 2/(beta+mu)) from the current iterate; step 6, the
Newton removal step with the corrected sign, z' = Pi_B(z_K + (1/n') H^{-1} sum_U grad f(z_K; u)), H = grad^2 G(z_K),
solved directly or by CG to a residual <= tol; step 7, z_tau = Pi_K(z' + discrete Gaussian noise) (P4, P5).

Certificate (docs/second_order_olu.md §5-§6, proof there).  The comparator is the papers' (000 Def. 2.2): this
algorithm run on the stream without u, the clock kept, the same noise.  With e = gamma^K (R + B), s = m L_B/(mu n'),
M the loss's Hessian-Lipschitz constant (squared 0, logistic X~^3/(6 sqrt 3), softmax X~^3/sqrt 2; Huber refused)
and L_B the gradient bound on the ball ||w|| <= B that holds every ERM, both worlds are bounded against the exact
ERM w* = argmin G, the same in both:
  actual     ||z' - w*||     <= Delta_A = max((M/(2 mu))(e + s)^2 + (n/n')(beta/mu) e + tol/mu, gamma^K2 (e + s))  (5.4)
  reference  ||z'_ref - w*|| <= e   (it holds S' = S - u: the same K GD steps on G from its own iterate in K, and a
                                    Newton step with nothing to remove; ``reference_point``)                     (5.6)
  so         ||z' - z'_ref|| <= Delta = min(Delta_A + e, 2B)      (triangle; both points lie in the B-ball)     (5.7)
sigma_i = sqrt(omega i^omega/(2(omega-1) rho)) Delta: the release is (alpha, alpha rho_i)-close to the reference
run's for every pair of histories (joint quasi-convexity), and to Pi_K(w* + noise) (Sekhari-style, Delta >= Delta_A);
later releases are post-processing or later deletions of the same kind; the omega series keeps the charges below
rho.  If no record remains (n' = 0), w* = 0 and the model is set to 0 exactly (mechanism ``exact``).

No data-dependent refusal: if the Newton solve misses its residual target (or LAPACK fails), the Newton point is
replaced by Pi_B of K2 = ``fallback_gd_steps`` GD steps on G from z_K (the second term of 5.4, eq. 5.5); Delta_A
certifies both paths, so nothing published depends on whether the solve converged.
"""
from __future__ import annotations

import math
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.errors import SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData, Unlearner, ogd_learn_work, ogd_replay_work
from ..maths import work_budget as wb
from ..maths.domain import project_l2_ball
from ..maths.losses import augment
from ..maths.schedules import CappedStronglyConvex, Schedule
from ..mechanism import release
from ..mechanism.calibration import (N_MAX, Checks, common_checks, construct, noise_norm_bound, release_checks,
                                     require_release_feasible)
from ..mechanism.noise import NoiseSource
from .retained_descent import OmegaSeriesCharges, normalize_descent_hyperparameters
from .retrain import CHUNK_SIZE, OGDIterate, check_forget_steps, ogd_recompute
from .second_order_numerics import CACHE_FLOATS, _Data, cg, grad_flops_curvature, hessian_lipschitz

SOLVERS = ("auto", "direct", "cg")
DEFAULT_GD_TOLERANCE = 0.01
# auto: a direct (dense) solve up to this many parameters (d + 1, i.e. d <= 200), conjugate gradient above; measured in
# docs/second_order_olu.md (the direct solve forms H in O(n d^2), CG costs O(n d) per iteration).
DIRECT_MAX_PARAMS = 201
HVP_BLOCK_FLOATS = 1 << 18
# the solve's residual target, relative to the public scale m L_B / n' of the right-hand side
SOLVE_RTOL = 1e-9

GUARANTEE_WORDS = (
    "From the deletion on, everything the model publishes is statistically almost indistinguishable (Renyi "
    "divergence at most alpha*rho for every order alpha, i.e. the stated (epsilon, delta)) from what the same "
    "algorithm would have published had the record never been learned. It is equally close to a release computed "
    "from the remaining records only: their exact regularised empirical risk minimiser plus the same noise."
)


class SecondOrderOLU(OmegaSeriesCharges, OGDIterate, Unlearner):  # omega series as active_olu
    algorithm = "second_order_olu"
    accounting = "omega_series"
    needs_retained_data = True
    supports_retrain = True
    guarantee_definition = ("(alpha, alpha*rho)-OLU for all alpha > 1 (against the same algorithm run without the record; "
                            "also against the exact ERM on the remaining data plus the same noise)")
    guarantee_words = GUARANTEE_WORDS

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.declare_loss(hp)
        self.D = 2.0 * spec.domain_radius
        self.omega = float(hp["omega"])
        self.max_gd_steps = int(hp["max_gd_steps"])
        self.gd_tolerance = float(hp["gd_tolerance"])
        self.solver: str = hp["solver"]
        self.schedule: Schedule = CappedStronglyConvex(self.mu, self.beta)
        self.eta_gd = 2.0 / (self.beta + self.mu)
        self.gamma_gd = (self.beta - self.mu) / (self.beta + self.mu)
        self.M = hessian_lipschitz(spec.loss, self.loss.feature_bound)
        self.B, self.L_B = self.erm_bounds()
        self.chunk_size = CHUNK_SIZE
        self._reset(t=0)
        self.n_forgotten = 0  # records forgotten over every epoch (records_held; never reset by a retrain)

    def _reset(self, t: int) -> None:
        self.theta = np.zeros(self.spec.n_params)  # data-independent start in K
        self.t = t
        self.n_deletions = 0
        self.rho_spent = 0.0
        self.epoch = 0

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """The worst case of a deletion (module docstring, docs/second_order_olu.md): M, B, L_B, the GD step and
        contraction; the certified Delta and the planned GD steps K at the largest removal ratio m/n' = N_MAX and at
        K = 0 (e = R + B); the iterates' norms (GD stays within R + 2B of the origin, the Newton point within
        R + B + m L_B/(mu n')), the gradients there; the sigma of the last deletion of the omega series (i = N_MAX),
        its noise norm and the discrete release's sigma'/g (int64 draws)."""
        checks = Checks(cls.algorithm)
        eng = construct(cls, spec)
        common_checks(checks, eng.loss, spec)
        mu_f = ("l2", "bounds.x_norm", "bounds.y_abs")
        eps = ("privacy.epsilon", "privacy.delta", "hyperparameters.omega")
        R, X = spec.domain_radius, eng.loss.feature_bound
        checks.finite("mu", eng.mu, "l2", positive=True)
        checks.finite("M", eng.M, "bounds.x_norm")
        B = checks.squared("B", eng.B, *mu_f)
        checks.squared("L_B", eng.L_B, *mu_f)
        checks.finite("eta_gd", eng.eta_gd, "bounds.x_norm", "l2", positive=True)
        checks.finite("gamma_gd", eng.gamma_gd, "bounds.x_norm", "l2")
        gd_norm = checks.squared("gd_iterate_norm", R + 2.0 * B, "domain_radius", *mu_f)
        checks.squared("gd_gradient", (gd_norm * X + eng.loss.y_abs) * X + eng.mu * gd_norm, "bounds.x_norm",
                       "domain_radius", *mu_f)
        n_worst = N_MAX  # n = N_MAX records, m = N_MAX - 1 of them removed at once: m/n' and n/n' at their largest
        s_max = checks.squared("shift_bound", lambda: eng.shift_scale(n_worst - 1, 1), *mu_f)
        checks.squared("newton_point_norm", R + B + s_max, "domain_radius", *mu_f)
        checks.call("planned_gd_steps", lambda: eng.planned_gd_steps(n_worst, n_worst - 1), *mu_f, "domain_radius")
        checks.call("planned_gd_steps", lambda: eng.planned_gd_steps(2, 1), *mu_f, "domain_radius")
        for m, n in ((1, 2), (n_worst - 1, n_worst)):
            bound = checks.call("Delta", lambda m=m, n=n: eng.sensitivity(0, n, m), *mu_f, "domain_radius")
            checks.finite("Delta", bound["Delta"], *mu_f, "domain_radius")
        checks.finite("rho", spec.rho, *eps, positive=True)
        checks.finite("sigma(1)", lambda: eng.noise_multiplier(1) * 2.0 * B, *eps, positive=True)
        mult = checks.finite("noise_multiplier(last)", lambda: eng.noise_multiplier(N_MAX),
                             "hyperparameters.omega", *eps, positive=True)
        sigma = checks.squared("sigma(last)", mult * 2.0 * B, *eps, *mu_f, positive=True)
        checks.squared("noise_norm", noise_norm_bound(R, sigma, spec.n_params), *eps, "domain_radius")
        # the first deletion's discrete release draws within int64; later ones are refused at runtime once they
        # could not (require_release_feasible in forget)
        release_checks(checks, eng.noise_multiplier(1), spec.n_params, *eps)

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = dict(spec.hyperparameters)
        unknown = set(hp) - {"schedule", "omega", "max_gd_steps", "gd_tolerance", "solver"}
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        hessian_lipschitz(spec.loss, 1.0)  # refuses a loss with no finite M (message names `loss`)
        if not spec.l2 > 0:
            raise SpecError(f"{cls.algorithm} needs l2 > 0 (strong convexity mu = l2 bounds the Newton step)")
        normalize_descent_hyperparameters(hp)  # schedule, omega, max_gd_steps: as active_olu
        hp.setdefault("gd_tolerance", DEFAULT_GD_TOLERANCE)
        g = hp["gd_tolerance"]
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not (0.0 < float(g) <= 1.0):
            raise SpecError("gd_tolerance must be a number in (0, 1]")
        hp["gd_tolerance"] = float(g)
        hp.setdefault("solver", "auto")
        if hp["solver"] not in SOLVERS:
            raise SpecError(f"solver must be one of {', '.join(SOLVERS)}")
        return hp

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Each forgotten record (N = max_records kept, p parameters): K <= max_gd_steps GD passes, the Newton
        system's curvature, conjugate gradient (up to 2p + 50 Hessian-vector products of O(N p)) unless the solver is
        direct, and -- always possible, as CG's fallback -- the dense H (N p^2 to form, p x p) and up to four LAPACK
        solves of p^3/3; the kept records are read once while they fit CACHE_FLOATS, else once per pass."""
        eng = cls(spec)
        p, N = spec.n_params, int(spec.hyperparameters.get("max_records") or batch)
        K = max(eng.planned_gd_steps(2, 1), eng.planned_gd_steps(max(N, 2), 1))
        cg_iters = 0 if eng.use_direct() else 2 * p + 50
        passes = K + 2 + cg_iters
        cached = N * p <= CACHE_FLOATS
        reads = (1 if cached else passes) * wb.read(N, p, CHUNK_SIZE)
        # one CG iteration: a Hessian-vector product over HVP_BLOCK_FLOATS blocks (newton_system), its vector updates
        hvp = wb.hvp_pass(N, p, max(1, HVP_BLOCK_FLOATS // p)) + 10.0 * p * wb.FLOP + wb.GD_STEP
        dense = N * p * p * wb.DENSE_FLOP + 4.0 * (p**3 / 3.0) * wb.DENSE_FLOP + 8.0 * p * p * wb.FLOP
        each = (K * wb.gd_pass(N, p, CHUNK_SIZE) + cg_iters * hvp + dense + wb.release(p)
                + N * grad_flops_curvature(p) + 10 * wb.STEP)  # + the Newton step's Python (measured, issue 36)
        replay = ogd_replay_work(spec, N, CHUNK_SIZE)  # retrain: ogd_recompute, the compiled loop per chunk
        mem = wb.F64 * max(2.0 * p * p, min(N * (p + 1), CACHE_FLOATS + CHUNK_SIZE * p))
        return wb.Cost(learn=ogd_learn_work(spec, batch), forget=reads + each, forget_each=each, retrain=replay,
                       array_bytes=mem, solve=p,
                       forget_fields=("dim", "n_classes", "hyperparameters.max_records", "hyperparameters.max_gd_steps"),
                       memory_fields=("dim", "n_classes"))

    def records_held(self) -> int:
        return self.t - self.n_forgotten

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"theta": self.theta.copy(), "t": self.t, "n_deletions": self.n_deletions,
                "rho_spent": self.rho_spent, "epoch": self.epoch, "n_forgotten": self.n_forgotten}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.theta = self.stored_theta(state)
        self.t = int(state["t"])
        self.n_deletions = int(state["n_deletions"])
        self.rho_spent = float(state["rho_spent"])
        self.epoch = int(state["epoch"])
        self.n_forgotten = int(state.get("n_forgotten", self.n_deletions))  # states stored before the counter

    def constants(self) -> dict[str, float]:
        return {"L": self.L, "beta": self.beta, "mu": self.mu, "D": self.D, "M": self.M}

    def accounting_params(self) -> dict[str, Any]:
        return {"accounting": "omega_series", "rho_budget": self.spec.rho, "delta": self.spec.delta,
                "omega": self.omega, "cap": None}

    def ledger(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "rho_spent": self.rho_spent, "rho_budget": self.spec.rho,
                "capacity_total": None, "capacity_left": None, "deletions": self.n_deletions}

    # ---- public quantities ------------------------------------------------------------------------
    def erm_bounds(self) -> tuple[float, float]:
        """(B, L_B): ||w_S|| <= B for the ERM of every data set (F_S(w_S) <= F_S(0) gives (mu/2)||w_S||^2 <= l_0 with
        l_0 = ln 2 (logistic) or Y^2/2 (squared); logistic also mu w_S = -mean grad l so ||w_S|| <= X~/mu), and
        L_B = sup ||grad l(w; z) + mu w|| over ||w|| <= B (logistic X~ + mu B; squared (B X~ + Y) X~ + mu B)."""
        mu, X = self.mu, self.loss.feature_bound
        if self.spec.loss == "logistic":
            B = min(math.sqrt(2.0 * math.log(2.0) / mu), X / mu)
            return B, X + mu * B
        if self.spec.loss == "softmax":  # l_0 = log K, ||mean grad|| <= sqrt(2) X~ (losses.py)
            G = math.sqrt(2.0) * X
            B = min(math.sqrt(2.0 * math.log(self.spec.n_classes) / mu), G / mu)
            return B, G + mu * B
        Y = self.loss.y_abs * (1.0 + 1e-9)
        B = Y / math.sqrt(mu)
        return B, (B * X + Y) * X + mu * B

    def shift_scale(self, m: int, n_after: int) -> float:
        """m L_B/(mu n'): the bound on ||w_S - w*|| (strong convexity of G; docs §3)."""
        return m * self.L_B / (self.mu * n_after)

    def solve_tolerance(self, m: int, n_after: int) -> float:
        return SOLVE_RTOL * m * self.L_B / n_after

    def sensitivity(self, gd_steps: int, n: int, m: int, *, newton_term: bool = True,
                    reference_term: bool = True) -> dict[str, float]:
        """Delta = min(Delta_A + e, 2B): Delta_A = max((M/(2 mu)) (e + s)^2 + (n/n')(beta/mu) e + tol/mu, gamma^K2 (e + s))
        bounds the actual pre-noise point's distance to w* (Newton path, or the fallback GD path when the solve
        misses), e = gamma^K (R + B) the reference run's (docs eqs. 5.4-5.7); s = m L_B/(mu n')."""
        n_after = n - m
        mu = self.mu
        e = self.gamma_gd**gd_steps * (self.spec.domain_radius + self.B)
        s = self.shift_scale(m, n_after)
        newton = self.M / (2.0 * mu) * (e + s) ** 2 if newton_term else 0.0
        gd = (n / n_after) * (self.beta / mu) * e
        solve = self.solve_tolerance(m, n_after) / mu
        k2 = self.fallback_gd_steps(gd_steps, n, m)
        fallback = self.gamma_gd**k2 * (e + s) if newton_term else 0.0  # (newton_term=False: a negative control)
        actual = max(newton + gd + solve, fallback)
        reference = e if reference_term else 0.0
        # both pre-noise points lie in the ball ||w|| <= B (projected onto it), which holds w*: never farther than 2B
        return {"e_gd": e, "shift_bound": s, "newton_term": newton, "gd_term": gd, "solve_term": solve,
                "fallback_gd_steps": float(k2), "fallback_term": fallback, "reference_term": reference,
                "Delta": min(actual + reference, 2.0 * self.B)}

    def fallback_gd_steps(self, gd_steps: int, n: int, m: int) -> int:
        """K2: the GD steps on G that replace a Newton step whose solve missed its target, the smallest K2 with
        gamma^K2 (e + s) <= the Newton path's bound (docs §5, "When the solve misses"), capped by ``max_gd_steps``;
        public quantities only."""
        n_after = n - m
        e = self.gamma_gd**gd_steps * (self.spec.domain_radius + self.B)
        s = self.shift_scale(m, n_after)
        newton_path = (self.M / (2.0 * self.mu) * (e + s) ** 2 + (n / n_after) * (self.beta / self.mu) * e
                       + self.solve_tolerance(m, n_after) / self.mu)
        g = self.gamma_gd
        if e + s <= newton_path:
            return 0
        if g <= 0.0:
            return min(1, self.max_gd_steps)
        return min(math.ceil(math.log((e + s) / newton_path) / -math.log(g)), self.max_gd_steps)

    def planned_gd_steps(self, n: int, m: int) -> int:
        """The smallest K whose GD term (n/n')(beta/mu) gamma^K (R + B) is at most ``gd_tolerance`` times the dominant
        term: the Newton term at e = 0 when M > 0, else (squared loss: the Newton step is exact) the removal shift
        bound m L_B/(mu n').  Capped by ``max_gd_steps``; public quantities only."""
        n_after = n - m
        s = self.shift_scale(m, n_after)
        dominant = min(self.M / (2.0 * self.mu) * s * s, 2.0 * self.B) if self.M > 0.0 else s
        need = (n / n_after) * (self.beta / self.mu) * (self.spec.domain_radius + self.B) / (self.gd_tolerance * dominant)
        g = self.gamma_gd
        if need <= 1.0 or g <= 0.0:
            return min(1, self.max_gd_steps)
        return min(max(0, math.ceil(math.log(need) / -math.log(g))), self.max_gd_steps)

    # ---- the deletion's computation -----------------------------------------------------------------
    def gd(self, theta: np.ndarray, data: _Data, exclude: Collection[int], n: int, steps: int) -> np.ndarray:
        """``steps`` unconstrained GD steps on F_S (001 Alg. 3 step 5, step 2/(beta+mu))."""
        for _ in range(steps):
            total = np.zeros_like(theta)
            for Xa, y in data.batches(exclude):
                total += self.loss.grad_sum(theta, Xa, y)
            theta = theta - self.eta_gd * (total / n + self.mu * theta)
        return theta

    def curvature(self, scores: np.ndarray) -> np.ndarray:
        """phi''(score): the per-example Hessian weight (grad^2 l = phi'' x~ x~^T) of the scalar-score losses (softmax
        curvature is a K x K block per example: ``loss.hessian_parts`` / ``hvp_sum``)."""
        if self.spec.loss == "logistic":
            s = 0.5 * (1.0 + np.tanh(0.5 * scores))
            return s * (1.0 - s)
        return np.ones_like(scores)

    def newton_system(self, theta: np.ndarray, data: _Data, exclude: Collection[int], n_after: int):
        """(weights, hvp): the per-chunk curvature at theta and v -> H v for H = grad^2 G(theta) (retained average)."""
        parts = None
        loss = self.loss
        if data.cache is not None:  # row blocks of ~2 MB, so that both products of an HVP reuse the block from cache
            rows = max(1, HVP_BLOCK_FLOATS // theta.shape[0])
            parts = [(Xa[i:i + rows], w[i:i + rows]) for Xa, w in
                     ((Xa, loss.hessian_parts(theta, Xa)) for Xa, _ in data.batches(exclude))
                     for i in range(0, len(Xa), rows)]
        mu = self.mu

        def chunks():
            if parts is not None:
                yield from parts
            else:
                for Xa, _ in data.batches(exclude):
                    yield Xa, loss.hessian_parts(theta, Xa)

        def hvp(v: np.ndarray) -> np.ndarray:
            out = np.zeros_like(v)
            for Xa, w in chunks():
                out += loss.hvp_sum(Xa, w, v)
            return out / n_after + mu * v

        def dense() -> np.ndarray:
            H = np.zeros((theta.shape[0], theta.shape[0]))
            for Xa, w in chunks():
                H += loss.hessian_sum(Xa, w)
            H /= n_after
            H[np.diag_indices_from(H)] += mu
            return H

        return hvp, dense

    def use_direct(self) -> bool:
        return self.solver == "direct" or (self.solver == "auto" and self.spec.n_params <= DIRECT_MAX_PARAMS)

    def solve(self, hvp, dense, b: np.ndarray, tol: float) -> tuple[np.ndarray, float, bool]:
        """x with ||H x - b|| <= tol: (x, residual, direct?).  CG (Hestenes-Stiefel) on hvp; if it has not reached
        tol after 2(d+1) + 50 iterations, or for small d, the dense solve (LAPACK gesv on the formed H)."""
        if not self.use_direct():
            x, r = cg(hvp, b, tol, 2 * len(b) + 50)
            if r <= tol:
                return x, r, False
        H = dense()
        x = np.linalg.solve(H, b)
        r = float(np.linalg.norm(H @ x - b))
        for _ in range(3):  # iterative refinement, rarely needed
            if r <= tol:
                break
            x = x + np.linalg.solve(H, b - H @ x)
            r = float(np.linalg.norm(H @ x - b))
        if not r <= tol:
            raise ArithmeticError(f"the Newton system could not be solved to the certified residual {tol:.3g}")
        return x, r, True

    def removal_step(self, theta: np.ndarray, data: _Data, u_batches: list[tuple[np.ndarray, np.ndarray]],
                     exclude: Collection[int], n_after: int, m: int, *, sign: float = 1.0) -> tuple[np.ndarray, float, bool]:
        """001 Alg. 3 step 6 with the corrected sign: theta + (1/n') H^{-1} sum_U grad f(theta; u)."""
        g = np.zeros_like(theta)
        for Xa, y in u_batches:
            g += self.loss.grad_sum(theta, Xa, y) + len(y) * self.mu * theta
        hvp, dense = self.newton_system(theta, data, exclude, n_after)
        x, r, direct = self.solve(hvp, dense, g / n_after, self.solve_tolerance(m, n_after))
        # Pi_B: projection onto the ball ||w|| <= B holding w*, non-expansive towards it (docs §5)
        return project_l2_ball(theta + sign * x, self.B), r, direct

    def removal_or_fallback(self, z: np.ndarray, data: _Data, u_batches, exclude: Collection[int], n_after: int,
                            m: int, fallback_steps: int) -> np.ndarray:
        """The Newton point, or -- if its solve misses the residual target or fails -- Pi_B of ``fallback_steps`` GD
        steps on G from z_K.  Either is within the certified Delta_A of w* (``sensitivity``): nothing published, and
        no refusal, depends on which ran (module docstring)."""
        try:
            out, r, _ = self.removal_step(z, data, u_batches, exclude, n_after, m)
            if r <= self.solve_tolerance(m, n_after) and np.all(np.isfinite(out)):
                return out
        except (ArithmeticError, np.linalg.LinAlgError):
            pass
        return project_l2_ball(self.gd(z, data, exclude, n_after, fallback_steps), self.B)

    # ---- unlearning -------------------------------------------------------------------------------
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = check_forget_steps(steps, self.t, retained, self.algorithm)
        if not steps:
            return []
        i_last = self.n_deletions + len(steps)
        require_release_feasible(self.noise_multiplier(i_last), self.spec.n_params, i_last)
        data = _Data(retained, self.chunk_size)
        tau = self.t
        certs = []
        done: list[int] = []
        n = data.count(())
        for u in steps:  # several deletions in one request: sequential events, each with its own i (P9)
            i = self.n_deletions + 1
            m = 1
            n_after = n - m
            if n_after == 0:  # nothing remains: the ERM is argmin (mu/2)||w||^2 = 0, set exactly
                self.theta = np.zeros_like(self.theta)
                certs.append(Certificate(learned_step=u, forgotten_step=tau, deletion_index=i, mechanism="exact",
                                         sigma=0.0, sensitivity=0.0, rho=0.0,
                                         details={"retained_before": float(n), "retained_after": 0.0}))
            else:
                K = self.planned_gd_steps(n, m)
                z = self.gd(self.theta, data, done, n, K)
                Xu, yu = retained.get([u])
                exclude = done + [u]
                bound = self.sensitivity(K, n, m)
                K2 = int(bound["fallback_gd_steps"])
                z = self.removal_or_fallback(z, data, [(augment(np.asarray(Xu, dtype=np.float64)),
                                                        np.asarray(yu, dtype=np.float64))], exclude, n_after, m, K2)
                floor = self.roundoff_floor(K + K2)
                delta = max(bound["Delta"], floor)  # issue 14 case 2: never certify less than round-off can produce
                sigma = self.noise_multiplier(i) * delta
                rho_i = self.charge(i)
                self.theta, grid, sigma, sens_used = self._release(z, delta, sigma)
                self.rho_spent += rho_i
                details = {**bound, "gd_steps": float(K), "gamma_gd": self.gamma_gd, "eta_gd": self.eta_gd,
                           "M": self.M, "B": self.B, "L_B": self.L_B, "retained_before": float(n),
                           "retained_after": float(n_after), "omega": self.omega,
                           # the planned solver only: whether CG fell back to the direct solve depends on the data
                           "direct_solve": 1.0 if self.use_direct() else 0.0,
                           "grid": grid, "shift": bound["Delta"], "roundoff_floor": floor}
                certs.append(Certificate(learned_step=u, forgotten_step=tau, deletion_index=i,
                                         mechanism=release.MECHANISM, sigma=sigma, sensitivity=sens_used, rho=rho_i,
                                         details=details))
            self.n_deletions = i
            self.n_forgotten += 1
            done.append(u)
            n = n_after
        return certs

    def _release(self, theta: np.ndarray, sensitivity: float, sigma: float) -> tuple[np.ndarray, float, float, float]:
        """The only noise draw: Pi_K(g (round(theta/g) + k)), k ~ N_Z(0, (sigma'/g)^2), through the shared discrete
        release (release.py: grid g, lattice sensitivity Delta + g sqrt(d+1), sigma scaled so rho is unchanged,
        CKS20 Thm 14); projection after the noise (P4, P5).  Returns (theta, grid, sigma_used, sensitivity_used)."""
        R = self.spec.domain_radius
        return release.discrete_release(theta, sensitivity, sigma, self.noise, scale=R, radius=R)

    def roundoff_floor(self, gd_steps: int) -> float:
        """Float64 round-off between the computed z and the exact-arithmetic one the bound Delta is about: each of
        the K gradient-descent steps errs by at most e = C (d + 3) u_64 (R + eta L_B) (release.step_roundoff) and
        the error contracts by gamma_gd per later step, so 2 sum_j gamma_gd^j e (release.roundoff_floor); the
        Newton solve's residual is already in Delta (``solve_term``), its own round-off is one more step's worth."""
        e = release.step_roundoff(self.spec.n_params, self.spec.domain_radius, self.eta_gd * self.L_B)
        return release.roundoff_floor(e, gd_steps + 1, self.gamma_gd)

    def reference_point(self, cert: Certificate, retained: RetainedData) -> np.ndarray:
        """The pre-noise point of the reference run (the same algorithm on the stream without the forgotten records,
        which ``retained`` no longer holds) at the event ``cert``: the same K GD steps on F of what it retains, from
        its own iterate, and a Newton step with nothing to remove, then Pi_B.  Within e = gamma^K (R + B) of w*."""
        if cert.mechanism != release.MECHANISM:  # nothing remains: w* = 0, set exactly
            return np.zeros_like(self.theta)
        data = _Data(retained, self.chunk_size)
        n = data.count(())
        z = self.gd(self.theta, data, (), n, int(cert.details["gd_steps"])) if n else np.zeros_like(self.theta)
        return project_l2_ball(z, self.B)

    def replay_event(self, cert: Certificate, retained: RetainedData) -> None:
        """The reference run's copy of a deletion event (coupled replay, replay_data.py): its own pre-noise point,
        then the actual run's release (the certificate's sigma and grid, the same draws)."""
        z = self.reference_point(cert, retained)
        R = self.spec.domain_radius
        self.theta = release.add_discrete_noise(z, cert.details.get("grid", 0.0), cert.sigma, self.noise, R)

    def retrain(self, retained: RetainedData) -> None:
        """Exact retrain (OGD from 0 over the retained examples, clock kept): a new ledger epoch."""
        t, epoch = self.t, self.epoch
        theta = ogd_recompute(self.loss, self.schedule, self.spec.domain_radius, self.spec.dim, retained,
                              upto=self.t, chunk_size=self.chunk_size)
        self._reset(t=t)
        self.theta = theta
        self.epoch = epoch + 1


