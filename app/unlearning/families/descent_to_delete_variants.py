"""Descent-to-delete's variants (paper 002; digest reference/descent-to-delete.md): their hyperparameters, calibration
checks and work, and the public constants each variant derives from the spec (iterations, regularisation, the
mechanism's delta, rho per update, the invariant radius, the cost of an update and of a full training).  The
engine's state, training and forgetting are in descent_to_delete.py."""
from __future__ import annotations

import math
from typing import Any

from ..contract.errors import SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import Unlearner
from ..maths import d2d_constants as dm
from ..maths import work_budget as wb
from ..maths.losses import Loss, make_loss
from ..mechanism import release
from ..mechanism.calibration import (N_MAX, CalibrationError, Checks, common_checks, construct, noise_norm_bound,
                                     release_checks, update_norm_bound)
from .descent_to_delete_data import CACHE_FLOATS

SECRET_MIN_DEFAULT_ITERATIONS, SECRET_MAX_DEFAULT_ITERATIONS = 25, 2000


def secret_default_iterations(c: "dm.PGDConstants") -> int:
    """Default I of the ``secret`` variant, from the declared bounds only (never the data): the smallest I with
    gamma^I <= m / (8 L), at least the former default 25 and at most SECRET_MAX_DEFAULT_ITERATIONS.  Thm 3.1's sensitivity is
    Delta = 8 L gamma^I / (m n (1 - gamma^I)) (d2d_constants.secret_sensitivity), so this I makes Delta <= 1/((1 -
    gamma^I) n) ~ 1/n: the published noise sigma ~ sqrt(2 log(1.25/delta)) / (epsilon n) per coordinate, which
    no longer swamps the model (the former fixed I = 25 left Delta = 0.6 (8L/m)/n, sigma ~ 4 per coordinate at
    n = 455 with l2 = 0.01: docs/accuracy.md).  The cost is O(I n d) per update; I grows like (M/2m) log(8L/m)
    as l2 -> 0, hence the cap (an explicit ``iterations`` overrides both)."""
    if not c.log_gamma < 0:  # gamma = 0 (m = M): one step reaches the minimiser
        return SECRET_MIN_DEFAULT_ITERATIONS
    need = math.ceil(math.log(c.m / (8.0 * c.L)) / c.log_gamma - 1e-12)
    return int(min(SECRET_MAX_DEFAULT_ITERATIONS, max(SECRET_MIN_DEFAULT_ITERATIONS, need)))


VARIANTS = ("secret", "perfect", "regularized_strong", "regularized_weak", "distributed")

STRONGLY_CONVEX = ("secret", "perfect", "distributed")

HP_KEYS = {"variant", "iterations", "xi", "beta", "selection", "regularization", "retrain_when_cheaper", "chunk_size",
           "huber_delta"}


SELECTIONS = ("min_loss", "single")

# the perfect variant's sigma raised at most this often to cover the re-rounding (once in practice; the grid may
# double once with it)
PERFECT_CALIBRATION_ROUNDS = 16

# the round index at which an epoch's update cost is taken when nothing caps it (retrain_when_cheaper false)
ROUNDS_WORST = 10**6


