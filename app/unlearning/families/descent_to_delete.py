"""Descent-to-delete (paper 002, Neel, Roth, Sharifi-Malvajerdi 2020) as one model family.

Every update -- ``learn`` adds an example, ``forget`` deletes one -- is one round of the paper: warm-started
full-batch projected gradient descent on the *updated* retained set (Algorithm 2), then publication of the
result plus fresh Gaussian noise (Algorithm 3).  The published draw is cached until the next update (pitfall 2).
``variant`` selects the theorem:

- ``secret`` (Thm 3.1): strongly convex; the unperturbed iterate theta_hat is the secret state, T_i = I.
- ``perfect`` (Thm 3.2): strongly convex; no secret state, warm start from the published model, T_i = I +
  log log(4di/delta)/log(1/gamma), I >= I_min.
- ``regularized_strong`` (Thm 3.4): convex; runs Thm 3.1 on g = f + (m/2)||theta||^2 with m from the theorem
  (exponent 2/5, erratum E1), fixed until the next full training.
- ``regularized_weak`` (Thm 3.5 / Rem. 3.6): convex; T_i = i^{2 xi} I, sigma with the 4 sqrt 2 constant (E2).
- ``distributed`` (Thm 4.5): perturbed distributed descent: C copies of a bootstrap sample of size B = K^2 in K
  partitions, reservoir sampling with replacement (Alg. 5) on every update, only modified partitions re-optimised
  (vectorised across partitions), the copy with the lowest empirical loss published (E9: that selection is the
  paper's, not covered by its formal proof; ``selection="single"`` keeps one copy and avoids it, at the price of
  the accuracy guarantee holding only in expectation).

Publication (issue 14; app/unlearning/mechanism/release.py): the mean is rounded to a grid g and released with discrete
Gaussian noise (Delta' = Delta + g sqrt(d), sigma' = sigma Delta'/Delta); Delta is at least the float64 round-off
floor 2 e/(1 - gamma) of the projected GD steps (``roundoff_floor``).

Deviations (documented): the published point is projected onto Theta (E5, post-processing); the Lipschitz
constant of g uses sup ||theta|| = R of the centred ball (L + mR, tighter than the paper's L + mD and valid);
several updates in one request are processed sequentially, one round each (pitfall 12).
"""
from __future__ import annotations

import math
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..maths import work_budget as wb
from ..maths import d2d_constants as dm
from ..mechanism import release
from ..contract.errors import CapacityExhausted, ForgetError, SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import ArrayRetained, RetainedData, Unlearner
from ..mechanism.calibration import (N_MAX, CalibrationError, Checks, common_checks, construct, noise_norm_bound, release_checks, update_norm_bound)
from ..contract.certificate import Certificate
from ..maths.domain import project_l2_ball
from ..maths.losses import Loss, augment, make_loss
from ..mechanism.noise import NoiseSource

SECRET_MIN_DEFAULT_ITERATIONS, SECRET_MAX_DEFAULT_ITERATIONS = 25, 2000


