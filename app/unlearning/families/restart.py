"""Schedule-robust passive OLU with restart (000 Algorithm 3, digest §2.5).

A forget request for a record learned at (epoch-local) step u, processed after (epoch-local) step tau, is served
with passive Gaussian noise (``PassiveOLU``) when

    tau / u^2 <= c * sqrt(log tau + 2 k) / (L^2 * d * k^2.2)         (k = max_deletions, d = dim + 1 parameters; K (dim + 1) for softmax)

and the record is deletable under the epoch's schedule; otherwise the model **restarts**: the iterate is
re-drawn from a data-independent distribution (N(0, (R/2)^2/(d) I) projected onto K, drawn from the noise source),
the schedule clock restarts (local t = 1 at the next example, adaptive p back to p0), and every earlier state is
discarded.  The new state is independent of everything learned before the restart, so the restart is an exact
forget (certificate mechanism "exact", sigma = rho = 0), and so is every later forget of a record learned before
the current epoch started.  Because outputs after a restart do not depend on pre-restart data, a restart also
opens a new ledger epoch: the series index, rho_spent and (uniform allocation) the capacity start afresh; the
global deletion counter and the global step numbering keep running.  With uniform allocation an exhausted
capacity triggers a restart instead of CapacityExhausted, so this model never needs a retrain.

Inside epochs the default schedule is the paper's (000 Cor. 3.6 builds on Thm 3.4): ``regularized_convex``
uncapped, i.e. eta = 1/(lambda_eff t) on f + (lambda/2)||z||^2, lambda = sqrt(log T + 2k)/sqrt(T) (requires
``horizon``).  Early records of an epoch (u <= 1/2 + beta/(2 mu)) are then not deletable by noise, and their
forgets restart the model.  Any passive schedule may be chosen; ``capped`` defaults to false here.

The tau and u of the test are epoch-local (each epoch is an independent game of length T_e in the proof of
Cor. 3.6).  ``c`` (default 1.0) is the paper's unspecified constant: larger c restarts less often (more noise).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from ..contract.certificate import Certificate
from ..contract.errors import CapacityExhausted, SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData
from ..maths import work_budget as wb
from ..maths.domain import project_l2_ball
from ..mechanism.calibration import N_MAX
from ..mechanism.noise import NoiseSource
from .passive import GUARANTEE_WORDS, PassiveOLU
from .passive_calibration import _number

ADAPTIVE_NOTE = (
    "The adaptive step sizes depend on the norms of the training gradients; they are never published (each "
    "certificate uses their bound from declared numbers, and after a deletion they restart from their worst "
    "case), and, as in the paper, the comparison run uses the same step sizes up to the deletion."
)
RESTART_WORDS = GUARANTEE_WORDS + (
    " When a forget request would need too much noise, the model instead restarts from a fresh random state "
    "that does not depend on any earlier data: everything learned before the restart, including the record, is "
    "then forgotten exactly."
)


class PassiveOLURestart(PassiveOLU):
    algorithm = "passive_olu_restart"
    guarantee_definition = "(alpha, alpha*rho)-OLU for all alpha > 1; restarts are exact"
    guarantee_words = RESTART_WORDS

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        if self.schedule_name == "adaptive":
            self.guarantee_words = RESTART_WORDS + " " + ADAPTIVE_NOTE
        self.c = float(self.hp["c"])
        self.k_tilde = int(self.hp["max_deletions"])
        self.n_restarts = 0

    @classmethod
    def default_schedule(cls) -> str:
        return "regularized_convex"

    refuses_undeletable = False  # a record the schedule does not cover restarts the model (exact)
    restart_note = ""  # RESTART_WORDS says when the model restarts

    @classmethod
    def default_capped(cls) -> bool:
        return False

    @classmethod
    def needs_max_deletions(cls) -> bool:
        return True

    @classmethod
    def allowed_keys(cls, schedule: str) -> set[str]:
        return super().allowed_keys(schedule) | {"c"}

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = super().normalize_hyperparameters(spec)
        hp.setdefault("c", 1.0)
        c = _number(hp, "c", "a positive number")
        if not c > 0:
            raise SpecError("c must be a positive number")
        hp["c"] = c
        return hp

    def calibration_worst_case(self, checks) -> None:
        super().calibration_worst_case(checks)
        # 000 Alg. 3 line 5 at the longest epoch: c sqrt(log tau + 2k) / (L^2 d k^2.2)
        checks.finite("restart_threshold", lambda: self.restart_threshold(N_MAX), "bounds.x_norm",
                      "hyperparameters.c")

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        out = super().state()
        out["n_charged"] = self.n_charged
        out["epoch_start"] = self.epoch_start
        out["n_restarts"] = self.n_restarts
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        self.epoch_start = int(state["epoch_start"])
        self.n_restarts = int(state["n_restarts"])

    def ledger(self) -> dict[str, Any]:
        out = super().ledger()
        out["epoch"] = self.n_restarts
        out["epoch_start"] = self.epoch_start
        return out

    @property
    def status(self) -> str:
        return "ready"  # an exhausted capacity restarts the model instead

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """PassiveOLU's, but a forget is a restart (a draw of p coordinates) where no record can ever pass the restart
        test within the horizon (tau / u^2 >= 1 / tau > the threshold at tau = T): then no release is reachable."""
        base = super().cost(spec, batch)
        T = int(spec.hyperparameters.get("horizon") or N_MAX)
        try:
            reachable = T * cls(spec).restart_threshold(max(T, 2)) >= 1.0
        except (ArithmeticError, ValueError):
            reachable = True
        if reachable:
            return base
        restart = wb.restart(spec.n_params)
        return dataclasses.replace(base, forget=restart, forget_each=restart)

    # ---- the restart test -----------------------------------------------------------------------
    def restart_threshold(self, tau_local: int) -> float:
        """c sqrt(log tau + 2k) / (L^2 d k^2.2) with d = spec.n_params, dim + 1 or K (dim + 1) for softmax (000 Alg. 3, line 5)."""
        k, d = self.k_tilde, self.spec.n_params
        return self.c * math.sqrt(math.log(tau_local) + 2.0 * k) / (self.L**2 * d * k**2.2)

    def needs_restart(self, u: int, tau: int) -> bool:
        u_loc, tau_loc = u - self.epoch_start, tau - self.epoch_start
        if not self.schedule.deletable(u_loc):
            return True
        if self.capacity is not None and self.n_charged >= self.capacity:
            return True
        if self.allocation == "group":
            try:
                self.group_precheck(1)
            except CapacityExhausted:
                return True
        return tau_loc / u_loc**2 > self.restart_threshold(tau_loc)

    def restart(self) -> None:
        """Discard the state; re-draw theta from a data-independent law; restart the clock and the ledger epoch."""
        R, n = self.spec.domain_radius, self.spec.n_params
        xi = self.noise.standard_normal(n)
        super().restart()
        self.theta = project_l2_ball(xi * (0.5 * R / math.sqrt(n)), R)

    # ---- unlearning -----------------------------------------------------------------------------
    def _precheck(self, steps: list[int]) -> None:
        pass  # nothing is refused: uncovered records and an exhausted capacity restart the model

    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = [int(s) for s in steps]
        self._check_steps(steps)
        tau = self.t
        certs = []
        for u in steps:  # sequentially (P9); a restart in the middle makes the rest exact
            if u <= self.epoch_start:
                certs.append(self._exact(u, tau, restart=False))
            elif self.needs_restart(u, tau):
                self.restart()
                certs.append(self._exact(u, tau, restart=True))
            else:
                certs.append(self._gaussian_forget(u, tau))
        return certs
