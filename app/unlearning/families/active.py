"""Active online learning-unlearning: OGD, and at a deletion a few projected-GD steps, then Gaussian noise.

Two variants (hyperparameter ``variant``), both on a mu-strongly convex, beta-smooth regularised loss, with
GD step eta_gd = 2/(beta+mu) whose contraction really is gamma = (beta-mu)/(beta+mu) (pitfall P13):

``single`` (paper 000 Algorithm 2, digest §2.7)
    I_i steps of projected GD on ONE retained *anchor* example: the first retained example of the current block
    (tau_{i-1}, tau_i] other than the one being forgotten.  I_i is App. C.1's
    ceil((omega log i + 2 log tau + 2 log L) / (2 log(1/gamma))), capped by ``max_gd_steps``.
``two_phase`` (default since issue 16, docs/accuracy.md; derived from paper 001 Algorithm 2, digest §2.6, §5.2)
    I_1 + I_2 steps of projected GD on the *average* loss of the retained examples (phase 1 runs on retained
    data only, so it coincides with phase 2 and the A_j term is 0), I_1 = ceil(log(mu D tau / L)/log(1/gamma)),
    I_2 = ceil((1 + omega) log(i)/log(1/gamma)) (the paper's 2.2 log k with omega = 1.2 and k -> i, since k is
    unknown online), capped by ``max_gd_steps``.  Gradients are streamed over ``retained.chunks``.

Noise (both): the shift the forgotten example can still cause after the GD phase is the corrected
a_i = gamma^{I_i} * Gamma_OGD(u, tau) * eta_u * L (pitfall P12; I_i the number of steps actually run), and
sigma_i = sqrt(omega i^omega / (2 (omega - 1) rho)) * a_i, so the per-deletion Renyi charge is
rho (omega - 1)/(omega i^omega) and the cumulative charge never exceeds rho: (alpha, alpha*rho)-OLU.

Discrete noise and round-off (issue 14; app/unlearning/mechanism/release.py): the noise is the discrete Gaussian on a grid
g (a_i' = a_i + g sqrt(d + 1), sigma_i' = sigma_i a_i'/a_i, rho_i unchanged), and a_i is at least the float64
round-off the OGD, GD and noise steps since u can add to the gap of two coupled runs (``roundoff_floor``).

Block restriction.  Both proofs need tau_{i-1} < u_i <= tau_i (the forgotten example arrived after the previous
deletion event; hence at most one deletion per block; with the step convention of digest §2.0, the example
consumed at step tau_{i-1} belongs to the previous block).  A deletion that violates it is certified by the
*fallback*: passive noise (omega series, same i) with the shift of that record propagated by the OGD contraction
Gamma_OGD(u, tau) (GD phases contract by gamma^I <= 1, so ignoring them is an upper bound), plus the terms its
presence in earlier GD phases added, which the reference run (that never saw it) did not have:
  * single:    if the record was the anchor of an earlier phase j, the two runs descended on different examples
               there; the only bound is the diameter: a = D * Gamma_OGD(tau_j, tau).
  * two_phase: each earlier phase j whose average contained it adds
               eta_gd * (2L/n_j) * min(I_j, 1/(1-gamma)) * Gamma_OGD(tau_j, tau); a is capped at D.
  * both:      each earlier discrete release r at tau_r >= u (>= the anchored phase's time for the diameter bound)
               adds its re-rounding g_r sqrt(d+1) Gamma_OGD(tau_r, tau) (issue 21): both worlds round their own
               point to the lattice, so the part of the gap that is this record's grows by up to g_r sqrt(d+1)
               (each coordinate's rounding moves it by at most g_r/2, twice) -- the lattice split of the gap
               between the release's own shift (absorbed by its noise) and this record's (carried on) costs one
               rounding per release.  g_r sqrt(d+1) <= a_r/1024 (release.py), but the bound must be complete.
               The grids and times of the releases are kept in the state (``release_tau``, ``release_grid``).
Several steps in one forget request are sequential events at the same tau (at most the first can be active);
every step the request names is kept out of its GD phases, because only the state after the whole request is
published and its reference run masks all of them.
Certificate details say which path was taken (``fallback`` = 1.0, ``diameter_bound`` = 1.0 when the diameter
bound was used).  A block with no other retained example has no anchor: I_i = 0, i.e. passive noise.
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
                                     require_release_feasible, update_norm_bound)
from ..mechanism.noise import NoiseSource
from .passive import GUARANTEE_WORDS
from .retained_descent import OmegaSeriesCharges, normalize_descent_hyperparameters
from .retrain import CHUNK_SIZE, OGDIterate, check_forget_steps, ogd_recompute

VARIANTS = ("single", "two_phase")


# Materialise the retained set for the GD phase only while it stays below this many floats (else re-stream).
CACHE_FLOATS = 4_000_000


class ActiveOLU(OmegaSeriesCharges, OGDIterate, Unlearner):
    algorithm = "active_olu"
    accounting = "omega_series"
    needs_retained_data = True
    supports_retrain = True
    guarantee_definition = "(alpha, alpha*rho)-OLU for all alpha > 1"
    guarantee_words = GUARANTEE_WORDS  # the same (alpha, alpha rho)-OLU statement as passive OLU

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.variant: str = hp["variant"]
        self.declare_loss(hp)
        self.D = 2.0 * spec.domain_radius
        self.omega = float(hp["omega"])
        self.max_gd_steps = int(hp["max_gd_steps"])
        self.schedule: Schedule = CappedStronglyConvex(self.mu, self.beta)
        self.eta_gd = 2.0 / (self.beta + self.mu)
        self.gamma_gd = (self.beta - self.mu) / (self.beta + self.mu)
        self.chunk_size = CHUNK_SIZE
        self._reset(t=0)
        self.n_forgotten = 0  # records forgotten over every epoch (records_held; never reset by a retrain)

    def _reset(self, t: int) -> None:
        self.theta = np.zeros(self.spec.n_params)  # data-independent start in K
        self.t = t
        self.n_deletions = 0
        self.n_fallbacks = 0
        self.rho_spent = 0.0
        self.last_tau = 0          # tau_{i-1}: time of the previous deletion event (0 before any)
        self.epoch = 0
        # one row per GD phase actually run: time, steps, anchor step (single) and size of the GD set
        self.phase_tau: list[int] = []
        self.phase_steps: list[int] = []
        self.phase_anchor: list[int] = []
        self.phase_size: list[int] = []
        # one row per discrete release: its time and grid (the fallback adds their re-rounding, module docstring)
        self.release_tau: list[int] = []
        self.release_grid: list[float] = []

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = dict(spec.hyperparameters)
        unknown = set(hp) - {"variant", "schedule", "omega", "max_gd_steps", "huber_delta"}
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        # two_phase by default (issue 16, docs/accuracy.md): on real data it keeps the accuracy of the exact retrain
        # where single collapses (its GD phase on ONE anchor pulls the model to that example's minimiser, regret.md)
        hp.setdefault("variant", "two_phase")
        if hp["variant"] not in VARIANTS:
            raise SpecError(f"variant must be one of {', '.join(VARIANTS)}")
        normalize_descent_hyperparameters(hp)
        if spec.loss == "huber":
            hp.setdefault("huber_delta", 1.0)
        if not spec.l2 > 0:
            raise SpecError(f"{cls.algorithm} needs l2 > 0 (strong convexity mu = l2)")
        return hp

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """The worst case of 000 Alg. 2 / 001 Alg. 2: log(1/gamma) > 0 (I_i divides by it), I_i and the
        fallback's 1/(1 - gamma) at the last deletion i = tau = N_MAX, the largest shift (eta_1 L, or the
        diameter D of the fallback), its sigma at i = N_MAX, and the norms the OGD, GD and noise steps form."""
        checks = Checks(cls.algorithm)
        eng = construct(cls, spec)
        R, eps = spec.domain_radius, ("privacy.epsilon", "privacy.delta")
        common_checks(checks, eng.loss, spec)
        checks.finite("rho", spec.rho, *eps, positive=True)
        gamma = ("bounds.x_norm", "l2")
        checks.finite("log(1/gamma_gd)", lambda: -math.log(eng.gamma_gd), *gamma, positive=True)
        checks.finite("1/(1-gamma_gd)", lambda: 1.0 / (1.0 - eng.gamma_gd), *gamma, positive=True)
        checks.finite("I(N_MAX)", lambda: eng.planned_gd_steps(N_MAX, N_MAX), *gamma, "domain_radius")
        eta_1 = checks.finite("eta_1", lambda: eng.schedule.eta(1), *gamma, positive=True)
        a_ogd = checks.squared("eta_1 L", eta_1 * eng.L, *gamma, "domain_radius")
        checks.squared("update_norm", update_norm_bound(R, max(a_ogd, eng.eta_gd * eng.L)), *gamma, "domain_radius")
        a_max = max(a_ogd, eng.D)
        mult = checks.finite("noise_multiplier(N_MAX)", lambda: eng.noise_multiplier(N_MAX), "hyperparameters.omega",
                             *eps, positive=True)
        sigma = checks.squared("sigma(N_MAX)", mult * a_max, *eps, *gamma)
        checks.squared("noise_norm", noise_norm_bound(R, sigma, spec.n_params), *eps, "domain_radius", *gamma)
        # the discrete release (release.py) of the first deletion draws within int64; later ones, whose multiplier
        # grows like i^(omega/2), are refused at runtime once they could not (require_release_feasible in forget)
        release_checks(checks, eng.noise_multiplier(1), spec.n_params, *eps, "hyperparameters.omega")

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Learn: OGD.  Each forgotten record: a GD phase of at most I = planned_gd_steps (<= max_gd_steps) steps
        on the N = max_records kept records (two_phase: full-batch passes, read once while they fit CACHE_FLOATS,
        re-read every step otherwise; single: the anchor search reads up to N records one by one, then I steps on
        one example), then a release.  Retrain: read and replay OGD over N records (the learn's OGD loop)."""
        eng = cls(spec)
        p, N = spec.n_params, int(spec.hyperparameters.get("max_records") or batch)
        I = eng.planned_gd_steps(N_MAX, N_MAX)
        if eng.variant == "single":
            each = N * (wb.PAGE + wb.READ) + I * (wb.STEP + 4.0 * p) + wb.release(p)
            mem = wb.F64 * p * 4
        else:
            cached = N * p <= CACHE_FLOATS
            each = (1 if cached else I + 1) * wb.read(N, p, CHUNK_SIZE) + I * wb.gd_pass(N, p, CHUNK_SIZE) + wb.release(p)
            mem = wb.F64 * (min(N * (p + 1), CACHE_FLOATS + CHUNK_SIZE * p) + CHUNK_SIZE * p)
        replay = ogd_replay_work(spec, N, CHUNK_SIZE)  # retrain: ogd_recompute, the compiled loop per chunk
        forget_fields = ("hyperparameters.max_records", "hyperparameters.max_gd_steps", "dim")
        return wb.Cost(learn=ogd_learn_work(spec, batch), forget=each, forget_each=each, retrain=replay, array_bytes=mem,
                       forget_fields=forget_fields, memory_fields=("dim", "hyperparameters.max_records"))

    def records_held(self) -> int:
        return self.t - self.n_forgotten

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "theta": self.theta.copy(), "t": self.t, "n_deletions": self.n_deletions, "n_fallbacks": self.n_fallbacks,
            "rho_spent": self.rho_spent, "last_tau": self.last_tau, "epoch": self.epoch,
            "n_forgotten": self.n_forgotten,
            "phase_tau": np.asarray(self.phase_tau, dtype=np.int64),
            "phase_steps": np.asarray(self.phase_steps, dtype=np.int64),
            "phase_anchor": np.asarray(self.phase_anchor, dtype=np.int64),
            "phase_size": np.asarray(self.phase_size, dtype=np.int64),
            "release_tau": np.asarray(self.release_tau, dtype=np.int64),
            "release_grid": np.asarray(self.release_grid, dtype=np.float64),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.theta = self.stored_theta(state)
        self.t = int(state["t"])
        self.n_deletions = int(state["n_deletions"])
        self.n_fallbacks = int(state["n_fallbacks"])
        self.rho_spent = float(state["rho_spent"])
        self.last_tau = int(state["last_tau"])
        self.epoch = int(state["epoch"])
        self.n_forgotten = int(state.get("n_forgotten", self.n_deletions))  # states stored before the counter
        cols = [np.asarray(state[k], dtype=np.int64).reshape(-1).tolist()
                for k in ("phase_tau", "phase_steps", "phase_anchor", "phase_size")]
        if len({len(c) for c in cols}) != 1:
            raise ValueError("stored GD-phase arrays have different lengths")
        self.phase_tau, self.phase_steps, self.phase_anchor, self.phase_size = cols
        if "release_tau" in state:
            self.release_tau = np.asarray(state["release_tau"], dtype=np.int64).reshape(-1).tolist()
            self.release_grid = np.asarray(state["release_grid"], dtype=np.float64).reshape(-1).tolist()
            if len(self.release_tau) != len(self.release_grid):
                raise ValueError("stored release arrays have different lengths")
        else:  # stored before the releases were kept: every deletion of the epoch at last_tau, on the largest grid
            self.release_tau = [self.last_tau] * self.n_deletions
            self.release_grid = [self.max_grid()] * self.n_deletions

    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        return self.theta.copy()  # always the post-noise iterate (P4)

    def constants(self) -> dict[str, float]:
        return {"L": self.L, "beta": self.beta, "mu": self.mu, "D": self.D}

    def accounting_params(self) -> dict[str, Any]:
        return {"accounting": "omega_series", "rho_budget": self.spec.rho, "delta": self.spec.delta,
                "omega": self.omega, "cap": None}

    def ledger(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "rho_spent": self.rho_spent, "rho_budget": self.spec.rho,
                "capacity_total": None, "capacity_left": None, "deletions": self.n_deletions}

    # ---- public quantities ------------------------------------------------------------------------
    def ogd_gamma(self, u: int, tau: int) -> float:
        return math.exp(self.schedule.log_gamma_sum(u, tau))

    def planned_gd_steps(self, i: int, tau: int) -> int:
        """I_i from public quantities, capped by ``max_gd_steps``."""
        g = self.gamma_gd
        if g <= 0.0:
            return min(1, self.max_gd_steps)
        log_inv = -math.log(g)
        if self.variant == "single":  # 000 App. C.1
            raw = (self.omega * math.log(i) + 2.0 * math.log(tau) + 2.0 * math.log(self.L)) / (2.0 * log_inv)
            n = max(0, math.ceil(raw))
        else:  # 001 Thm 6: I_1 >= log_{1/gamma}(mu D tau / L), I_2 >= (1 + omega) log_{1/gamma}(i)
            i1 = max(0, math.ceil(math.log(self.mu * self.D * tau / self.L) / log_inv))
            i2 = max(0, math.ceil((1.0 + self.omega) * math.log(i) / log_inv))
            n = i1 + i2
        return min(n, self.max_gd_steps)

    def active_shift(self, u: int, tau: int, gd_steps: int) -> tuple[float, float, float]:
        """(Delta_u, Gamma_OGD(u, tau), a = gamma^I Gamma_OGD(u, tau) Delta_u): the corrected shift (P12)."""
        delta_u = self.schedule.eta(u) * self.L
        G = self.ogd_gamma(u, tau)
        return delta_u, G, self.gamma_gd**gd_steps * G * delta_u

    def fallback_shift(self, u: int, tau: int, n_phases: int | None = None) -> tuple[float, float, float, bool]:
        """(Delta_u, Gamma_OGD(u, tau), a, diameter_bound_used) for a deletion outside the block restriction.

        Only the first ``n_phases`` GD phases can have used the record (later ones belong to the current forget
        request, which keeps every step it names out of its GD phases).
        """
        n = len(self.phase_tau) if n_phases is None else n_phases
        delta_u = self.schedule.eta(u) * self.L
        G = self.ogd_gamma(u, tau)
        a = delta_u * G
        if self.variant == "single":
            anchored = [j for j, v in enumerate(self.phase_anchor[:n]) if v == u]
            if anchored:  # the two runs descended on different examples at that phase: only the diameter bounds it
                since = self.phase_tau[anchored[-1]]
                a = self.D * self.ogd_gamma(since, tau) + self.rounding_terms(since, tau)
                return delta_u, G, min(a, self.D), True
            return delta_u, G, a + self.rounding_terms(u, tau), False
        else:
            cap_steps = 1.0 / (1.0 - self.gamma_gd)
            for tau_j, I_j, n_j in zip(self.phase_tau[:n], self.phase_steps[:n], self.phase_size[:n]):
                if tau_j >= u and n_j > 0:  # the record was in that phase's average, the reference's was not
                    a += self.eta_gd * (2.0 * self.L / n_j) * min(I_j, cap_steps) * self.ogd_gamma(tau_j, tau)
        a += self.rounding_terms(u, tau)
        if a >= self.D:
            return delta_u, G, self.D, True
        return delta_u, G, a, False

    def rounding_terms(self, since: int, tau: int) -> float:
        """sum over the discrete releases r at tau_r >= since of g_r sqrt(d+1) Gamma_OGD(tau_r, tau): what their
        re-rounding adds to a shift carried through them (module docstring)."""
        root_n = math.sqrt(self.spec.n_params)
        return sum(g * root_n * self.ogd_gamma(t, tau) for t, g in zip(self.release_tau, self.release_grid)
                   if t >= since)

    def max_grid(self) -> float:
        """The largest grid a release can have: that of the largest shift certified, max(D, eta_1 L) (release.py's
        grid grows with the sensitivity), doubled for the round-off floor."""
        a_max = 2.0 * max(self.D, self.schedule.eta(1) * self.L)
        return release.grid_resolution(a_max, self.spec.n_params, self.spec.domain_radius)

    # ---- the GD phase -----------------------------------------------------------------------------
    def find_anchor(self, retained: RetainedData, start: int, end: int, exclude: Collection[int]) -> tuple[int, np.ndarray, float] | None:
        """The first retained example with step in [start, end] not in ``exclude``: (step, x_aug, y)."""
        for s in range(start, end + 1):
            if s in exclude:
                continue
            try:
                X, y = retained.get([s])
            except KeyError:
                continue
            return s, augment(np.asarray(X, dtype=np.float64).reshape(1, -1))[0], float(y[0])
        return None

    def gd_on_anchor(self, theta: np.ndarray, x_aug: np.ndarray, label: float, steps: int) -> np.ndarray:
        R = self.spec.domain_radius
        for _ in range(steps):
            theta = project_l2_ball(theta - self.eta_gd * self.loss.grad(theta, x_aug, label), R)
        return theta

    def gd_on_average(self, theta: np.ndarray, retained: RetainedData, exclude: Collection[int], steps: int) -> tuple[np.ndarray, int]:
        """``steps`` projected GD steps on the average regularised loss of the retained examples; (theta, n)."""
        exclude = set(exclude)
        cache: list[tuple[np.ndarray, np.ndarray]] | None = []
        n, floats = 0, 0
        for _, X, y in retained.chunks(self.chunk_size, exclude=exclude):
            n += len(y)
            floats += X.size
            if cache is not None:
                cache.append((augment(np.asarray(X, dtype=np.float64)), np.asarray(y, dtype=np.float64)))
                if floats > CACHE_FLOATS:
                    cache = None
        if n == 0:
            return theta, 0
        R = self.spec.domain_radius

        def batches():
            if cache is not None:
                yield from cache
            else:
                for _, X, y in retained.chunks(self.chunk_size, exclude=exclude):
                    yield augment(np.asarray(X, dtype=np.float64)), np.asarray(y, dtype=np.float64)

        for _ in range(steps):
            total = np.zeros_like(theta)
            for Xa, y in batches():
                total += self.loss.grad_sum(theta, Xa, y)
            grad = total / n + self.mu * theta
            theta = project_l2_ball(theta - self.eta_gd * grad, R)
        return theta, n

    def run_phase(self, retained: RetainedData, block_start: int, tau: int, exclude: Collection[int],
                  gd_steps: int) -> tuple[int, int, int]:
        """Run the GD phase on self.theta; returns (steps actually run, anchor step or 0, GD-set size)."""
        if gd_steps <= 0:
            return 0, 0, 0
        if self.variant == "single":
            found = self.find_anchor(retained, block_start, tau, exclude)
            if found is None:
                return 0, 0, 0
            anchor, x_aug, label = found
            self.theta = self.gd_on_anchor(self.theta, x_aug, label, gd_steps)
            return gd_steps, anchor, 1
        theta, n = self.gd_on_average(self.theta, retained, exclude, gd_steps)
        if n == 0:
            return 0, 0, 0
        self.theta = theta
        return gd_steps, 0, n

    # ---- unlearning -------------------------------------------------------------------------------
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = check_forget_steps(steps, self.t, retained, self.algorithm)
        if steps:
            i_last = self.n_deletions + len(steps)
            require_release_feasible(self.noise_multiplier(i_last), self.spec.n_params, i_last)
        certs = []
        tau = self.t
        # Every step named in the request stays out of its GD phases: the only state published is the one after
        # the whole request, whose reference run masks all of them (so anchors / averages agree with it).
        named = set(steps)
        n_phases_before = len(self.phase_tau)
        for u in steps:  # several deletions at one tau: sequential events, each with its own i (P9)
            i = self.n_deletions + 1
            block_start = self.last_tau + 1
            details: dict[str, float] = {"omega": self.omega, "block_start": float(block_start), "gamma_gd": self.gamma_gd,
                                         "eta_gd": self.eta_gd}
            if u >= block_start:  # tau_{i-1} < u <= tau_i: the active path
                planned = self.planned_gd_steps(i, tau)
                I, anchor, n_set = self.run_phase(retained, block_start, tau, named, planned)
                delta_u, G, a = self.active_shift(u, tau, I)
                if I > 0:
                    self.phase_tau.append(tau)
                    self.phase_steps.append(I)
                    self.phase_anchor.append(anchor)
                    self.phase_size.append(n_set)
                details.update(fallback=0.0, diameter_bound=0.0, gd_steps=float(I), gd_steps_planned=float(planned),
                               anchor_step=float(anchor), gd_set_size=float(n_set))
            else:  # block restriction violated: certified passive fallback
                delta_u, G, a, diam = self.fallback_shift(u, tau, n_phases_before)
                self.n_fallbacks += 1
                details.update(fallback=1.0, diameter_bound=1.0 if diam else 0.0, gd_steps=0.0)
            floor = self.roundoff_floor(u, tau, int(details["gd_steps"]), int(details.get("gd_set_size", 0.0)))
            shift = a
            a = max(a, floor)  # issue 14 case 2: never certify less than the round-off can produce
            sigma = self.noise_multiplier(i) * a
            rho_i = self.charge(i)
            grid, sens_used = 0.0, a
            if sigma > 0.0:
                self.theta, grid, sigma, sens_used = release.discrete_release(
                    self.theta, a, sigma, self.noise, scale=self.spec.domain_radius, radius=self.spec.domain_radius)
                self.release_tau.append(tau)
                self.release_grid.append(grid)
            self.n_deletions = i
            self.n_forgotten += 1
            self.rho_spent += rho_i
            self.last_tau = tau
            details.update(Delta_u=delta_u, Gamma=G, grid=grid, shift=shift, roundoff_floor=floor)
            certs.append(Certificate(learned_step=u, forgotten_step=tau, deletion_index=i, mechanism=release.MECHANISM,
                                     sigma=sigma, sensitivity=sens_used, rho=rho_i, details=details))
        return certs

    def roundoff_floor(self, u: int, tau: int, gd_steps: int, gd_set: int) -> float:
        """Float64 round-off two coupled runs can add to their gap from step u to the release at tau (release.py):
        every OGD step and noise step since u errs by at most e = C (d + 3) u_64 (R + eta_gd L) (eta_t <= eta_gd
        on the capped schedule), every GD step on a set of n_j examples by C (d + 3 + n_j) u_64 (R + eta_gd L) (the
        average's summation), each contracted by gamma_gd over its phase; summed without contraction otherwise."""
        n, R, step = self.spec.n_params, self.spec.domain_radius, self.eta_gd * self.L
        e = release.step_roundoff(n, R, step)
        floor = release.roundoff_floor(e, tau - u + 1 + self.n_deletions, 1.0)
        for tau_j, I_j, n_j in zip(self.phase_tau, self.phase_steps, self.phase_size):
            if tau_j >= u:
                floor += release.roundoff_floor(release.step_roundoff(n + n_j, R, step), I_j, self.gamma_gd)
        return floor + release.roundoff_floor(release.step_roundoff(n + gd_set, R, step), gd_steps, self.gamma_gd)

    def apply_noise(self, sigma: float, grid: float) -> np.ndarray:
        """Pi_K(g (round(theta/g) + k)), k ~ N_Z(0, (sigma/g)^2): a certificate's release (P4, P5)."""
        return release.add_discrete_noise(self.theta, grid, sigma, self.noise, self.spec.domain_radius)

    def replay_event(self, cert: Certificate, retained: RetainedData) -> None:
        """The reference run's copy of a deletion event (coupled replay): the same mechanism on the masked data.

        The GD phase uses the reference's *own* anchor / retained set (the first retained example of the same
        block, or the average of what it retains), the same number of steps and the same noise scale.
        """
        d = cert.details
        if not d.get("fallback", 0.0):
            I = int(d["gd_steps"])
            if I > 0:
                self.run_phase(retained, int(d["block_start"]), cert.forgotten_step, (), I)
        if cert.sigma > 0.0:
            self.theta = self.apply_noise(cert.sigma, d["grid"])
        self.last_tau = cert.forgotten_step

    def retrain(self, retained: RetainedData) -> None:
        """Exact retrain (OGD from 0 over the retained examples, clock kept): a new ledger epoch.

        The recomputed state depends on no forgotten record, and on a retained record only through its OGD
        shift, so the omega series, the block structure and the GD-phase history all restart.
        """
        t, epoch = self.t, self.epoch
        theta = ogd_recompute(self.loss, self.schedule, self.spec.domain_radius, self.spec.dim, retained,
                              upto=self.t, chunk_size=self.chunk_size)
        self._reset(t=t)
        self.theta = theta
        self.last_tau = t
        self.epoch = epoch + 1