def secret_default_iterations(c: "dm.PGDConstants") -> int:
    """Default I of the ``secret`` variant, from the declared bounds only (never the data): the smallest I with
    gamma^I <= m / (8 L), at least the former default 25 and at most SECRET_MAX_DEFAULT_ITERATIONS.  Thm 3.1's sensitivity is
    Delta = 8 L gamma^I / (m n (1 - gamma^I)) (d2d_math.secret_sensitivity), so this I makes Delta <= 1/((1 -
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
# the round index at which an epoch's update cost is taken when nothing caps it (retrain_when_cheaper false)
ROUNDS_WORST = 10**6
# A request reads the kept records once into memory while they stay below this many floats (128 MB), instead of
# re-reading (and decrypting) the store on every gradient pass; larger sets are streamed pass by pass.
CACHE_FLOATS = 16_000_000


def cached(retained: RetainedData | None, dim: int) -> RetainedData | None:
    """The kept records of one request, in memory when they fit CACHE_FLOATS (one read of the store)."""
    if retained is None or isinstance(retained, ArrayRetained) or len(retained) * (dim + 1) > CACHE_FLOATS:
        return retained
    parts = list(retained.chunks(4096))
    if not parts:
        return ArrayRetained(np.zeros(0, np.int64), np.zeros((0, dim)), np.zeros(0))
    return ArrayRetained(np.concatenate([s for s, _, _ in parts]), np.vstack([X for _, X, _ in parts]),
                         np.concatenate([y for _, _, y in parts]))


class DatasetView:
    """The dataset D_i of one round: the retained store minus ``exclude`` plus ``extra`` new examples.

    Streams augmented chunks; never materialises the retained set.
    """

    def __init__(self, retained: RetainedData | None, exclude: Sequence[int] = (), extra_steps: Any = None,
                 extra_X: Any = None, extra_y: Any = None):
        self.retained = retained
        self.exclude = tuple(int(s) for s in exclude)
        self.extra_steps = np.zeros(0, np.int64) if extra_steps is None else np.asarray(extra_steps, np.int64)
        self.extra_X = None if extra_X is None else np.asarray(extra_X, np.float64)
        self.extra_y = None if extra_y is None else np.asarray(extra_y, np.float64)

    @property
    def n(self) -> int:
        base = 0 if self.retained is None else len(self.retained) - len(self.exclude)
        return base + len(self.extra_steps)

    def chunks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        if self.retained is not None:
            for s, X, y in self.retained.chunks(size, exclude=self.exclude):
                yield s, augment(X), y
        for start in range(0, len(self.extra_steps), size):
            sl = slice(start, start + size)
            yield self.extra_steps[sl], augment(self.extra_X[sl]), self.extra_y[sl]

    def steps(self, size: int) -> np.ndarray:
        parts = [s for s, _, _ in self.chunks(size)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def get(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Augmented (X, y) of the given steps, in order."""
        steps = np.asarray(steps, np.int64)
        out_X = np.empty((len(steps), 0))
        out_y = np.empty(len(steps))
        in_extra = np.isin(steps, self.extra_steps)
        if in_extra.any():
            idx = np.searchsorted(self.extra_steps, steps[in_extra])
            ex = augment(self.extra_X[idx])
            out_X = np.empty((len(steps), ex.shape[1]))
            out_X[in_extra] = ex
            out_y[in_extra] = self.extra_y[idx]
        rest = ~in_extra
        if rest.any():
            X, y = self.retained.get(steps[rest])
            ra = augment(X)
            if out_X.shape[1] != ra.shape[1]:
                out_X = np.empty((len(steps), ra.shape[1]))
            out_X[rest] = ra
            out_y[rest] = y
        return out_X, out_y


def reservoir_update(slots: np.ndarray, kind: str, step: int, n_after: int, pool: np.ndarray | None,
                     rng: np.random.Generator) -> np.ndarray:
    """Algorithm 5 (reservoir sampling with replacement), in place on one copy's B slots; returns changed slots.

    add: N ~ Binomial(B, 1/n_i) distinct slots (n_i the size after the addition) take the new record.
    delete: every slot holding the record gets an independent uniform draw from D_i (``pool``, after deletion).
    Records are identified by their unique step, never by value (pitfall 15).
    """
    B = len(slots)
    if kind == "add":
        N = rng.binomial(B, 1.0 / n_after)
        idx = np.sort(rng.choice(B, size=N, replace=False))
        slots[idx] = step
    else:
        idx = np.flatnonzero(slots == step)
        slots[idx] = pool[rng.integers(0, len(pool), size=len(idx))]
    return idx


