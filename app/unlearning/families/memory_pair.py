"""The memory pair (paper draft 003): online L-BFGS learner + Newton-style deletion + zCDP odometer.

What is implemented, and where it departs from the draft (reference/memory-pair.md):

Learner (Alg. "Memory Pair Insertion").  f(theta; x, y) = l(theta . x~, y) + (lam/2)||theta||^2 on
K = {||theta|| <= R}, lam = mu = spec.l2.  Step t:  g = grad f(theta),  theta+ = Pi_K(theta - eta_t lam B^-1 g),
then the curvature pair of the same example (s = theta+ - theta, y = grad f(theta+) - g) enters a bounded memory.
The preconditioner lam B^-1 has spectrum in (0, 1], so a step is never longer than the plain OGD / AdaGrad step
with the same eta_t ("strongly_convex": eta_t = 1/(lam t), "adagrad": eta_t = D / sqrt(S_t)); with B = lam I it
*is* that step.  t counts this epoch's inserts and is kept across deletions (the replay reference of
ARCHITECTURE.md §5 skips forgotten examples and keeps the clock; ``skip``).

||B^-1|| <= 1/lam by construction.  The regulariser's curvature is known exactly (its gradient change is lam s),
so the memory stores the data-term pairs (s, r = y - lam s) and B = lam I + M with M the L-BFGS (direct BFGS
recursion from M0 = m0 I, m0 = initial_curvature * (beta - lam) > 0) approximation of the data-term Hessian.
A pair is accepted only when
r.s > 0 (with a relative tolerance) and ||r||^2 <= (beta - lam) r.s (co-coercivity of the (beta-lam)-smooth data
term; exact gradients of an accepted loss always pass).  A BFGS update of a positive definite matrix with a
pair of positive curvature is positive definite, so M > 0 and B >= lam I: every eigenvalue of B^-1 is <= 1/lam.
Numerically, B^-1 v is computed from a QR + eigendecomposition of the low-rank part with the eigenvalues
floored at lam, so the bound also holds in floating point.  Note: clamping only the *initial* scaling
h0 <= 1/lam plus the rule s.y >= lam||s||^2 in the usual two-loop recursion does NOT give ||B^-1|| <= 1/lam
(tests/test_memory_pair.py shows a 2-D counterexample); this is why the shifted form is used.

Deletion (Alg. "Memory Pair Deletion"), corrected:
  * sign: learning moves along -B^-1 g; removal moves along +B^-1 g (theta <- theta + d);
  * scale: the draft steps the full B^-1 g, which is the Newton step for removing a point from a model of *one*
    example.  The model approximates the minimiser of the average of n examples, and the Newton step on the
    leave-one-out objective (n F - f_u)/(n - 1) from theta (where grad F ~ 0) is d = B^-1 g_u / (n - 1).
    ``removal = "loo"`` (default) takes that step; ``removal = "full"`` is the draft's literal step (kept to
    measure it; it overshoots by about n);
  * the direction B^-1 g is clipped to the public bound L/lam (draft Lemma "influence of a single deletion"),
    so ||d|| <= Delta = scale * L/lam holds by construction; Delta uses only public numbers (L, lam, n), never
    the observed ||d||;
  * noise: sigma = Delta / sqrt(2 rho_step), rho_step = rho_tot / m (uniform split over the capacity m),
    theta <- Pi_K(g (round((theta + d)/g) + k)), k ~ N_Z(0, (sigma'/g)^2): the discrete Gaussian on a grid g
    (app/unlearning/mechanism/release.py; Delta' = Delta + g sqrt(p), sigma' = sigma Delta'/Delta, rho_step unchanged), with
    Delta at least the float64 round-off floor of the steps since u (``roundoff_floor``), and the shift carrying the
    re-rounding of the earlier releases of the epoch since u, g_r sqrt(p) each (no contraction is certified for
    the quasi-Newton steps): both worlds round their own point to each release's lattice, which the noise-free
    replay gap does not see (issue 29 item 7; ``rerounding``, history ``release_tau`` / ``release_grid``);
  * odometer: rho_spent += rho_step; a deletion that would exceed rho_tot is refused (CapacityExhausted) and
    status becomes "retrain_required" once no further step fits; retrain(retained) starts a new epoch;
  * the curvature memory is dropped after every deletion: the stored pairs are functions of every example
    learned, including the deleted one, and keeping them would let later models depend on it beyond the noise;
  * deleting the only example left is exact (theta back to the never-learned start), no budget is spent;
  * nothing accepted is unforgettable (issue 29): client mode keeps no data, so a forget beyond the capacity is an
    exact restart (theta 0, a new epoch; every record learned before it forgotten exactly, ``restart`` receipts); a
    model stored with settings now refused forgets by that restart, or by an exact retrain without the records.

What the certificate rests on (the draft does not prove it): Delta bounds ||theta + d - theta_replay||, the gap
to an exact replay without the deleted point; bench/memory_pair/memory_pair_replay.py measures it (it holds on real data; on
~1% of small adversarial streams an early record exceeded it, up to ~1.9 Delta, without the ``burn_in``, default
ceil(beta/lam), which keeps the first inserts' steps at B = beta I: worst 0.98 Delta with it, measured, not proven).
Settings measured as under-noised (an integer ``burn_in`` below ceil(beta/lam), ``initial_curvature =
"shanno_phua"``) are refused; ``UncertifiedMemoryPair`` accepts them for bench/ and tests/ only, outside
``ALGORITHMS``.  Nothing computed from learned data leaves un-noised: S_N = sum ||g_t||^2 is secret, the capacity and
N_gamma formulas are published at the worst case S_N = G^2 N (the draft's closed-form N_gamma is replaced by the exact
root), the adagrad step reads G^2 N after a deletion, and the curvature pairs are dropped.  docs/memory_pair.md
gives the measurements and the reasons in full.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.errors import CapacityExhausted, ForgetError, NotDeletable, UnderNoisedSpec
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData, validate_examples
from ..maths.domain import project_l2_ball
from ..maths.losses import augment
from ..mechanism import release
from ..mechanism.noise import NoiseSource
from .memory_pair_calibration import MemoryPairCalibration
from .memory_pair_curvature import CurvatureMemory


def example_digest(x: np.ndarray, y: float) -> str:
    """SHA-256 of a record's canonical float64 bytes.

    In client mode the service keeps no data; storing this digest at learn time lets it check that the features
    a client sends with an unlearn request are the ones that were learned (a wrong x would make the removal
    step remove something else).
    """
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(np.asarray(x, dtype="<f8")).tobytes())
    h.update(np.asarray([y], dtype="<f8").tobytes())
    return h.hexdigest()


class MemoryPair(MemoryPairCalibration):
    algorithm = "memory_pair"
    accounting = "capacity"
    # Class-level value is the conservative "may need data"; every instance shadows it with its own answer
    # (hyperparameter ``deletion_features``): the service must read it from the instance.
    needs_retained_data: ClassVar[bool] = True
    supports_retrain = True
    guarantee_definition = "rho-zCDP per deletion against the replay model (draft 003 Def. II), capacity m"
    guarantee_words = (
        "Each deletion moves the model by a Newton-style step that removes the record's estimated influence and "
        "adds Gaussian noise calibrated to the public bound Delta on that step; the privacy odometer spends "
        "rho/m per deletion and refuses deletions beyond m until the model is retrained. The closeness to a model "
        "retrained without the record assumes the corrected model is within Delta of that retrain (the draft's "
        "Assumptions 'L-bounded gradients' and 'stable L-BFGS'); this is measured, not proven, and measurements found "
        "adversarial streams where it fails for records learned first."
    )
    removal_sign: ClassVar[float] = 1.0  # +B^-1 g removes influence (tests flip it as a negative control)
    # settings measured as under-noised are refused (UncertifiedMemoryPair lifts this for measurements only)
    refuse_uncertified: ClassVar[bool] = True

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        try:
            hp = self.normalize_hyperparameters(spec)
            self.refused: str | None = None
        except UnderNoisedSpec as e:  # a model stored before the refusal: it may learn, never certify a forget
            hp, self.refused = e.hp, str(e)
        self.hp = hp
        self.declare_loss(hp)
        self.lam = self.mu  # the draft's name for the strong-convexity constant
        self.D = 2.0 * spec.domain_radius
        self.p = spec.n_params
        self.memory_size = int(hp["memory"])
        self.capacity = int(hp["capacity"])
        self.needs_retained_data = hp["deletion_features"] == "retained"  # instance attribute shadows the ClassVar
        self.needs_deletion_features = hp["deletion_features"] == "client"
        self.supports_retrain = self.needs_retained_data  # client mode keeps no data: nothing to retrain on
        self.burn_in = (math.ceil(self.beta / self.lam) if hp["burn_in"] == "auto" else int(hp["burn_in"]))
        self.mem = CurvatureMemory(self.lam, self.beta - self.lam, self.memory_size, self.p,
                                  None if hp["initial_curvature"] == "shanno_phua" else hp["initial_curvature"])
        self.theta = np.zeros(self.p)
        self.t = 0              # step clock: ids of learned examples, monotone across epochs
        self.n_active = 0       # examples currently in the model (this epoch)
        self.n_inserts = 0      # inserts this epoch (the stream length N of the draft)
        self.S_grad = 0.0       # S_N = sum of ||g_t||^2 over this epoch's inserts
        self.rho_spent = 0.0
        self.deletions = 0      # this epoch
        self.deletions_total = 0
        self.epoch = 0
        self.release_tau: list[int] = []      # this epoch's discrete releases: time, sum of the grids at that time
        self.release_grid: list[float] = []
        self.epoch_start = 0    # records learned at steps <= epoch_start are not in the model (restarts)

    def records_held(self) -> int | None:
        return self.t - self.deletions_total if self.needs_retained_data else None

    # ---- state --------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "theta": self.theta.copy(), "pairs_s": self.mem.S.copy(), "pairs_r": self.mem.R.copy(),
            "n_pairs": self.mem.count, "pairs_skipped": self.mem.skipped, "t": self.t, "n_active": self.n_active,
            "n_inserts": self.n_inserts, "S_grad": self.S_grad, "rho_spent": self.rho_spent,
            "deletions": self.deletions, "deletions_total": self.deletions_total, "epoch": self.epoch,
            "release_tau": np.asarray(self.release_tau, dtype=np.int64),
            "release_grid": np.asarray(self.release_grid, dtype=np.float64),
            "epoch_start": self.epoch_start,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        theta = np.asarray(state["theta"], dtype=np.float64)
        S = np.asarray(state["pairs_s"], dtype=np.float64)
        R = np.asarray(state["pairs_r"], dtype=np.float64)
        if theta.shape != (self.p,) or S.shape != (self.memory_size, self.p) or R.shape != S.shape:
            raise ValueError("stored state does not match the model dimension or memory size")
        n_pairs = int(state["n_pairs"])
        if not 0 <= n_pairs <= self.memory_size:
            raise ValueError("stored pair count out of range")
        self.theta = theta.copy()
        self.mem.S, self.mem.R, self.mem.count = S.copy(), R.copy(), n_pairs
        self.mem.skipped = int(state["pairs_skipped"])
        self.mem._factor = None
        self.t = int(state["t"])
        self.n_active = int(state["n_active"])
        self.n_inserts = int(state["n_inserts"])
        self.S_grad = float(state["S_grad"])
        self.rho_spent = float(state["rho_spent"])
        self.deletions = int(state["deletions"])
        self.deletions_total = int(state["deletions_total"])
        self.epoch = int(state["epoch"])
        self.release_tau, self.release_grid = release.load_release_history(state, self.deletions, self.t,
                                                                           self.max_grid)
        self.epoch_start = int(state.get("epoch_start", 0))  # states stored before restarts: 0

    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        return self.theta.copy()

    def constants(self) -> dict[str, float]:
        c_lo, c_hi = self.curvature_bounds()
        return {"L": self.L, "beta": self.beta, "mu": self.lam, "D": self.D, "c": c_lo, "C": c_hi,
                "influence_bound": self.L / self.lam}

    def curvature_bounds(self) -> tuple[float, float]:
        """(c, C) with c I <= B <= C I for every reachable state (public).

        c = lam by construction.  C: trace(M0) <= p kappa and each accepted pair adds at most
        ||r||^2 / r.s <= kappa to the trace (the subtracted term is PSD), so lambda_max(B) <= lam + (p + tau) kappa
        (the draft's Lemma 9.3 form).
        """
        return self.lam, self.lam + (self.p + self.memory_size) * (self.beta - self.lam)

    # ---- odometer, capacity, gate ------------------------------------------------------------------
    @property
    def rho_step(self) -> float:
        return self.spec.rho / self.capacity

    @property
    def capacity_left(self) -> int:
        """Deletions that still fit: rho_spent + k rho_step <= rho_tot.  With the uniform split rho_spent is
        deletions * rho_step (computed by one product, not a running sum, so m = 10000 cannot drift past rho)."""
        return max(0, self.capacity - self.deletions)

    @property
    def status(self) -> str:
        # client mode restarts beyond the capacity (forget): it never needs the retrain it could not do
        return "ready" if self.capacity_left > 0 or not self.supports_retrain else "retrain_required"

    def removal_scale(self, n: int) -> float:
        """1/(n - 1) for the leave-one-out Newton step from a model of n examples; 1 for the draft's step."""
        if self.hp["removal"] == "full":
            return 1.0
        return 1.0 / max(1, n - 1)

    def sensitivity(self, n: int) -> float:
        """Delta: public bound on the removal step from a model of n examples (clip bound L/lam times the scale)."""
        return self.removal_scale(n) * self.L / self.lam

    def sigma_step(self, n: int) -> float:
        return self.sensitivity(n) / math.sqrt(2.0 * self.rho_step)

    def _noise_term(self, m: int, N: int) -> float:
        """Delta_m = m L sigma_step sqrt(2 ln(1/delta_B)), sigma_step at a model of N examples."""
        return m * self.L * self.sigma_step(max(N, 2)) * math.sqrt(2.0 * math.log(1.0 / self.hp["delta_b"]))

    def _regret_coefficient(self, mean_sq_grad: float) -> float:
        """a with G D sqrt(c C S_N) = a sqrt(N) when S_N = mean_sq_grad * N (draft eq. adagrad_regret)."""
        c, C = self.curvature_bounds()
        return self.L * self.D * math.sqrt(c * C * mean_sq_grad)

    def gamma_capacity(self) -> int:
        """Draft Thm 'gamma-deletion capacity' at the current N and S_N: floor of (gamma N - G D sqrt(c C S_N))
        / (L sigma_step sqrt(2 ln(1/delta_B))), at least 0.  Secret (it reads S_N): never published."""
        N = self.n_inserts
        c, C = self.curvature_bounds()
        num = self.hp["gamma"] * N - self.L * self.D * math.sqrt(c * C * self.S_grad)
        per = self._noise_term(1, max(self.n_active, 2))
        return max(0, math.floor(num / per)) if num > 0 else 0

    def sample_complexity(self, m: int | None = None, mean_sq_grad: float | None = None) -> int:
        """N_gamma(m): the smallest N with a sqrt(N) + Delta_m(N) <= gamma N (draft Thm 'gamma-sample complexity').

        S_N is extrapolated as N * (S_N / N so far) (G^2 N before any insert; pass mean_sq_grad = G^2 for the
        worst case).  With removal="loo" Delta_m depends on N through sigma_step; the function
        gamma N - a sqrt(N) - Delta_m(N) is increasing wherever it can be >= 0 (N >= (a/gamma)^2), so bisection
        finds the smallest integer.
        """
        m = self.capacity if m is None else int(m)
        if mean_sq_grad is None:
            mean_sq_grad = self.S_grad / self.n_inserts if self.n_inserts else self.L**2
        a = self._regret_coefficient(mean_sq_grad)
        gam = self.hp["gamma"]

        def ok(N: int) -> bool:
            return a * math.sqrt(N) + self._noise_term(m, N) <= gam * N

        lo = max(2, math.floor((a / gam) ** 2))
        if ok(lo):
            # only possible if the floor above rounded down onto a feasible N: a few steps at most.  Bounded:
            # beyond 2**53, lo - 1 == lo in floating point and the walk would never end
            for _ in range(8):
                if not (lo > 2 and ok(lo - 1)):
                    break
                lo -= 1
            return lo
        hi = lo
        while not ok(hi):
            hi *= 2
            if hi > 10**18:
                return 10**18
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def public_sample_complexity(self) -> int:
        """N_gamma(m) at the worst case S_N = G^2 N (G = L): a function of the spec alone, so publishing it and
        gating on it reveal nothing about the data (the data-dependent ``sample_complexity()`` reads S_N,
        which keeps the gradients of forgotten records; issue 14)."""
        return self.sample_complexity(mean_sq_grad=self.L**2)

    def inference_allowed(self) -> bool:
        """Deferred inference gate: with ``inference_gate`` on, predictions wait until N >= N_gamma(m) at the
        worst case S_N = G^2 N; N is the public insert count."""
        return (not self.hp["inference_gate"]) or self.n_inserts >= self.public_sample_complexity()

    def accounting_params(self) -> dict[str, Any]:
        return {"accounting": "capacity", "rho_total": self.spec.rho, "capacity": self.capacity,
                "delta": self.spec.delta}

    def ledger(self) -> dict[str, Any]:
        """Public numbers only: the spec, the counts of inserts / active records / deletions (public by design)
        and functions of them.  S_N and the formulas that read it (gamma_capacity, the data-dependent sample
        complexity) are not here: S_N keeps the forgotten records' gradients (issue 14, docs/receipts.md)."""
        left = self.capacity_left
        return {
            "accounting": self.accounting, "rho_spent": self.rho_spent, "rho_budget": self.spec.rho,
            "rho_step": self.rho_step, "capacity_total": self.capacity, "capacity_left": left,
            "deletions": self.deletions, "deletions_total": self.deletions_total, "epoch": self.epoch,
            "n_inserts": self.n_inserts, "n_active": self.n_active,
            "sigma_step": self.sigma_step(max(self.n_active, 2)),
            "sample_complexity": self.public_sample_complexity(),
            "inference_allowed": self.inference_allowed(), "status": self.status,
        }

    # ---- learning ---------------------------------------------------------------------------------
    def _eta(self) -> float:
        if self.hp["step"] == "strongly_convex":
            return 1.0 / (self.lam * self.n_inserts)  # the epoch's insert clock, kept across deletions (§5)
        return self.D / math.sqrt(self.S_grad) if self.S_grad > 0 else 0.0

    def _update(self, x_aug: np.ndarray, label: float) -> None:
        theta = self.theta
        g = self.loss.grad(theta, x_aug, label)
        self.n_active += 1
        self.n_inserts += 1
        self.S_grad += float(g @ g)
        direction = self.lam * self.mem.inverse_apply(g)  # spectrum of lam B^-1 in (0, 1]
        new = project_l2_ball(theta - self._eta() * direction, self.spec.domain_radius)
        s = new - theta
        r = (self.loss.grad(new, x_aug, label) - g) - self.lam * s  # data-term gradient change
        self.theta = new
        if self.n_inserts > self.burn_in:  # no curvature pairs during the burn-in (B = beta I, small steps)
            self.mem.add(s, r)

    def skip(self, n: int = 1) -> None:
        """Advance the clock with no update: the replay reference's skip symbol (ARCHITECTURE.md §5)."""
        self.t += n
        self.n_inserts += n

    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        Xa = augment(np.asarray(X, dtype=np.float64))
        y = np.asarray(y, dtype=np.float64)
        first = self.t + 1
        for x_aug, label in zip(Xa, y):
            self.t += 1
            self._update(x_aug, float(label))
        return np.arange(first, self.t + 1, dtype=np.int64)

    # ---- unlearning -------------------------------------------------------------------------------
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        """Remove the examples learned at ``steps``; their features come from ``retained.get(steps)``.

        In "retained" mode the service passes its store; in "client" mode it passes the features the client
        sent with the request (e.g. ``ArrayRetained(steps, X, y)``).  Nothing changes unless every deletion fits.
        """
        steps = [int(s) for s in steps]
        for u in steps:
            if not 1 <= u <= self.t:
                raise ForgetError(f"step {u} was never learned by this model")
        if len(set(steps)) != len(steps):
            raise ForgetError("a step is named twice")
        current = [u for u in steps if u > self.epoch_start]  # earlier records are not in the model (restart)
        if len(current) > self.n_active:
            raise ForgetError("more deletions than examples in the model")
        if retained is None:
            raise ForgetError("memory_pair needs the deleted records' features (from the store or the request)")
        charged = sum(1 for j in range(len(current)) if self.n_active - j > 1)
        if self.refused is not None or (charged > self.capacity_left and not self.supports_retrain):
            return self._forget_exactly(steps, retained)  # settings refused now, or no data to retrain on
        try:
            X, y = retained.get(current)
        except KeyError:
            raise ForgetError("the features of a deleted record are not available") from None
        X, y = validate_examples(self.spec, self.loss, X, y)
        if charged > self.capacity_left:
            raise CapacityExhausted(
                f"deletion capacity spent ({self.deletions} of {self.capacity} this epoch); retrain required")
        Xa = augment(X)
        at = {u: j for j, u in enumerate(current)}
        return [self._forget_one(u, Xa[at[u]], float(y[at[u]])) if u in at else self._exact(u, self.t, False)
                for u in steps]

    def _forget_exactly(self, steps: list[int], retained: RetainedData) -> list[Certificate]:
        """An exact retrain without ``steps`` (retained mode) or a restart (client mode); ``restart`` on the first."""
        self._relearn(retained, exclude=steps) if self.needs_retained_data else self._reset_epoch(start=self.t)
        return [self._exact(u, self.t, restart=j == 0) for j, u in enumerate(steps)]

    def _exact(self, u: int, tau: int, restart: bool) -> Certificate:
        self.deletions_total += 1
        return Certificate(learned_step=u, forgotten_step=tau, deletion_index=self.deletions_total, mechanism="exact",
                           sigma=0.0, sensitivity=0.0, rho=0.0,
                           details={"restart": 1.0 if restart else 0.0, "epoch": float(self.epoch),
                                    "epoch_start": float(self.epoch_start)})

    def roundoff_floor(self, u: int) -> float:
        """Float64 round-off two coupled runs can add to their gap from step u on (release.py): every quasi-Newton
        step (a projected move of length <= D = 2R, the m-pair inverse product included) and every removal step
        errs by at most e = C (p + 2) (m + 1) u_64 (R + D); no contraction is certified for these steps, so the
        errors are summed: 2 e (t - u + 1 + deletions)."""
        R = self.spec.domain_radius
        e = release.step_roundoff(self.p, R, 2.0 * R) * (self.mem.memory + 1)
        return release.roundoff_floor(e, self.t - u + 1 + self.deletions_total, 1.0)

    def rerounding(self, u: int) -> float:
        """The re-rounding at this epoch's releases since u (module docstring; no contraction is certified)."""
        return release.rerounding(self.release_tau, self.release_grid, u, self.p)

    def max_grid(self) -> float:
        """The largest grid a release can have (legacy states' conservative history): that of the largest
        certifiable Delta, the full influence bound L/lam (scale <= 1), doubled for the floor and the re-rounding."""
        return release.grid_resolution(2.0 * self.L / self.lam, self.p, self.spec.domain_radius)

    def _forget_one(self, u: int, x_aug: np.ndarray, label: float) -> Certificate:
        n = self.n_active
        self.deletions_total += 1
        if n <= 1:  # the replay model of an empty stream is the data-independent start: exact
            self.theta = np.zeros(self.p)
            self.mem.clear()
            self.S_grad = self.L**2 * self.n_inserts  # as below: nothing of the record stays in the state
            self.n_active = 0
            self.release_tau, self.release_grid = [], []  # nothing learned remains to carry a shift
            return Certificate(learned_step=u, forgotten_step=self.t, deletion_index=self.deletions_total,
                               mechanism="exact", sigma=0.0, sensitivity=0.0, rho=0.0,
                               details={"n_active": float(n), "epoch": float(self.epoch)})
        g = self.loss.grad(self.theta, x_aug, label)
        v = self.mem.inverse_apply(g)
        clip = self.L / self.lam
        norm = float(np.linalg.norm(v))
        if norm > clip:
            v = v * (clip / norm)
        scale = self.removal_scale(n)
        shift = scale * clip
        floor = self.roundoff_floor(u)
        rerounding = self.rerounding(u)
        delta = max(shift + rerounding, floor)  # issue 14 case 2: never certify less than the round-off can produce
        sigma = delta / math.sqrt(2.0 * self.rho_step)
        # discrete Gaussian release on a grid (release.py): Delta' = Delta + g sqrt(p), sigma' = sigma Delta'/Delta,
        # so Delta'^2/(2 sigma'^2) = rho_step as before (CKS20 Thm 14); projection onto K is post-processing
        self.theta, grid, sigma, delta_used = release.discrete_release(
            self.theta + self.removal_sign * scale * v, delta, sigma, self.noise,
            scale=self.spec.domain_radius, radius=self.spec.domain_radius)
        release.record_release(self.release_tau, self.release_grid, self.t, grid)
        self.mem.clear()
        # S_N holds the deleted record's ||g||^2 and feeds the adagrad step: replace it by its public bound G^2 N
        # (||g|| <= L), so later steps depend on the forgotten record only through the noised theta
        self.S_grad = self.L**2 * self.n_inserts
        self.n_active = n - 1
        self.deletions += 1
        self.rho_spent = min(self.spec.rho, self.deletions * self.rho_step)  # m (rho/m) can round 1 ulp above rho
        return Certificate(
            learned_step=u, forgotten_step=self.t, deletion_index=self.deletions_total, mechanism=release.MECHANISM,
            sigma=sigma, sensitivity=delta_used, rho=self.rho_step,
            details={"n_active": float(n), "removal_scale": scale, "clip_bound": clip, "rho_step": self.rho_step,
                     "capacity": float(self.capacity), "epoch": float(self.epoch), "grid": grid, "shift": shift,
                     "rerounding": rerounding, "roundoff_floor": floor},
        )

    # ---- retrain -----------------------------------------------------------------------------------
    def retrain(self, retained: RetainedData) -> None:
        """New epoch: odometer reset, model relearned from the start on the retained examples in step order.

        The step clock ``t`` is kept (records keep their step ids)."""
        self._relearn(retained)

    def _reset_epoch(self, start: int = 0) -> None:
        self.epoch_start = start  # 0 after a retrain: every retained record is in the model again
        self.theta = np.zeros(self.p)
        self.mem.clear()
        self.mem.skipped = 0
        self.n_active = self.n_inserts = 0
        self.S_grad = 0.0
        self.rho_spent = 0.0
        self.deletions = 0
        self.epoch += 1
        self.release_tau, self.release_grid = [], []

    def _relearn(self, retained: RetainedData, exclude: Sequence[int] = ()) -> None:
        self._reset_epoch()
        for _, X, y in retained.chunks(1024, exclude=exclude):
            for x_aug, label in zip(augment(np.asarray(X, dtype=np.float64)), np.asarray(y, dtype=np.float64)):
                self._update(x_aug, float(label))


class UncertifiedMemoryPair(MemoryPair):
    """The memory pair without the refusal of settings measured as under-noised (``burn_in`` below ceil(beta/lam),
    ``initial_curvature = "shanno_phua"``).  For the measurements in bench/ and tests/ only: not in
    ``ALGORITHMS``, so the service never builds it and never signs its certificates."""

    refuse_uncertified: ClassVar[bool] = False