class DescentToDeleteVariants(Unlearner):
    """The variant mathematics of ``DescentToDelete``: hyperparameters, calibration, work, public constants."""

    # ---- hyperparameters -----------------------------------------------------------------------------
    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = dict(spec.hyperparameters)
        unknown = set(hp) - HP_KEYS
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        variant = hp.setdefault("variant", "secret")
        if variant not in VARIANTS:
            raise SpecError(f"variant must be one of {', '.join(VARIANTS)}")
        if not (spec.epsilon > 0 and math.isfinite(spec.epsilon)):
            raise SpecError("epsilon must be a positive number")
        if not 0 < spec.delta < 1:
            raise SpecError("delta must lie in (0, 1)")
        if variant in STRONGLY_CONVEX and not spec.l2 > 0:
            raise SpecError(f"variant {variant!r} needs l2 > 0 (strong convexity m = l2); use a regularized variant")
        if spec.loss == "huber":
            hp.setdefault("huber_delta", 1.0)
        xi = hp.setdefault("xi", 1.0)
        try:
            xi = float(xi)
        except (TypeError, ValueError):
            raise SpecError("xi must be a number") from None
        if variant == "distributed" and not 1.0 <= xi <= 4.0 / 3.0:
            raise SpecError("distributed needs xi in [1, 4/3] (Thm 4.5)")
        if variant == "regularized_weak" and not (xi >= 1.0 and math.isfinite(xi)):
            raise SpecError("regularized_weak needs xi >= 1 (Remark 3.6)")
        hp["xi"] = xi
        beta = hp.setdefault("beta", 0.05)
        if not (isinstance(beta, (int, float)) and 0 < beta < 1):
            raise SpecError("beta (accuracy failure probability) must lie in (0, 1)")
        hp["beta"] = float(beta)
        sel = hp.setdefault("selection", "min_loss")
        if sel not in SELECTIONS:
            raise SpecError(f"selection must be one of {', '.join(SELECTIONS)}")
        if sel != "min_loss" and variant != "distributed":
            raise SpecError("selection applies to the distributed variant only")
        reg = hp.setdefault("regularization", None)
        if reg is not None:
            if variant not in ("regularized_strong", "regularized_weak"):
                raise SpecError("regularization applies to the regularized variants only")
            if not (isinstance(reg, (int, float)) and reg > 0 and math.isfinite(reg)):
                raise SpecError("regularization must be a positive number")
            hp["regularization"] = float(reg)
        rwc = hp.setdefault("retrain_when_cheaper", True)
        if not isinstance(rwc, bool):
            raise SpecError("retrain_when_cheaper must be a boolean")
        cs = hp.setdefault("chunk_size", 4096)
        if not (isinstance(cs, int) and cs >= 1):
            raise SpecError("chunk_size must be a positive integer")
        it = hp.get("iterations")
        if it is None:
            if variant == "perfect":
                loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
                c = dm.PGDConstants(loss.lipschitz, loss.smoothness, spec.l2)
                it = max(1, math.ceil(dm.perfect_min_iterations(c, spec.n_params, spec.epsilon, spec.delta)))
            elif variant == "secret":
                loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
                it = secret_default_iterations(dm.PGDConstants(loss.lipschitz, loss.smoothness, spec.l2))
            else:
                it = 2 if variant == "distributed" else 25
        if not (isinstance(it, int) and not isinstance(it, bool) and it >= 1):
            raise SpecError("iterations must be a positive integer")
        hp["iterations"] = it
        if variant == "perfect":
            loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
            c = dm.PGDConstants(loss.lipschitz, loss.smoothness, spec.l2)
            i_min = dm.perfect_min_iterations(c, spec.n_params, spec.epsilon, spec.delta)
            if it < i_min:
                raise SpecError(f"the perfect variant needs iterations >= I_min = {i_min:.1f} (Thm 3.2)")
        return hp

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """Every epoch's constants (Thms 3.1-3.5, 4.5) at data-set sizes n from 1 (the largest sigma and
        regularisation) to N_MAX (the smallest sigma, gamma closest to 1, the most iterations): gamma < 1
        (T divides by log(1/gamma)), sigma finite and > 0 (rho = Delta^2/(2 sigma^2)), the training and first
        update iteration counts finite and at most ``max_iterations``, and the norms of the GD and publication
        steps (theta - eta grad, mean + sigma z) finite when squared."""
        checks = Checks(cls.algorithm)
        eng = construct(cls, spec)
        R, eps = spec.domain_radius, ("privacy.epsilon", "privacy.delta")
        common_checks(checks, eng.base_loss, spec)
        hp_reg = ("hyperparameters.regularization",) if eng.hp["regularization"] is not None else ()
        gamma = ("l2", "bounds.x_norm", *hp_reg)
        log_inv = math.inf
        for n in (1, 2, 2**10, 2**20, 2**30, 2**40, N_MAX):
            probe = DescentToDeleteVariants.__new__(cls)
            probe.__dict__.update(eng.__dict__)
            probe.n_epoch = probe.n_current = n
            probe.m_reg = checks.finite(f"m(n={n})", lambda: probe._regularization_for(n), *eps, *gamma)
            checks.call(f"constants(n={n})", probe._configure, *gamma, *eps)
            c = probe.c
            checks.finite(f"mu(n={n})", c.m, "l2", *hp_reg, positive=True)
            checks.finite(f"log(1/gamma)(n={n})", -c.log_gamma, *gamma, positive=True)
            checks.squared(f"L(n={n})", c.L, "bounds.x_norm", "domain_radius")
            checks.squared(f"update_norm(n={n})", update_norm_bound(R, c.eta * c.L), *gamma, "domain_radius")
            sens = checks.finite(f"Delta(n={n})", probe.sensitivity, *gamma, *eps)
            sigma = checks.finite(f"sigma(n={n})", probe.sigma, *eps, *gamma, positive=sens > 0)
            checks.finite(f"rho(n={n})", lambda: probe.rho_update, *eps, *gamma)
            if sigma > 0 and sens > 0:  # the discrete release (release.py): sigma'/g from sigma/Delta, int64 draws
                release_checks(checks, sigma / sens, eng.d, *eps, *gamma)
            checks.squared(f"noise_norm(n={n})", noise_norm_bound(R, sigma, eng.d), *eps, *gamma, "domain_radius")
            first = checks.finite(f"T_1(n={n})", lambda: probe.update_iterations(1), *gamma, *eps)
            checks.finite(f"T(n={n})", probe.T, *gamma, *eps)
            if probe.variant == "distributed":  # grows polynomially in n by design (Thm 4.5): finite only
                checks.finite(f"T'_1(n={n})", lambda: dm.distributed_partition_iterations(
                    c, probe.sizes, n, probe.I, 1, spec.delta, 1), *gamma, *eps)
            elif first > cls.max_iterations:
                cls._too_much_work(f"T_1 = {first:.3g}", c.gamma, gamma)
            log_inv = min(log_inv, -c.log_gamma)
        # every iteration count above carries log(n or 1/delta ...)/log(1/gamma): at gamma -> 1 no round ends
        per = math.log(N_MAX) / log_inv
        if per > cls.max_iterations:
            cls._too_much_work(f"log(N_MAX)/log(1/gamma) = {per:.3g}", math.exp(-log_inv), gamma)

    # ---- work and memory (issue 21) ------------------------------------------------------------------
    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Every round is full-batch work on the N = max_records kept records, re-read from the store on every pass
        in chunks of ``chunk_size``: a training is T passes, an update round T_i passes (distributed: the copies'
        re-optimised partitions, C n T_i gradients, plus the pool and the selection pass).  With
        retrain_when_cheaper a round never costs more than a training; without it, a learn of the batch is one
        round per example and round i of an epoch costs T_i(i) with i unbounded (taken at ROUNDS_WORST)."""
        eng = cls(spec)
        p, c, N = spec.n_params, eng.chunk_size, max(2, int(spec.hyperparameters.get("max_records") or batch))
        eng.n_epoch = eng.n_current = N
        eng.m_reg = eng._regularization_for(N)
        eng._configure()
        in_memory = N * (spec.dim + 1) <= CACHE_FLOATS  # read once per request (``cached``), else on every pass
        gd = lambda n: rd(n, c) + wb.gd_pass(n, p, c)  # one full gradient  # noqa: E731
        once = wb.read(N, p) if in_memory else 0.0
        rd = lambda n, page: 0.0 if in_memory else wb.read(n, p, page)  # noqa: E731
        softmax = eng.loss.n_out > 1
        if eng.variant == "distributed":
            sz = eng.sizes
            group = max(1, c // sz.P)
            per_copy_calls = sz.K if softmax else math.ceil(sz.K / group)
            train = wb.DISTRIBUTED * (sz.C * eng.T * (sz.B * wb.grad_flops(p) * wb.FLOP + per_copy_calls * wb.STEP)
                                      + sz.C * rd(min(sz.B, N), 500) + 2 * rd(N, c) + sz.C * N * wb.grad_flops(p) + once)

            def round_cost(i: int) -> float:
                Ti = dm.distributed_budget(eng.c, sz, N, eng.I, i, spec.delta)
                iters = dm.distributed_partition_iterations(eng.c, sz, N, eng.I, i, spec.delta, 1)
                return wb.DISTRIBUTED * (sz.C * (N * Ti * wb.grad_flops(p) * wb.FLOP + iters * wb.STEP + rd(sz.P, 500))
                                         + 3 * rd(N, c) + sz.C * N * wb.grad_flops(p) + wb.release(p) + once)
            mem = wb.F64 * max(sz.C * sz.K * p, min(group * sz.P, N) * (p + 1) * 2, sz.C * sz.B)
            train_half = train
        else:
            train = eng.T * gd(N) + wb.release(p) + once
            # a forget retrains only below half the epoch's records (2 n_after < n_epoch <= N: descent_to_delete.py's
            # forget), on those n_after < N/2: T(N/2) <= T passes over half the records
            train_half = eng.T * gd(math.ceil(N / 2)) + wb.release(p) + once

            def round_cost(i: int) -> float:
                return eng.update_iterations(i) * gd(N) + wb.release(p) + once
            mem = wb.F64 * min(N, c) * (p + 1) * 2
        if eng.hp["retrain_when_cheaper"]:
            # the largest round still cheaper than a training (update_cost grows with i), else the training itself
            lo, hi = 1, ROUNDS_WORST
            if eng.update_cost(1, N) >= eng.training_cost(N):
                worst_round = 0.0
            else:
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if eng.update_cost(mid, N) < eng.training_cost(N) else (lo, mid - 1)
                worst_round = round_cost(lo)
            # a round whose gradient budget reaches a training's is one (descent_to_delete.py ``_update``): a training
            # on up to N records whenever some round gets there, else only the forget below n/2 trains
            replaced = worst_round == 0.0 or lo < ROUNDS_WORST
            forget = max(train if replaced else train_half, worst_round)
            adds = worst_round if eng.variant == "distributed" else add_rounds_overhead(eng, p, N, c, lo, in_memory)
            learn = train + min(worst_round, adds)
        else:
            # a forget below n/2 of the epoch is an exact retrain (Assumption 2.6; descent_to_delete.py)
            forget = max(round_cost(ROUNDS_WORST), train_half)
            learn = max(train, batch * (forget - once) + once)  # the kept records are read once per request
        fields = ("hyperparameters.max_records", "dim", "hyperparameters.iterations", "hyperparameters.chunk_size")
        if eng.variant == "regularized_weak":  # T_i = i^(2 xi) I: xi drives a round's work (saturated, never inf)
            fields = fields[:3] + ("hyperparameters.xi",) + fields[3:]
        hint = "" if eng.hp["retrain_when_cheaper"] else (", or set retrain_when_cheaper true (without it a round's "
                                                          f"cost grows with the rounds of an epoch; taken at round {ROUNDS_WORST})")
        mem = max(mem, wb.F64 * N * (spec.dim + 1) if in_memory else 0.0)
        return wb.Cost(learn=learn, forget=forget, forget_each=forget - once, retrain=train, array_bytes=mem,
                       learn_fields=fields, forget_fields=fields, hint=hint,
                       memory_fields=("dim", "hyperparameters.max_records", "hyperparameters.chunk_size"))

    @classmethod
    def _too_much_work(cls, what: str, g: float, fields: tuple[str, ...]) -> None:
        raise CalibrationError(f"{cls.algorithm}: {what} gradient-descent iterations exceed the work bound "
                               f"{cls.max_iterations} (gamma = {g!r} is too close to 1)", quantity="iterations",
                               fields=fields)

    # ---- public constants of the current epoch -------------------------------------------------------------
    def _regularization_for(self, n: int) -> float:
        if self.variant not in ("regularized_strong", "regularized_weak"):
            return 0.0
        if self.hp["regularization"] is not None:
            return float(self.hp["regularization"])
        L, M, s = self.base_loss.lipschitz, self.base_loss.smoothness, self.spec
        if self.variant == "regularized_strong":
            return dm.strong_regularization(L, M, self.D, self.d, s.epsilon, s.delta, n, self.I, self.strong_exponent)
        return dm.weak_regularization(L, M, self.D, self.d, s.epsilon, s.delta, n, self.I, self.xi)

    def _configure(self) -> None:
        """Derive the objective, gamma, eta, sigma, Delta and T from (spec, n_epoch, m_reg): public only."""
        s = self.spec
        mu = s.l2 + self.m_reg
        self.loss: Loss = make_loss(s.loss, s.x_norm, s.y_abs, s.domain_radius, mu, self.hp, s.n_classes)
        self.c = dm.PGDConstants(self.loss.lipschitz, self.loss.smoothness, mu)
        self.sizes = None
        self.perfect_release: dict[str, float] | None = None
        n = self.n_epoch
        if n == 0 or mu <= 0:
            self.sigma = self.sensitivity = 0.0
            self.T = 0
            return
        eps, delta, I = s.epsilon, s.delta, self.I
        v = self.variant
        if v in ("secret", "regularized_strong"):
            self.sensitivity = dm.secret_sensitivity(self.c, I, n)
            self.sigma = dm.calibrate(self.sensitivity, eps, delta)
            self.T = dm.training_iterations(self.c, I, self.D, n, self.base_loss.lipschitz)
        elif v == "perfect":
            self.sigma, self.sensitivity = self._perfect_calibration(n)
            self.T = dm.training_iterations(self.c, I, self.D, n)
        elif v == "regularized_weak":
            self.sensitivity = dm.weak_sensitivity(self.c, I, n, self.xi)
            self.sigma = dm.calibrate(self.sensitivity, eps, delta) / (2.0 if self.weak_constant_printed else 1.0)
            self.T = dm.training_iterations(self.c, I, self.D, n, self.base_loss.lipschitz)
        else:
            self.sizes = dm.DistributedSizes.for_n(n, self.xi, self.hp["beta"])
            if self.hp["selection"] == "single":  # one copy: no data-dependent choice among secret models (E9)
                self.sizes = dm.DistributedSizes(self.sizes.K, self.sizes.B, self.sizes.P, 1)
            self.a = dm.distributed_a(self.sizes, n, I)
            self.sensitivity = dm.distributed_sensitivity(self.c, self.a, n)
            self.sigma = dm.calibrate(self.sensitivity, eps, delta / 2.0)
            self.T = dm.distributed_training_iterations(self.c, self.sizes, self.a, self.D, delta)
        self.sigma *= self.sigma_scale

    def _perfect_calibration(self, n: int) -> tuple[float, float]:
        """(sigma, Delta) of the perfect variant with the re-rounding of its earlier releases (issue 29 item 7;
        module docstring of descent_to_delete.py): Delta = max(G (8L/(mn) + sqrt(2d) sigma) + rerounding, round-off
        floor), G = gamma^I/(1 - gamma^I), with the grid g and sigma' its releases use (release.release_figures of
        the epoch's public inputs, the same at every release of the epoch).  sigma is Thm 3.2's unless Delta/sigma
        would exceed sqrt(x + 2 eps) - sqrt(x) (Lemma A.3 at delta/2); then it is raised until it does not.
        Sets ``perfect_release``: the release's inputs (the paper's Delta at this sigma, raised with sigma to the
        floor as ``_publish`` does for the other variants), its grid and sigma', the term, the eq. 13 radius."""
        c, I, d, s = self.c, self.I, self.d, self.spec
        bound = dm.perfect_ratio_bound(s.epsilon, s.delta)
        gI, omg = dm.pow_gamma(c.log_gamma, I)
        G = gI / omg
        floor = self.roundoff_floor()
        sigma = dm.perfect_sigma(c, I, n, s.epsilon, s.delta)
        for _ in range(PERFECT_CALIBRATION_ROUNDS):
            base = dm.perfect_sensitivity(c, I, n, sigma, d)  # the paper's (E4) Delta at this sigma
            sens_in, sigma_in = (floor, sigma * (floor / base)) if floor > base else (base, sigma)
            grid, sigma_rel, _ = release.release_figures(sens_in, sigma_in, d, self.R)
            rer = dm.perfect_rerounding(c, I, d, sigma_in, sigma_rel, grid)
            sens = max(dm.perfect_sensitivity(c, I, n, sigma_in, d) + rer, floor)
            if sens <= bound * sigma_in:
                self.perfect_release = {
                    "sensitivity": sens_in, "sigma": sigma_in, "grid": grid, "sigma_released": sigma_rel,
                    "rerounding": rer, "floor": floor,
                    "radius": dm.perfect_radius(c, I, n, sigma_rel, d) + G * grid * math.sqrt(d) / 2.0}
                return sigma_in, sens
            # Delta/sigma = G (8L/(mn) + g sqrt(d)/2)/sigma + G sqrt(2d) sigma'/sigma <= bound (sigma'/sigma ~ 1 + 1/K)
            denom = bound - G * math.sqrt(2.0 * d) * (sigma_rel / sigma_in) * (1.0 + 2.0**-20)
            if not denom > 0.0:
                break
            need = G * (8.0 * c.L / (c.m * n) + grid * math.sqrt(d) / 2.0) / denom
            sigma = max(sigma * (1.0 + 2.0**-20), need)
        raise CalibrationError(f"{self.algorithm}: the perfect variant's sigma does not cover the re-rounding of its "
                               "releases at these iterations; raise hyperparameters.iterations",
                               quantity="sigma", fields=("hyperparameters.iterations", "privacy.epsilon"))

    @property
    def mechanism_delta(self) -> float:
        """The delta the Gaussian step is calibrated at (delta/2 where the theorem spends delta/2 on an event)."""
        return self.spec.delta / 2.0 if self.variant in ("perfect", "distributed") else self.spec.delta

    @property
    def rho_update(self) -> float:
        # (Delta/sigma)^2/2 = Delta^2/(2 sigma^2): the ratio first, so that neither square under- or overflows
        return 0.5 * (self.sensitivity / self.sigma) ** 2 if self.sigma > 0 else 0.0

    def update_iterations(self, i: int) -> int:
        """T_i for the i-th update of the epoch (PGD variants)."""
        if self.variant == "perfect":
            return dm.perfect_update_iterations(self.c, self.I, i, self.d, self.spec.delta)
        if self.variant == "regularized_weak":
            return dm.weak_update_iterations(self.I, i, self.xi)
        return self.I

    def invariant_radius(self, i: int) -> float:
        """The theorem's bound on ||mean of update i - argmin of the objective on D_i|| (eq. 3, 13, 18)."""
        if self.variant in ("secret", "regularized_strong"):
            return dm.secret_radius(self.c, self.I, self.n_epoch)
        if self.variant == "perfect":  # eq. 13 with its releases' grid and sigma' (issue 29 item 7)
            return self.perfect_release["radius"] if self.perfect_release else 0.0
        if self.variant == "regularized_weak":
            return dm.weak_radius(self.c, self.I, self.n_epoch, i, self.xi)
        raise NotImplementedError

    def update_cost(self, i: int, n_i: int) -> int:
        """Public gradient-evaluation budget of update i (distributed: C n T_i, the paper's budget)."""
        if self.variant == "distributed":
            return int(self.sizes.C * n_i * dm.distributed_budget(self.c, self.sizes, self.n_epoch, self.I, i,
                                                                  self.spec.delta))
        return n_i * self.update_iterations(i)

    def training_cost(self, n: int) -> int:
        """Gradient evaluations of a full training on n examples (constants as they would be after it)."""
        probe = DescentToDeleteVariants.__new__(type(self))
        probe.__dict__.update(self.__dict__)
        probe.n_epoch, probe.m_reg = n, self._regularization_for(n)
        probe._configure()
        if self.variant == "distributed":
            return probe.sizes.C * probe.sizes.B * probe.T
        return n * probe.T


def add_rounds_overhead(eng, p: int, N: int, chunk: int, worst: int, in_memory: bool) -> float:
    """What a learn's add rounds cost beyond a training's gradients, with retrain_when_cheaper (descent_to_delete.py
    ``learn``): the k rounds run only while their gradient budgets sum below a training's, sum_j (h + j) I_j <
    N T, so k (k + 1) / 2 I_1 < N T bounds k (I_j >= I_1: the iterations grow with the round), and beyond its
    gradients each round costs its passes' calls and steps (at most ``worst``'s iterations, a round replaced by a
    training running at most as many passes) and a release; records not held in memory are re-read on every pass
    (its fixed costs: the store's queries and every chunk opened; the bytes are the training's)."""
    k = math.isqrt(int(2 * N * eng.T // max(1, eng.update_iterations(1)))) + 1
    passes = eng.update_iterations(worst)
    calls = math.ceil(N / max(chunk, 1)) * wb.CALL + wb.GD_STEP
    if not in_memory:
        calls += wb.STORE + math.ceil(N / wb.chunk_records(p)) * wb.CHUNK_OPEN
    return k * (passes * calls + wb.release(p))

