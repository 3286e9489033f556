"""Passive OLU's calibration (paper 000/001 Algorithm 1; digest §2.3): the schedules and
allocations it takes, their hyperparameters, and the creation-time checks of the worst case every certificate of
the model may need (loss constants, step sizes, the last certifiable deletion's sigma, the OGD norms).  The
engine's state, learning and forgetting are in passive.py; the restart, discard and DP-tree families reuse the
hyperparameter helpers."""
from __future__ import annotations

import math
import sys
from typing import Any

from ..contract.errors import SpecError, UnderNoisedSpec
from ..contract.spec import ModelSpec
from ..contract.unlearner import Unlearner
from ..maths.losses import make_loss
from ..maths.schedules import Adaptive
from ..mechanism.calibration import (N_MAX, Checks, common_checks, construct, noise_norm_bound, release_checks,
                                     update_norm_bound)

SCHEDULES = ("strongly_convex_capped", "strongly_convex", "convex_constant", "regularized_convex", "adaptive")

ALLOCATIONS = ("omega_series", "uniform", "group")  # group: passive_group.py

# hyperparameters each schedule accepts beyond the common ones
_SCHEDULE_KEYS = {
    "strongly_convex_capped": set(),
    "strongly_convex": set(),
    "convex_constant": {"eta"},
    "regularized_convex": {"horizon", "capped"},
    "adaptive": {"p0", "capped"},
}

_COMMON_KEYS = {"schedule", "allocation", "omega", "max_deletions", "huber_delta"}


def _number(hp: dict, key: str, what: str) -> float:
    try:
        v = float(hp[key])
    except (TypeError, ValueError):
        raise SpecError(f"{key} must be {what}") from None
    if not math.isfinite(v):
        raise SpecError(f"{key} must be {what}")
    return v


