"""Passive online learning-unlearning: OGD, and Gaussian noise into the state at each deletion.

Paper 000/001 Algorithm 1 in the service form of digest §2.3.  A record learned at step u and forgotten after
step tau can still shift the iterate by at most a = Delta_u * Gamma(u, tau) (Delta_u = eta_u L, Gamma the product
of the per-step contractions after u).  The i-th deletion adds N(0, sigma_i^2 I) to the state with

  allocation "omega_series" (default): sigma_i = sqrt(omega i^omega / (2 (omega - 1) rho)) * a_i, charge
      rho_i = a_i^2/(2 sigma_i^2) = rho (omega - 1)/(omega i^omega), summing to at most rho over any number of
      deletions (000 Thm 3.1, Lemma B.3);
  allocation "uniform" (known cap k = max_deletions): sigma_i = sqrt(k / (2 rho)) * a_i, charge rho/k; deletion
      k + 1 raises CapacityExhausted and the model reports status "retrain_required" (digest §6 [eng]).

  allocation "group" (passive_group.py, docs/passive_group_allocation.md; issue 30 item 3): release i tops the
      noise already in the state up to what the group of the epoch's forgotten records needs, S^2/(2 rho) (after a
      stream sigma_i^2 = (2i - 1) a^2/(2 rho)); receipts state the window's bound (<= rho), not added up
      (accounting per_update).

Either way the published sequence is (alpha, alpha*rho)-OLU for every alpha > 1.

Discrete noise and round-off (issue 14; app/unlearning/mechanism/release.py).  The noise is the discrete Gaussian on a grid
g (a power of two from the public a_i and d): theta <- Pi_K(g (round(theta/g) + k)), k ~ N_Z(0, (sigma_i'/g)^2),
with lattice sensitivity a_i' = a_i + g sqrt(d + 1) and sigma_i' = sigma_i a_i'/a_i, so rho_i = a_i^2/(2 sigma_i^2)
is unchanged (CKS20 Thm 14).  a_i is max(Delta_u Gamma(u, tau), floor), floor = the float64 round-off two coupled
runs can add between step u and tau: 2 e min(tau - u + 1, 1/(1 - gamma)) (constant steps; tau - u + 1 otherwise)
+ 2 e n_deletions, e = 8 (d + 3) 2^-53 (R + eta_u L) (``roundoff_floor``).

Re-rounding of earlier releases (issue 29 item 7).  A record's shift is carried through every release made by other
forgets between its learning step u and its own forget at tau: both worlds round their own point to that release's
lattice, so the part of the gap that is this record's grows by up to g_r sqrt(d + 1) (each coordinate's rounding
moves it by at most g_r/2, twice) -- the lattice split of the gap between that release's own shift (absorbed by its
noise, whose lattice sensitivity a_r' = a_r + g_r sqrt(d + 1) pays for one rounding) and this record's (carried on)
costs one more rounding per release.  The certified shift is therefore
    a = max(Delta_u Gamma(u, tau) + sum_{releases r at tau_r >= u} g_r sqrt(d + 1) Gamma(tau_r, tau), floor)
(``rerounding``; Gamma(tau_r, tau) = 1 for the adaptive schedule, whose Gamma is certified as 1).  The releases of the
current ledger epoch are kept in the state as (tau_r, sum of the grids released at tau_r) (``release_tau``,
``release_grid``); a restart clears them.  active_olu's fallback has the same term (issue 21).

Schedules (hyperparameter ``schedule``; digest §2.4):
  strongly_convex_capped  eta_t = min(1/(mu t), 2/(beta + mu)); every record deletable (default).
  strongly_convex         eta_t = 1/(mu t); records with u <= 1/2 + beta/(2 mu) are not covered by the noise
                          analysis (000 Thm 3.3): their forget restarts the model (below).
  convex_constant         constant eta <= 2/beta (``eta``, default 1/beta); gamma = 1 when l2 = 0; l2 = 0 allowed.
  regularized_convex      000 Thm 3.4: OGD on f + (lambda/2)||z||^2, lambda = sqrt(log T + 2k)/sqrt(T) from
                          ``horizon`` T and ``max_deletions`` k; strongly convex schedule with mu = l2 + lambda,
                          L + lambda R, beta + lambda (P15).  ``capped`` (default true) caps the step at
                          2/(beta + mu) so every record is deletable; capped=false is the paper's schedule with
                          the rule u > 1/2 + beta/(2 mu) (earlier records restart the model, below).
  adaptive                AdaGrad-norm eta_t = D/sqrt(p(t)), p(t) = p0 + sum ||grad||^2 (001 Thm 4 / 000 Thm 3.5),
                          ``p0`` (default L^2), gamma = 1; ``capped`` (default true) clips eta at 2/beta so every
                          record is deletable, capped=false enforces eta_u <= 2/beta (p(u) >= beta^2 D^2/4).
                          The step sizes depend on the gradient norms and are secret state (issue 14): a
                          certificate uses their public bound min(D/sqrt(p0), 2/beta), deletability is decided
                          from declared numbers (capped=false needs p0 >= beta^2 D^2/4), and after a forget p is
                          reset to its public bound p0 + L^2 t so later steps forget the record's gradient norm.

Restarts (issue 21: nothing accepted is unforgettable).  The model keeps no data, so a record the noise analysis
cannot cover -- one learned in the first ``restart_prefix`` = floor(1/2 + beta/(2 mu)) steps of an epoch under an
uncapped strongly convex schedule -- is forgotten exactly by a restart: theta <- 0 (the data-independent start every
model is created with), the schedule clock restarts (epoch-local t = 1 at the next example), and a new ledger epoch
begins (series index, rho_spent and the uniform capacity start afresh).  The same happens when a request would exceed
the uniform allocation's capacity.  Every record of the request, and every record learned before the restart, is then
forgotten exactly (certificate mechanism "exact", ``details["restart"]`` on the request's first certificate); the
published sequence from the restart on is exactly the one the same algorithm publishes on the masked stream, which
restarts at the same public time.  Which steps will restart the model is public when they are learned
(``restart_steps``, the learn answer's ``restart_on_forget``).
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.errors import CapacityExhausted, ForgetError, SpecError, UnderNoisedSpec
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData
from ..maths.domain import project_l2_ball
from ..maths.losses import augment
from ..maths.schedules import Adaptive, CappedStronglyConvex, ConstantStep, Schedule, StronglyConvex
from ..mechanism import fast, fast_dgauss, release
from ..mechanism.calibration import SIGMA_GRID_MAX, release_ratio_bound, require_release_feasible
from ..mechanism.noise import NoiseSource, SecureGaussianNoise
from .passive_calibration import PassiveCalibration, regularization_lambda
from .passive_group import GroupAllocation

GUARANTEE_WORDS = (
    "Everything the model publishes from the deletion on is statistically almost indistinguishable "
    "(Renyi divergence at most alpha*rho for every order alpha, i.e. the stated (epsilon, delta)) from what "
    "the same algorithm would have published had the record never been learned."
)
RESTART_NOTE = (
    " A record the noise analysis does not cover (one learned in the first restart_prefix steps after the model was "
    "created or last restarted), or a forget beyond the deletion capacity, restarts the model from its initial "
    "state instead: that record and everything learned before the restart are then forgotten exactly."
)
ADAPTIVE_WORDS = GUARANTEE_WORDS + (
    " The adaptive step sizes depend on the norms of the training gradients; they are never published (each "
    "certificate uses their bound from declared numbers, and after a deletion they restart from their worst "
    "case), and, as in the paper, the comparison run uses the same step sizes up to the deletion."
)


class PassiveOLU(PassiveCalibration, GroupAllocation):
    algorithm = "passive_olu"
    accounting = "omega_series"
    guarantee_definition = "(alpha, alpha*rho)-OLU for all alpha > 1"
    guarantee_words = GUARANTEE_WORDS

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        try:
            hp = self.normalize_hyperparameters(spec)
            self.refused: str | None = None
        except UnderNoisedSpec as e:  # a model stored before the refusal: it may learn, never certify a forget
            hp, self.refused = e.hp, str(e)
        self.hp = hp
        self.schedule_name = hp["schedule"]
        self.reg_lambda = 0.0
        if self.schedule_name == "regularized_convex":
            self.reg_lambda = regularization_lambda(hp["horizon"], hp["max_deletions"])
        # the surrogate's extra (lambda/2)||z||^2 enters the loss, so L, beta and mu all carry it (P15)
        self.declare_loss(hp, extra_mu=self.reg_lambda)
        self.allocation = hp["allocation"]
        self.omega = float(hp.get("omega", 0.0))
        self.capacity = int(hp["max_deletions"]) if self.allocation == "uniform" else None
        if self.allocation == "uniform":
            self.accounting = "capacity"
        elif self.allocation == "group":  # window bounds, not added (passive_group.py)
            self.accounting = "per_update"
        self.group_reset()
        if self.schedule_name == "adaptive":
            self.guarantee_words = ADAPTIVE_WORDS
        self.schedule: Schedule = self._make_schedule()
        if self.restart_note and (self.schedule.undeletable_prefix() > 0 or self.capacity is not None):
            self.guarantee_words = self.guarantee_words + self.restart_note
        self.theta = np.zeros(spec.n_params)  # data-independent start in K
        self.t = 0
        self.epoch_start = 0  # the schedule's clock runs on t - epoch_start (restarts move it; 0 otherwise)
        self.n_deletions = 0
        self.n_restarts = 0   # exact restarts (ledger epochs after the first)
        self.n_charged = 0    # Gaussian deletions in the current ledger epoch (the series / capacity index)
        self.rho_spent = 0.0
        self.eta_script: Any = None  # reference runs only: global step -> public eta of the actual run (adaptive)
        self.last_eta = math.nan
        self._feasible_through = 0  # omega series: every deletion index <= this passed the release check (_precheck)
        self._roundoff_k = release.ROUNDOFF_C * (spec.n_params + 2) * release.U64  # step_roundoff's C (n + 2) u_64
        # the discrete releases of this ledger epoch: their times and, per time, the sum of their grids (rerounding)
        self.release_tau: list[int] = []
        self.release_grid: list[float] = []

    def _make_schedule(self) -> Schedule:
        name, hp = self.schedule_name, self.hp
        if name == "strongly_convex_capped":
            return CappedStronglyConvex(self.mu, self.beta)
        if name == "strongly_convex":
            return StronglyConvex(self.mu, self.beta)
        if name == "regularized_convex":
            return (CappedStronglyConvex if hp["capped"] else StronglyConvex)(self.mu, self.beta)
        if name == "convex_constant":
            return ConstantStep(float(hp["eta"]), self.mu, self.beta)
        if name == "adaptive":
            return Adaptive(2.0 * self.spec.domain_radius, self.beta, float(hp["p0"]), bool(hp["capped"]), G=self.L)
        raise SpecError(f"unknown schedule {name!r}")  # pragma: no cover - normalize_hyperparameters rejects it

    # a model on which no forget could be certified is refused at creation (the restart family restarts instead)
    refuses_undeletable: ClassVar[bool] = True
    # appended to the guarantee words where some forget may restart the model (the restart family says it itself)
    restart_note: ClassVar[str] = RESTART_NOTE
    # _gaussian_forget inlines shift_bound / log_gamma / roundoff_floor only where a class keeps them as defined
    # here (the negative controls of tests/ override them to certify too little: they must take effect)
    _inline_shift: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._inline_shift = (cls.shift_bound is PassiveOLU.shift_bound and cls.log_gamma is PassiveOLU.log_gamma
                             and cls.roundoff_floor is PassiveOLU.roundoff_floor
                             and cls.rerounding is PassiveOLU.rerounding)

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"theta": self.theta.copy(), "t": self.t, "n_deletions": self.n_deletions,
                               "rho_spent": self.rho_spent}
        if self.n_charged != self.n_deletions:
            out["n_charged"] = self.n_charged
        if self.n_restarts:
            out["epoch_start"] = self.epoch_start
            out["n_restarts"] = self.n_restarts
        if self.allocation == "group":
            self.group_state(out)
        if self.release_tau or self.n_charged:
            out["release_tau"] = np.asarray(self.release_tau, dtype=np.int64)
            out["release_grid"] = np.asarray(self.release_grid, dtype=np.float64)
        out.update(self.schedule.state())
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.theta = self.stored_theta(state)
        self.t = int(state["t"])
        self.n_deletions = int(state["n_deletions"])
        self.n_charged = int(state.get("n_charged", self.n_deletions))
        self.rho_spent = float(state["rho_spent"])
        self.epoch_start = int(state.get("epoch_start", 0))
        self.n_restarts = int(state.get("n_restarts", 0))
        self.schedule.load_state(state)
        self.group_load(state)
        self.release_load(state)

    @property
    def data_dependent_steps(self) -> bool:
        """True when the step sizes depend on the data (adaptive): replay then feeds the actual run's public
        step sizes to the reference runs through ``eta_script``."""
        return isinstance(self.schedule, Adaptive)

    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        # OGD is Markovian (C1): the state is the output; it always holds the post-noise iterate (P4).
        return self.theta.copy()

    def constants(self) -> dict[str, float]:
        out = {"L": self.L, "beta": self.beta, "mu": self.mu, "D": 2.0 * self.spec.domain_radius}
        if self.schedule_name == "regularized_convex":
            out["lambda"] = self.reg_lambda
        if isinstance(self.schedule, ConstantStep):
            out["eta"] = self.schedule.step_size
        prefix = self.schedule.undeletable_prefix()
        if 0 < prefix < math.inf:  # the first steps of every epoch whose forget restarts the model
            out["restart_prefix"] = float(prefix)
        return out

    def accounting_params(self) -> dict[str, Any]:
        # omega-series charges rho (omega-1)/(omega i^omega); the uniform allocation is its capped form rho/k; the
        # group allocation's receipts state the bound of the current window (<= rho), not added up
        if self.allocation == "group":
            return {"accounting": "per_update", "rho": self.spec.rho, "delta": self.spec.delta}
        return {"accounting": "omega_series", "rho_budget": self.spec.rho, "delta": self.spec.delta,
                "omega": self.omega if self.allocation == "omega_series" else 1.2, "cap": self.capacity}

    def ledger(self) -> dict[str, Any]:
        out = {
            "accounting": self.accounting,
            "rho_spent": self.rho_spent,
            "rho_budget": self.spec.rho,
            "capacity_total": self.capacity,
            "capacity_left": None if self.capacity is None else max(0, self.capacity - self.n_charged),
            "deletions": self.n_deletions,
        }
        if self.n_restarts:
            out["epoch"] = self.n_restarts
            out["epoch_start"] = self.epoch_start
        return out

    @property
    def status(self) -> str:
        return "ready"  # a forget the ledger cannot certify restarts the model (exact) instead

    # ---- learning ---------------------------------------------------------------------------------
    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        first = self.t + 1
        theta, R = self.theta, self.spec.domain_radius
        adaptive = isinstance(self.schedule, Adaptive)
        if len(y) and not adaptive and self.eta_script is None and fast.supported(self.schedule, self.loss):
            # the same OGD recursion in one compiled loop (app/unlearning/mechanism/fast.py); eta_t as in schedules.py
            theta = theta.copy()
            self.last_eta = fast.ogd_steps(theta, X, y, self.t - self.epoch_start, self.schedule, self.loss, R)
            self.t += len(y)
            self.theta = theta
            return np.arange(first, self.t + 1, dtype=np.int64)
        Xa = augment(X)
        for x_aug, label in zip(Xa, y):
            self.t += 1
            g = self.loss.grad(theta, x_aug, label)
            if adaptive:
                if self.eta_script is not None:  # reference run: the actual run's public step sizes
                    eta = float(self.eta_script[self.t])
                    self.schedule.append(eta)
                else:
                    eta = self.schedule.next_eta(float(g @ g))
            else:
                eta = self.schedule.eta(self.t - self.epoch_start)
            self.last_eta = eta
            theta = project_l2_ball(theta - eta * g, R)  # 000 §2.3, OGD step
        self.theta = theta
        return np.arange(first, self.t + 1, dtype=np.int64)

    def skip(self, n: int = 1) -> None:
        """Advance the clock without an update (the reference run's skip symbol; the clock is kept, P7)."""
        for _ in range(n):
            self.t += 1
            if isinstance(self.schedule, Adaptive):
                eta = self.eta_script[self.t] if self.eta_script is not None else self.schedule.current_eta()
                self.schedule.append(eta)

    # ---- unlearning -------------------------------------------------------------------------------
    def log_gamma(self, u: int, tau: int) -> float:
        """log Gamma(u, tau) on the schedule's clock of the current epoch (global steps in, public only)."""
        return self.schedule.log_gamma_sum(u - self.epoch_start, tau - self.epoch_start)

    def shift_bound(self, u: int, tau: int) -> tuple[float, float, float]:
        """(Delta_u, Gamma(u, tau), a = Delta_u Gamma(u, tau) + rerounding(u, tau)) from public quantities only."""
        if isinstance(self.schedule, Adaptive):
            # eta_u depends on the gradient norms (the forgotten record's too) and is not published (issue 14):
            # Delta_u <= L min(D/sqrt(p0), 2/beta), and Gamma = 1 for a deletable u (eta non-increasing, so every
            # later step has eta <= 2/beta and gamma_r = 1; schedules.Adaptive)
            delta_u = self.schedule.public_eta_bound() * self.L
            return delta_u, 1.0, delta_u + self.rerounding(u, tau)
        delta_u = self.schedule.eta(u - self.epoch_start) * self.L
        gamma = math.exp(self.log_gamma(u, tau))
        return delta_u, gamma, delta_u * gamma + self.rerounding(u, tau)

    def noise_multiplier(self, i: int) -> float:
        """sigma_i / a_i.  omega series: sqrt(omega i^omega / (2 (omega - 1) rho)) (000 Alg. 1, line 5 with
        eps_alg = rho); uniform: sqrt(k / (2 rho))."""
        if self.allocation == "uniform":
            return math.sqrt(self.capacity / (2.0 * self.spec.rho))
        if self.allocation == "group":  # equal shifts after the stream (the worst-case checks); passive_group.py
            return math.sqrt((2.0 * i - 1.0) / (2.0 * self.spec.rho))
        w = self.omega
        return math.sqrt(w * i**w / (2.0 * (w - 1.0) * self.spec.rho))

    def _check_steps(self, steps: Sequence[int]) -> None:
        for u in steps:
            if not 1 <= u <= self.t:
                raise ForgetError(f"step {u} was never learned by this model")

    def restart_steps(self, steps: np.ndarray) -> tuple[int, int] | None:
        """The (first, last) range of the just-learned ``steps`` whose forget restarts the model: the first
        ``restart_prefix`` steps of the current epoch (public step indices; Unlearner.restart_steps)."""
        if not len(steps):
            return None
        prefix = math.inf if self.refused is not None else self.schedule.undeletable_prefix()
        lo, hi = max(int(steps[0]), self.epoch_start + 1), int(steps[-1])
        if prefix < math.inf:
            hi = min(hi, self.epoch_start + int(prefix))
        return (lo, hi) if lo <= hi else None

    def restart_reason(self, steps: list[int]) -> str | None:
        """Why forgetting ``steps`` (all learned in the current epoch) needs an exact restart, or None: a step
        the schedule's noise analysis does not cover (pitfall P3), or more deletions than the uniform capacity has
        left.  Public quantities only."""
        deletable, start = self.schedule.deletable, self.epoch_start
        if any(not deletable(u - start) for u in steps):
            return "not_deletable"
        if self.capacity is not None and self.n_charged + len(steps) > self.capacity:
            return "capacity"
        return None

    def restart(self) -> None:
        """Discard the state: theta <- 0 (the data-independent start), the schedule clock restarts at the next
        example, and a new ledger epoch begins (series index, rho_spent and capacity afresh)."""
        self.theta = np.zeros(self.spec.n_params)
        self.epoch_start = self.t
        self.schedule.reset()
        self.n_restarts += 1
        self.n_charged = 0
        self.rho_spent = 0.0
        self.release_tau, self.release_grid = [], []
        self.group_reset()

    def _exact(self, u: int, tau: int, restart: bool) -> Certificate:
        self.n_deletions += 1
        return Certificate(
            learned_step=u, forgotten_step=tau, deletion_index=self.n_deletions, mechanism="exact",
            sigma=0.0, sensitivity=0.0, rho=0.0,
            details={"restart": 1.0 if restart else 0.0, "epoch_start": float(self.epoch_start)},
        )

    def _precheck(self, steps: list[int]) -> None:
        """Refuse the whole request before anything changes (atomic): exhausted capacity, infeasible release."""
        if self.capacity is not None and self.n_charged + len(steps) > self.capacity:
            raise CapacityExhausted(
                f"the model can certify {max(0, self.capacity - self.n_charged)} more deletion(s) "
                f"(max_deletions={self.capacity}); an exact retrain is required")
        if self.allocation == "group":
            self.group_precheck(len(steps))
        if self.capacity is None and steps:
            i = self.n_charged + len(steps)
            if i > self._feasible_through:
                n = self.spec.n_params
                require_release_feasible(self.noise_multiplier(i), n, i)
                # the multiplier grows with i (omega > 1), so a feasible index covers every smaller one: look
                # ahead once so that the next forgets skip the check (a public function of the spec and i)
                try:
                    ahead = 2 * i if release_ratio_bound(self.noise_multiplier(2 * i), n) <= SIGMA_GRID_MAX else i
                except OverflowError:
                    ahead = i
                self._feasible_through = ahead

    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = list(map(int, steps))
        self._check_steps(steps)
        tau, start = self.t, self.epoch_start
        current = [u for u in steps if u > start]  # records learned before the epoch have no influence left
        # settings refused since the model was stored certify no forget: an exact restart (was NotDeletable)
        if current and (self.refused is not None or not self._certifiable(current)):
            # one exact restart forgets every record of the request (and everything learned before it)
            self.restart()
            return [self._exact(u, tau, restart=j == 0) for j, u in enumerate(steps)]
        # several deletions at one tau: sequentially, each with its own i and noise (P9)
        return [self._gaussian_forget(u, tau) if u > start else self._exact(u, tau, restart=False) for u in steps]

    def _certifiable(self, steps: list[int]) -> bool:
        """Whether noise can certify forgetting ``steps`` (current epoch): no restart reason, and the ledger and
        the discrete release allow the deletions (``_precheck``)."""
        if self.restart_reason(steps) is not None:
            return False
        try:
            self._precheck(steps)
        except CapacityExhausted:
            return False
        return True

    def roundoff_floor(self, u: int, tau: int) -> float:
        """The float64 round-off two coupled runs can add to their gap between learning step u and forgetting
        step tau (release.py): per step e = C (n + 2) u_64 (R + eta_u L) (eta_u bounds every later step: the
        schedules are non-increasing), contracted by the schedule's gamma (constant steps) or summed (gamma_t -> 1),
        plus one projection's worth for every noise step since u (at most n_deletions of them)."""
        n, R = self.spec.n_params, self.spec.domain_radius
        # the adaptive eta_u depends on gradient norms (data): use its public bound, never the value (issue 14.3)
        bound = getattr(self.schedule, "public_eta_bound", None)
        eta_u = bound() if bound is not None else self.schedule.eta(u - self.epoch_start)
        e = release.step_roundoff(n, R, eta_u * self.L)
        c = self.schedule.gamma(1) if isinstance(self.schedule, ConstantStep) else 1.0
        return release.roundoff_floor(e, tau - u + 1, c) + release.roundoff_floor(e, self.n_deletions, 1.0)

    def _roundoff_per_step(self, step_norm: float) -> float:
        """release.step_roundoff(n_params, R, step_norm), the constant factor C (n + 2) u_64 computed once (the same
        float operations in the same order)."""
        return self._roundoff_k * (self.spec.domain_radius + step_norm)

    def _gaussian_forget(self, u: int, tau: int) -> Certificate:
        """One deletion: certified shift a = max(Delta_u Gamma(u, tau) + the re-rounding of the releases since u
        (issue 29 item 7), round-off floor) (issue 14 case 2), sigma_i
        = noise_multiplier(i) a, released through the discrete Gaussian (release.py), which reports the grid g and
        the lattice sensitivity a' = a + g sqrt(d + 1) with sigma' = sigma_i a'/a; rho_i = a^2/(2 sigma_i^2) is
        unchanged (= a'^2/(2 sigma'^2), CKS20 Thm 14)."""
        i = self.n_charged + 1
        schedule = self.schedule
        if not self._inline_shift or isinstance(schedule, Adaptive):
            delta_u, gamma, shift = self.shift_bound(u, tau)
            rerounding = self.rerounding(u, tau)
            floor = self.roundoff_floor(u, tau)
        else:  # shift_bound and roundoff_floor inlined: the same float operations, one schedule.eta call
            start = self.epoch_start
            delta_u = schedule.eta(u - start) * self.L
            gamma = math.exp(schedule.log_gamma_sum(u - start, tau - start))
            rerounding = self.rerounding(u, tau) if self.release_tau else 0.0
            shift = delta_u * gamma + rerounding
            e = self._roundoff_per_step(delta_u)
            floor = release.roundoff_floor(e, tau - u + 1, schedule.g if isinstance(schedule, ConstantStep) else 1.0)
            n_del = self.n_deletions
            if n_del > 0 and not e <= 0.0:
                floor += 2.0 * e * float(n_del)  # release.roundoff_floor(e, n_deletions, 1.0)
        a = shift if shift >= floor else floor
        group = self.allocation == "group"
        if group:  # sigma from the group's shift and the noise already in the state (passive_group.py)
            sigma, sens, rho_i, group_shift = self.group_noise(u, tau, a)
        else:
            sigma, sens = self.noise_multiplier(i) * a, a
            rho_i = 0.5 * (a / sigma) ** 2 if sigma > 0 else 0.0  # a^2/(2 sigma^2), the ratio first
        R = self.spec.domain_radius
        res = None
        if type(self.noise) is SecureGaussianNoise and sigma > 0.0:  # production: release.discrete_release's
            res = fast_dgauss.secure_discrete_release(self.theta, sens, sigma, R, R)  # compiled route, called directly
        if res is None:
            res = release.discrete_release(self.theta, sens, sigma, self.noise, scale=R, radius=R)
        self.theta, grid, sigma_used, sens_used = res
        if group:
            self.group_record(u, tau, sigma, grid)
        release.record_release(self.release_tau, self.release_grid, tau, grid)  # later forgets' rerounding
        if isinstance(self.schedule, Adaptive) and self.eta_script is None:
            self.schedule.forget_gradient_norms()  # later steps: public bound instead of the gradient norms
        self.n_charged = i
        self.n_deletions += 1
        self.rho_spent = rho_i if group else self.rho_spent + rho_i
        if self.capacity is None:  # allocation omega_series
            details = {"Delta_u": delta_u, "Gamma": gamma, "series_index": float(i), "omega": self.omega,
                       "grid": grid, "shift": shift, "rerounding": rerounding, "roundoff_floor": floor}
            if group:
                details.update(group_shift=group_shift, group_size=float(len(self.group_u)))
        else:
            details = {"Delta_u": delta_u, "Gamma": gamma, "series_index": float(i), "capacity": float(self.capacity),
                       "grid": grid, "shift": shift, "rerounding": rerounding, "roundoff_floor": floor}
        return Certificate(u, tau, self.n_deletions, release.MECHANISM, sigma_used, sens_used, rho_i, details)

    def apply_noise(self, sigma: float, grid: float) -> np.ndarray:
        """Pi_K(g (round(theta/g) + k)), k ~ N_Z(0, (sigma/g)^2): a certificate's release (the reference run's copy
        in coupled replays; P4, P5)."""
        return release.add_discrete_noise(self.theta, grid, sigma, self.noise, self.spec.domain_radius)
