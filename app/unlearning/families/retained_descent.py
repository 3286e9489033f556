"""What the families that descend on retained data at a deletion share (active_olu, second_order_olu; paper 000
Alg. 2): their schedule, omega and GD-step-cap hyperparameters, and the omega-series noise and charge."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..contract.errors import SpecError

SCHEDULES = ("strongly_convex_capped",)

DEFAULT_MAX_GD_STEPS = 2000


def normalize_descent_hyperparameters(hp: dict[str, Any]) -> None:
    """Defaults and checks shared by the families that descend on retained data at a deletion (active_olu,
    second_order_olu): the strongly convex capped OGD schedule, the omega series and the GD step cap."""
    hp.setdefault("schedule", "strongly_convex_capped")
    if hp["schedule"] not in SCHEDULES:
        raise SpecError(f"schedule must be one of {', '.join(SCHEDULES)}")
    hp.setdefault("omega", 1.2)
    try:
        omega = float(hp["omega"])
    except (TypeError, ValueError):
        raise SpecError("omega must be a number > 1") from None
    if not (omega > 1.0 and math.isfinite(omega)):
        raise SpecError("omega must be a number > 1")
    hp["omega"] = omega
    hp.setdefault("max_gd_steps", DEFAULT_MAX_GD_STEPS)
    m = hp["max_gd_steps"]
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 0 <= int(m) <= 1_000_000:
        raise SpecError("max_gd_steps must be an integer in [0, 1000000]")
    hp["max_gd_steps"] = int(m)


class OmegaSeriesCharges:
    """The omega-series noise and charge of the families that descend on retained data at a deletion (active_olu,
    second_order_olu); needs ``self.omega`` and ``self.spec.rho``."""

    def noise_multiplier(self, i: int) -> float:
        """sqrt(omega i^omega / (2 (omega - 1) rho)): 000 Alg. 2 line 13 (with omega i^omega, P12)."""
        w = self.omega
        return math.sqrt(w * i**w / (2.0 * (w - 1.0) * self.spec.rho))

    def charge(self, i: int) -> float:
        """The omega-series charge a_i^2/(2 sigma_i^2) = rho (omega - 1)/(omega i^omega)."""
        w = self.omega
        return self.spec.rho * (w - 1.0) / (w * i**w)