def _positive_int(hp: dict, key: str, why: str) -> int:
    if key not in hp:
        raise SpecError(f"{key} is required {why}")
    v = hp[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or int(v) < 1:
        raise SpecError(f"{key} must be a positive integer")
    return int(v)


def regularization_lambda(horizon: int, max_deletions: int) -> float:
    """000 Thm 3.4: lambda = sqrt(log T + 2k) / sqrt(T)."""
    return math.sqrt(math.log(horizon) + 2.0 * max_deletions) / math.sqrt(horizon)


class PassiveCalibration(Unlearner):
    """The calibration of ``PassiveOLU``: hyperparameters per schedule and the worst-case checks at creation."""

    @classmethod
    def allowed_keys(cls, schedule: str) -> set[str]:
        return _COMMON_KEYS | _SCHEDULE_KEYS[schedule]

    @classmethod
    def default_schedule(cls) -> str:
        return "strongly_convex_capped"

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = dict(spec.hyperparameters)
        hp.setdefault("schedule", cls.default_schedule())
        if hp["schedule"] not in SCHEDULES:
            raise SpecError(f"schedule must be one of {', '.join(SCHEDULES)}")
        schedule = hp["schedule"]
        unknown = set(hp) - cls.allowed_keys(schedule)
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm} with schedule {schedule}: "
                            f"{', '.join(sorted(unknown))}")
        hp.setdefault("allocation", "omega_series")
        if hp["allocation"] not in ALLOCATIONS:
            raise SpecError(f"allocation must be one of {', '.join(ALLOCATIONS)}")
        if hp["allocation"] == "omega_series":
            hp.setdefault("omega", 1.5 if schedule == "adaptive" else 1.2)  # the proofs' choices
            omega = _number(hp, "omega", "a number > 1")
            if not omega > 1.0:
                raise SpecError("omega must be a number > 1")
            hp["omega"] = omega
        elif "omega" in hp:
            raise SpecError("omega applies only to allocation omega_series")
        needed_by = [why for why, needed in (("allocation uniform", hp["allocation"] == "uniform"),
                                             ("schedule regularized_convex", schedule == "regularized_convex"),
                                             (cls.algorithm, cls.needs_max_deletions())) if needed]
        if needed_by:
            hp["max_deletions"] = _positive_int(hp, "max_deletions", "for " + " and ".join(needed_by))
        elif "max_deletions" in hp:
            hp["max_deletions"] = _positive_int(hp, "max_deletions", "")
        if schedule == "regularized_convex":
            hp["horizon"] = _positive_int(hp, "horizon", "for schedule regularized_convex")
            if hp["horizon"] < 2:
                raise SpecError("horizon must be at least 2")
        if schedule in ("regularized_convex", "adaptive"):
            hp.setdefault("capped", cls.default_capped())
            if not isinstance(hp["capped"], bool):
                raise SpecError("capped must be true or false")
        if spec.loss == "huber":
            hp.setdefault("huber_delta", 1.0)
        if schedule in ("strongly_convex_capped", "strongly_convex"):
            if not spec.l2 > 0:
                raise SpecError(f"schedule {schedule} needs l2 > 0 (strong convexity mu = l2)")
        elif not spec.l2 >= 0:
            raise SpecError("l2 must be >= 0")
        if schedule in ("convex_constant", "adaptive"):  # defaults resolved against the public constants
            loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
            if schedule == "convex_constant":
                if hp.get("eta") is None:
                    hp["eta"] = 1.0 / loss.smoothness
                eta = _number(hp, "eta", "a positive number <= 2/beta")
                if not 0.0 < eta <= 2.0 / loss.smoothness:
                    raise SpecError(f"eta must satisfy 0 < eta <= 2/beta = {2.0 / loss.smoothness:.6g} "
                                    "(non-expansive steps, 001 Cor. 1)")
                hp["eta"] = eta
            else:
                if hp.get("p0") is None:
                    hp["p0"] = loss.lipschitz**2
                p0 = _number(hp, "p0", "a positive number")
                if not p0 > 0:
                    raise SpecError("p0 must be a positive number (pitfall P11: p(0) = 0 gives an infinite step)")
                hp["p0"] = p0
                least = (loss.smoothness * spec.domain_radius) ** 2  # beta^2 D^2 / 4 with D = 2R (digest §2.4(d))
                if cls.refuses_undeletable and not hp["capped"] and p0 < least * (1.0 - 1e-12):
                    raise UnderNoisedSpec(
                        f"p0 = {p0:.6g} is refused with capped = false: below beta^2 D^2/4 = {least:.6g} whether a "
                        "record can be forgotten depends on the training gradients (the adaptive step sizes, which "
                        "are not published), so no forget could be certified; use capped = true or p0 >= "
                        f"{least:.6g}", hp)
        return hp

    @classmethod
    def needs_max_deletions(cls) -> bool:
        return False

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """The worst case of Alg. 1 (000): the first (largest) step eta_1 of the schedule, the largest shift
        a = eta_u L (Gamma <= 1 on every deletable step), the sigma of the last deletion the ledger certifies
        (i = max_deletions, or i = N_MAX for the unbounded omega series) and the norms these put into theta."""
        checks = Checks(cls.algorithm)
        eng = construct(cls, spec)
        eng.calibration_worst_case(checks)

    def calibration_worst_case(self, checks: Checks) -> None:
        spec, R = self.spec, self.spec.domain_radius
        eps = ("privacy.epsilon", "privacy.delta")
        checks.finite("rho", spec.rho, *eps, positive=True)
        a_max = self.ogd_worst_case(checks)
        checks.finite("a_max", a_max, "bounds.x_norm", "l2", positive=True)
        # the first deletion has the smallest sigma: a normal float, so that a / sigma keeps its precision and the
        # certified rho matches the ledger's allowance (app.privacy.ledger)
        sigma_1 = checks.finite("sigma(1)", lambda: self.noise_multiplier(1) * a_max, *eps, "bounds.x_norm", "l2")
        checks.finite("sigma(1)", sigma_1 if sigma_1 >= sys.float_info.min else 0.0, *eps, "bounds.x_norm",
                      "domain_radius", positive=True)
        last = self.capacity if self.capacity is not None else N_MAX
        mult = checks.finite("noise_multiplier(last)", lambda: self.noise_multiplier(last), *eps, positive=True)
        sigma = checks.squared("sigma(last)", mult * a_max, *eps, "bounds.x_norm", "l2", positive=True)
        checks.squared("noise_norm", noise_norm_bound(R, sigma, spec.n_params), *eps, "bounds.x_norm", "domain_radius")
        # the discrete release (release.py) must draw within int64: at the last deletion of a bounded capacity; the
        # unbounded omega series checks its first deletion here and refuses later ones at runtime (_precheck)
        if self.capacity is None:
            release_checks(checks, self.noise_multiplier(1), spec.n_params, *eps, "hyperparameters.omega")
        else:
            release_checks(checks, mult, spec.n_params, *eps, "hyperparameters.max_deletions")

    def ogd_worst_case(self, checks: Checks) -> float:
        """Loss constants, the first (largest) step of the schedule and the update norm it puts into theta;
        returns the largest shift a = eta_u L a deletable step can have."""
        spec, R = self.spec, self.spec.domain_radius
        common_checks(checks, self.loss, spec)
        hp_eta = ("hyperparameters.eta",) if self.schedule_name == "convex_constant" else ()
        if isinstance(self.schedule, Adaptive):
            p0 = ("hyperparameters.p0",)
            eta_first = checks.finite("eta_1", self.schedule.current_eta, *p0, "domain_radius", positive=True)
            # a deletable step has eta_u <= 2/beta (capped, or the uncapped rule); a learning step is at most D
            # long, since eta_t ||g_t|| = D ||g_t|| / sqrt(p0 + sum ||g||^2) <= D
            a_max = checks.squared("a_max", min(eta_first, self.schedule.cap) * self.L, "bounds.x_norm", *p0)
            step = 2.0 * R
            checks.finite("p(N_MAX)", self.schedule.p0 + N_MAX * self.L**2, *p0, "bounds.x_norm")
        else:
            eta_first = checks.finite("eta_1", lambda: self.schedule.eta(1), "l2", "bounds.x_norm", *hp_eta,
                                      positive=True)
            a_max = step = checks.squared("a_max", eta_first * self.L, "bounds.x_norm", "l2", "domain_radius", *hp_eta)
        checks.squared("update_norm", update_norm_bound(R, step), "domain_radius", "bounds.x_norm", "l2")
        return a_max

    @classmethod
    def default_capped(cls) -> bool:
        return True