class DescentToDelete(Unlearner):
    algorithm = "descent_to_delete"
    accounting = "per_update"
    needs_retained_data = True
    supports_retrain = True
    guarantee_definition = "(epsilon, delta)-unlearning per update (Neel, Roth, Sharifi-Malvajerdi 2020, Def. 2.4)"
    guarantee_words = (
        "After each update, the published model is (epsilon, delta)-indistinguishable from the model the same "
        "training algorithm would publish if retrained from scratch on the current data. The guarantee is per "
        "update (not composed across updates); the secret-state variants keep an unpublished exact iterate."
    )

    # Test hooks for negative controls (never changed by the service).
    sigma_scale = 1.0            # multiplies every sigma
    weak_constant_printed = False  # Thm 3.5 as printed: 2 sqrt(2M) instead of 4 sqrt(2) sqrt(M) (E2)
    strong_exponent = 0.4          # Thm 3.4 exponent (E1: printed 4/5, corrected 2/5)
    partition_iterations_cap: int | None = None  # distributed: cap T' (a deliberately under-budgeted control)
    # Work bound checked at creation: a round that needs more gradient-descent iterations than this (gamma too
    # close to 1) would never finish inside a request; such a spec is refused instead (tests may lower it).
    max_iterations: int = 10**6

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.variant: str = hp["variant"]
        self.I: int = int(hp["iterations"])
        self.xi = float(hp["xi"])
        self.chunk_size = int(hp["chunk_size"])
        self.d = spec.n_params
        self.R = float(spec.domain_radius)
        self.D = 2.0 * self.R
        self.base_loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
        self.sampler: np.random.Generator | None = None  # tests inject a seeded generator
        # state
        self.t = 0
        self.n_epoch = 0
        self.n_current = 0
        self.round = 0
        self.epoch = 0
        self.n_deletions = 0
        self.grad_evals = 0
        self.m_reg = 0.0
        self.theta = np.zeros(self.d)
        self.published_ = np.zeros(self.d)
        self.selected = 0
        self.part_theta = np.zeros((0, 0, self.d))
        self.slots = np.zeros((0, 0), np.int64)
        self.slot_partition = np.zeros(0, np.int64)
        self._last_mean = np.zeros(self.d)  # the pre-noise mean of the last publication (tests only, never state)
        self.last_release: dict[str, float] = {}  # grid, sigma, sensitivity of the last release (public; certificates)
        self._configure()

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
            probe = DescentToDelete.__new__(cls)
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
        else:
            train = eng.T * gd(N) + wb.release(p) + once

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
            forget = max(train, worst_round)
            learn = train + worst_round
        else:
            forget = round_cost(ROUNDS_WORST)
            learn = max(train, batch * (forget - once) + once)  # the kept records are read once per request
        fields = ("hyperparameters.max_records", "dim", "hyperparameters.iterations", "hyperparameters.chunk_size")
        hint = "" if eng.hp["retrain_when_cheaper"] else (", or set retrain_when_cheaper true (without it a round's "
                                                          f"cost grows with the rounds of an epoch; taken at round {ROUNDS_WORST})")
        mem = max(mem, wb.F64 * N * (spec.dim + 1) if in_memory else 0.0)
        return wb.Cost(learn=learn, forget=forget, forget_each=forget - once, retrain=train, array_bytes=mem,
                       learn_fields=fields, forget_fields=fields, hint=hint,
                       memory_fields=("dim", "hyperparameters.max_records", "hyperparameters.chunk_size"))

    def records_held(self) -> int:
        return self.n_current

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
            self.sigma = dm.perfect_sigma(self.c, I, n, eps, delta)
            self.sensitivity = dm.perfect_sensitivity(self.c, I, n, self.sigma, self.d)
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
        if self.variant == "perfect":
            return dm.perfect_radius(self.c, self.I, self.n_epoch, self.sigma / self.sigma_scale, self.d)
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
        probe = DescentToDelete.__new__(type(self))
        probe.__dict__.update(self.__dict__)
        probe.n_epoch, probe.m_reg = n, self._regularization_for(n)
        probe._configure()
        if self.variant == "distributed":
            return probe.sizes.C * probe.sizes.B * probe.T
        return n * probe.T

    # ---- state --------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "t": self.t, "n_epoch": self.n_epoch, "n_current": self.n_current, "round": self.round,
            "epoch": self.epoch, "n_deletions": self.n_deletions, "grad_evals": self.grad_evals,
            "m_reg": self.m_reg, "published": self.published_.copy(),
        }
        if self.variant in ("secret", "regularized_strong", "regularized_weak"):
            st["theta"] = self.theta.copy()
        if self.variant == "distributed":
            C, K = self.part_theta.shape[:2]
            st.update({
                "C": int(C), "K": int(K), "B": int(self.slots.shape[1]), "selected": self.selected,
                "part_theta": self.part_theta.reshape(-1).copy(),
                "slots": self.slots.reshape(-1).astype(np.int64),
                "slot_partition": self.slot_partition.astype(np.int64).copy(),
            })
        return st

    def load_state(self, state: Mapping[str, Any]) -> None:
        for k in ("t", "n_epoch", "n_current", "round", "epoch", "n_deletions", "grad_evals"):
            setattr(self, k, int(state[k]))
        self.m_reg = float(state["m_reg"])
        pub = np.asarray(state["published"], dtype=np.float64)
        if pub.shape != (self.d,):
            raise ValueError("stored parameters do not match the model dimension")
        self.published_ = pub.copy()
        if "theta" in state:
            self.theta = np.asarray(state["theta"], dtype=np.float64).reshape(self.d).copy()
        if self.variant == "distributed":
            C, K, B = int(state["C"]), int(state["K"]), int(state["B"])
            self.selected = int(state["selected"])
            self.part_theta = np.asarray(state["part_theta"], np.float64).reshape(C, K, self.d).copy()
            self.slots = np.asarray(state["slots"], np.int64).reshape(C, B).copy()
            self.slot_partition = np.asarray(state["slot_partition"], np.int64).reshape(B).copy()
        self._configure()

    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        return self.published_.copy()

    def constants(self) -> dict[str, float]:
        return {"L": self.c.L, "beta": self.c.M, "mu": self.c.m, "D": self.D, "gamma": self.c.gamma, "eta": self.c.eta}

    def ledger(self) -> dict[str, Any]:
        n = self.n_epoch
        return {
            "accounting": self.accounting,
            "rho_spent": self.rho_update if self.round > 0 else 0.0,  # per update; updates do not compose
            "rho_budget": self.spec.rho,
            "capacity_total": n - math.ceil(n / 2) if n else None,
            "capacity_left": max(0, self.n_current - math.ceil(n / 2)) if n else None,
            "deletions": self.n_deletions,
            "epoch": self.epoch,
            "epsilon": self.spec.epsilon,
            "delta": self.spec.delta,
            "sigma": self.sigma,
        }

    @property
    def status(self) -> str:
        if self.n_epoch and 2 * (self.n_current - 1) < self.n_epoch:
            return "retrain_required"
        return "ready"

    # ---- randomness ---------------------------------------------------------------------------------------
    def _rng(self) -> np.random.Generator:
        if self.sampler is not None:
            return self.sampler
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))

    def roundoff_floor(self) -> float:
        """Float64 round-off two coupled runs can add to ||mean - reference mean|| (release.py): every projected GD
        step on a set of at most n_epoch examples errs by at most e = C (d + 2 + n) u_64 (R + eta L) (the average's
        summation included), and the steps contract by gamma (strongly convex objective), so both runs together add
        at most 2 e / (1 - gamma), whatever the number of steps and rounds."""
        if self.n_epoch == 0 or not self.c.gamma < 1.0:
            return 0.0
        e = release.step_roundoff(self.d + self.n_epoch, self.R, self.c.eta * self.c.L)
        return release.roundoff_floor(e, 2**62, self.c.gamma)

    def _publish(self, mean: np.ndarray) -> None:
        """f_publish (Alg. 3 / 7): one fresh draw per update, cached; projected onto Theta (E5).

        Released through the discrete Gaussian (release.py): Delta = max(sensitivity, round-off floor), sigma
        scaled with it (sigma/Delta as calibrated), grid g, Delta' = Delta + g sqrt(d), sigma' = sigma Delta'/Delta.
        The (epsilon, delta) calibration of sigma/Delta carries over through CKS20 (zCDP Delta^2/(2 sigma^2),
        Thm 14; the discrete Gaussian's (epsilon, delta) profile matches the continuous one's up to CKS20's
        negligible correction at sigma'/g >= 2^10)."""
        self._last_mean = mean.copy()
        floor = self.roundoff_floor()
        sens, sigma = self.sensitivity, self.sigma
        if sigma > 0.0 and floor > sens:
            sigma, sens = sigma * (floor / sens) if sens > 0.0 else sigma, floor
        self.published_, grid, sigma_used, sens_used = release.discrete_release(
            mean, sens, sigma, self.noise, scale=self.R, radius=self.R)
        self.last_release = {"grid": grid, "sigma": sigma_used, "sensitivity": sens_used, "roundoff_floor": floor}

    # ---- gradient descent ---------------------------------------------------------------------------------
    def _grad(self, theta: np.ndarray, view: DatasetView) -> np.ndarray:
        total = np.zeros(self.d)
        for _, Xa, y in view.chunks(self.chunk_size):
            total += self.loss.grad_sum(theta, Xa, y)
        return total / view.n + self.c.m * theta

    def _gd(self, theta: np.ndarray, iters: int, view: DatasetView) -> np.ndarray:
        """iters full-batch projected GD steps with eta = 2/(M+m) on the average loss over D_i (pitfall 7)."""
        eta = self.c.eta
        for _ in range(iters):
            theta = project_l2_ball(theta - eta * self._grad(theta, view), self.R)
        self.grad_evals += iters * view.n
        return theta

    def train_from_scratch(self, view: DatasetView) -> np.ndarray:
        """A(D) with this epoch's constants (Alg. 1): T steps from 0.  Used by training and the replay reference."""
        return self._gd(np.zeros(self.d), self.T, view)

    # ---- distributed helpers ------------------------------------------------------------------------------
    def _partition_gd(self, thetas: np.ndarray, Xp: np.ndarray, yp: np.ndarray, iters: int) -> np.ndarray:
        """Projected GD on k partitions at once: thetas (k, d), Xp (k, P, d), yp (k, P)."""
        eta, mu, P = self.c.eta, self.c.m, Xp.shape[1]
        if self.loss.n_out > 1:  # softmax: each partition's parameters are a matrix (losses.py)
            for _ in range(iters):
                thetas = np.stack([th - eta * (self.loss.grad_sum(th, X, y) / P + mu * th)
                                   for th, X, y in zip(thetas, Xp, yp)])
                norms = np.linalg.norm(thetas, axis=1, keepdims=True)
                thetas = np.where(norms > self.R, thetas * (self.R / np.maximum(norms, 1e-300)), thetas)
            self.grad_evals += iters * Xp.shape[0] * P
            return thetas
        for _ in range(iters):
            r = self.loss.residual(np.einsum("kpd,kd->kp", Xp, thetas), yp)
            thetas = thetas - eta * (np.einsum("kpd,kp->kd", Xp, r) / P + mu * thetas)
            norms = np.linalg.norm(thetas, axis=1, keepdims=True)
            thetas = np.where(norms > self.R, thetas * (self.R / np.maximum(norms, 1e-300)), thetas)
        self.grad_evals += iters * Xp.shape[0] * P
        return thetas

    def _train_partitions(self, l: int, parts: np.ndarray, start: np.ndarray, iters: int, view: DatasetView) -> np.ndarray:
        P = self.sizes.P
        group = max(1, self.chunk_size // P)
        out = np.empty((len(parts), self.d))
        for g0 in range(0, len(parts), group):
            sel = parts[g0 : g0 + group]
            slot_idx = (sel[:, None] * P + np.arange(P)[None, :]).reshape(-1)  # slot k is in partition k // P
            steps = self.slots[l, slot_idx]
            uniq, inv = np.unique(steps, return_inverse=True)
            Xu, yu = view.get(uniq)
            Xp = Xu[inv].reshape(len(sel), P, -1)
            yp = yu[inv].reshape(len(sel), P)
            out[g0 : g0 + group] = self._partition_gd(start[g0 : g0 + group], Xp, yp, iters)
        return out

    def _select_and_publish(self, view: DatasetView) -> None:
        """l* = argmin_l f_{D_i}(avg theta_hat_l) on the full current data (Alg. 4/6; E9), then Alg. 7."""
        avgs = self.part_theta.mean(axis=1)
        totals = np.zeros(len(avgs))
        for _, Xa, y in view.chunks(self.chunk_size):
            for l, th in enumerate(avgs):
                totals[l] += float(self.loss.losses(th, Xa, y).sum())
        self.selected = int(np.argmin(totals))
        self._publish(avgs[self.selected])

    def _distributed_train(self, view: DatasetView) -> None:
        sz, rng = self.sizes, self._rng()
        all_steps = view.steps(self.chunk_size)
        self.slots = all_steps[rng.integers(0, len(all_steps), size=(sz.C, sz.B))].astype(np.int64)  # S ~ P^B(D)
        self.slot_partition = (np.arange(sz.B) // sz.P).astype(np.int64)  # fixed; i.i.d. slots make it uniform
        self.part_theta = np.zeros((sz.C, sz.K, self.d))
        every = np.arange(sz.K)
        for l in range(sz.C):
            self.part_theta[l] = self._train_partitions(l, every, np.zeros((sz.K, self.d)), self.T, view)
        self._select_and_publish(view)

    def reference_partitions(self, view: DatasetView) -> np.ndarray:
        """Replay reference: A on the *current* slot contents (distributed as P^B(D_i), Lemma 4.2), per copy avg."""
        sz = self.sizes
        saved = self.grad_evals
        out = np.stack([self._train_partitions(l, np.arange(sz.K), np.zeros((sz.K, self.d)), self.T, view).mean(axis=0)
                        for l in range(sz.C)])
        self.grad_evals = saved
        return out

    def _distributed_update(self, view: DatasetView, kind: str, step: int, i: int) -> None:
        sz, rng = self.sizes, self._rng()
        pool = view.steps(self.chunk_size) if kind == "delete" else None
        for l in range(sz.C):  # independent reservoir randomness per copy (pitfall 16)
            idx = reservoir_update(self.slots[l], kind, step, view.n, pool, rng)
            changed = np.unique(self.slot_partition[idx])
            if len(changed) == 0:
                continue  # pitfall 17: nothing to re-optimise; still select and publish
            iters = dm.distributed_partition_iterations(self.c, sz, self.n_epoch, self.I, i, self.spec.delta,
                                                        len(changed))
            if self.partition_iterations_cap is not None:
                iters = min(iters, self.partition_iterations_cap)
            self.part_theta[l, changed] = self._train_partitions(l, changed, self.part_theta[l, changed], iters, view)
        self._select_and_publish(view)

    # ---- rounds -------------------------------------------------------------------------------------------
    def _full_train(self, view: DatasetView) -> None:
        """A(D): a fresh fit on the current data, a new epoch (n := |D|, round := 0, m and sigma recomputed)."""
        self.epoch += 1
        self.round = 0
        self.n_epoch = self.n_current = view.n
        self.m_reg = self._regularization_for(view.n) if view.n else 0.0
        self._configure()
        if view.n == 0:
            self.theta = np.zeros(self.d)
            self.published_ = np.zeros(self.d)
            return
        if self.variant == "distributed":
            self._distributed_train(view)
            return
        theta = self.train_from_scratch(view)
        if self.variant != "perfect":
            self.theta = theta
        self._publish(theta)

    def _update(self, view: DatasetView, kind: str, step: int) -> tuple[str, int]:
        """One round of Alg. 2 (or 6).  Returns (mechanism, iterations)."""
        i = self.round + 1
        if self.hp["retrain_when_cheaper"] and self.update_cost(i, view.n) >= self.training_cost(view.n):
            self._full_train(view)
            return "exact", self.T
        self.round = i
        self.n_current = view.n
        if self.variant == "distributed":
            self._distributed_update(view, kind, step, i)
            return release.MECHANISM, 0
        iters = self.update_iterations(i)
        start = self.published_ if self.variant == "perfect" else self.theta  # Thm 3.2 vs 3.1 (pitfalls 4, 5)
        theta = self._gd(start.copy(), iters, view)
        if self.variant != "perfect":
            self.theta = theta
        self._publish(theta)
        return release.MECHANISM, iters

    def _adds_cost_more(self, k: int, held: int, n_total: int) -> bool:
        """Whether k sequential add rounds would cost at least one full training on all n_total examples."""
        budget, spent = self.training_cost(n_total), 0
        for j in range(1, k + 1):
            spent += self.update_cost(self.round + j, held + j)
            if spent >= budget:
                return True
        return False

    # ---- the contract -------------------------------------------------------------------------------------
    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64).reshape(-1, self.spec.dim)
        y = np.asarray(y, dtype=np.float64)
        k = len(y)
        steps = np.arange(self.t + 1, self.t + k + 1, dtype=np.int64)
        if k == 0:
            return steps
        retained = cached(retained, self.spec.dim)
        held = 0 if retained is None else len(retained)
        if self.n_current and retained is None:
            raise ValueError("descent_to_delete needs the retained examples to learn incrementally")
        self.t += k
        full = DatasetView(retained, (), steps, X, y)
        if self.n_epoch == 0 or (self.hp["retrain_when_cheaper"] and self._adds_cost_more(k, held, full.n)):
            self._full_train(full)  # the first fit (initial training, T iterations), or a cheaper refit
            return steps
        for j in range(k):  # one add update per example (pitfall 12)
            self._update(DatasetView(retained, (), steps[: j + 1], X[: j + 1], y[: j + 1]), "add", int(steps[j]))
        return steps

    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        if retained is None:
            raise ValueError("descent_to_delete needs the retained examples")
        retained = cached(retained, self.spec.dim)
        steps = [int(s) for s in steps]
        if len(set(steps)) != len(steps):
            raise ForgetError("a step is named twice in one forget request")
        for u in steps:
            if not 1 <= u <= self.t:
                raise ForgetError(f"step {u} was never learned by this model")
        try:
            retained.get(steps)
        except KeyError:
            raise ForgetError("some steps are not held (never learned or already forgotten)") from None
        n_after = len(retained) - len(steps)
        if 2 * n_after < self.n_epoch:  # Assumption 2.6: n_i >= n/2 (pitfall 6)
            raise CapacityExhausted(
                f"forgetting {len(steps)} record(s) would leave {n_after} < n/2 = {self.n_epoch / 2:g} examples; "
                "an exact retrain is required")
        self.n_current = len(retained)
        certs = []
        for j, u in enumerate(steps):  # sequentially, one round each
            view = DatasetView(retained, steps[: j + 1])
            mechanism, iters = self._update(view, "delete", u)
            self.n_deletions += 1
            exact = mechanism == "exact"
            rel = self.last_release
            certs.append(Certificate(
                learned_step=u, forgotten_step=self.t, deletion_index=self.n_deletions, mechanism=mechanism,
                sigma=rel.get("sigma", self.sigma), sensitivity=0.0 if exact else rel.get("sensitivity", self.sensitivity),
                rho=0.0 if exact else self.rho_update,
                details={
                    "epsilon": 0.0 if exact else self.spec.epsilon, "delta": 0.0 if exact else self.spec.delta,
                    "mechanism_delta": self.mechanism_delta, "round": float(self.round),
                    "epoch": float(self.epoch), "n_epoch": float(self.n_epoch), "n_after": float(view.n),
                    "iterations": float(iters), "gamma": self.c.gamma, "m": self.c.m, "L": self.c.L,
                    "M": self.c.M, "variant_" + self.variant: 1.0, "grid": rel.get("grid", 0.0),
                    "shift": self.sensitivity, "roundoff_floor": rel.get("roundoff_floor", 0.0),
                },
            ))
        return certs

    def retrain(self, retained: RetainedData) -> None:
        """Exact full retrain on the retained examples: a new epoch (n reset, round 0, fresh constants)."""
        self._full_train(DatasetView(cached(retained, self.spec.dim)))
