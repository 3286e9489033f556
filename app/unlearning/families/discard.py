"""Discard-and-restart baseline (digest §2.9; 001 Table 2 / 000 Table 1, "Restart"): projected OGD that
forgets by throwing everything away.

Learning is the passive family's projected OGD (``PassiveOLU.learn``: same losses, projection onto the ball K,
schedules and compiled loop).  A forget request re-initialises the model: theta <- 0 (the data-independent start
every model is created with), the schedule clock restarts (epoch-local t = 1 at the next example; adaptive p back
to p0), and nothing of the previous state is kept.  The new state is a constant, so it is identical for every
stream that agrees after the restart; the published sequence from the deletion on is *exactly* the one the same
algorithm publishes on the masked stream (whose reference run restarts at the same public time tau): trivially
(alpha, 0)-OLU, certificate mechanism "exact", sigma = rho = 0, O(d) work per deletion.

A record learned before the current epoch started (u <= epoch_start) has no influence left on the state, so its
forget is exact without a further restart (the state does not change).  Several records of the current epoch in
one request share one restart.  Regret: each epoch is a fresh OGD game, so k restarts cost O(k log T) (strongly
convex) or O(k sqrt T) (convex) (digest §3.5); everything learned before a restart is lost.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData, Unlearner
from ..maths import work_budget as wb
from ..mechanism.calibration import Checks
from ..mechanism.noise import NoiseSource
from .passive import PassiveOLU
from .passive_calibration import _COMMON_KEYS, _SCHEDULE_KEYS, regularization_lambda

DISCARD_WORDS = (
    "Every deletion discards the whole model and starts again from the same fixed initial state: what the model "
    "publishes from the deletion on is exactly what the same algorithm would have published had the record never "
    "been learned. Everything learned before the deletion is lost."
)


class DiscardAndRestart(PassiveOLU):
    algorithm = "discard_and_restart"
    accounting = "per_update"   # exact: every publication is a retrain's (rho = 0), nothing composes
    guarantee_definition = "exact unlearning (rho = 0): every deletion restarts the model"
    guarantee_words = DISCARD_WORDS

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        Unlearner.__init__(self, spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.schedule_name = hp["schedule"]
        self.reg_lambda = 0.0
        if self.schedule_name == "regularized_convex":
            self.reg_lambda = regularization_lambda(hp["horizon"], hp["max_deletions"])
        self.declare_loss(hp, extra_mu=self.reg_lambda)
        self.schedule = self._make_schedule()
        self.theta = np.zeros(spec.n_params)
        self.t = 0
        self.epoch_start = 0
        self.n_deletions = 0
        self.n_restarts = 0
        self.eta_script: Any = None
        self.last_eta = math.nan
        # PassiveOLU's Gaussian machinery is never used: no noise, no budget
        self.allocation, self.omega, self.capacity, self.n_charged, self.rho_spent = "none", 0.0, None, 0, 0.0

    @classmethod
    def allowed_keys(cls, schedule: str) -> set[str]:
        return (_COMMON_KEYS - {"allocation", "omega"}) | _SCHEDULE_KEYS[schedule]

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = super().normalize_hyperparameters(spec)  # rejects allocation / omega (not allowed keys)
        hp.pop("allocation", None)
        hp.pop("omega", None)
        return hp

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """The passive learn; a forget re-initialises the model (theta <- 0, the clock), O(p)."""
        base = super().cost(spec, batch)
        zero = wb.restart(spec.n_params, draw=False)
        return dataclasses.replace(base, forget=zero, forget_each=zero)

    def calibration_worst_case(self, checks: Checks) -> None:
        """Only the OGD part of passive OLU's worst case (loss constants, the first step eta_1 of the schedule, the
        update norm): a restart adds no noise and charges nothing, so no sigma or budget enters."""
        self.ogd_worst_case(checks)

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"theta": self.theta.copy(), "t": self.t, "n_deletions": self.n_deletions,
                               "epoch_start": self.epoch_start, "n_restarts": self.n_restarts}
        out.update(self.schedule.state())
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.theta = self.stored_theta(state)
        self.t = int(state["t"])
        self.n_deletions = int(state["n_deletions"])
        self.epoch_start = int(state["epoch_start"])
        self.n_restarts = int(state["n_restarts"])
        self.schedule.load_state(state)

    def accounting_params(self) -> None:
        return None  # no zCDP budget: every certificate is exact

    def ledger(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "rho_spent": 0.0, "rho_budget": None, "capacity_total": None,
                "capacity_left": None, "deletions": self.n_deletions, "epoch": self.n_restarts,
                "epoch_start": self.epoch_start}

    @property
    def status(self) -> str:
        return "ready"

    def constants(self) -> dict[str, float]:
        out = super().constants()
        out.pop("restart_prefix", None)  # every forget of the current epoch restarts (restart_steps)
        return out

    # ---- unlearning -------------------------------------------------------------------------------
    def restart_steps(self, steps: np.ndarray) -> tuple[int, int] | None:
        return (int(steps[0]), int(steps[-1])) if len(steps) else None  # learned in the current epoch: all

    def restart(self) -> None:
        """Discard the state: theta <- 0 (data-independent), the schedule clock restarts at the next example."""
        self.theta = np.zeros(self.spec.n_params)
        self.epoch_start = self.t
        self.schedule.reset()
        self.n_restarts += 1

    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = [int(s) for s in steps]
        self._check_steps(steps)
        tau = self.t
        certs = []
        for u in steps:
            restart = u > self.epoch_start  # learned in the current epoch: its influence is in the state
            if restart:
                self.restart()
            self.n_deletions += 1
            certs.append(Certificate(
                learned_step=u, forgotten_step=tau, deletion_index=self.n_deletions, mechanism="exact",
                sigma=0.0, sensitivity=0.0, rho=0.0,
                details={"restart": 1.0 if restart else 0.0, "epoch_start": float(self.epoch_start)}))
        return certs
