"""What an unlearning step certifies, in public numbers only."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Certificate:
    learned_step: int          # u: the step that consumed the example
    forgotten_step: int        # tau: the step after which the forget was applied
    deletion_index: int        # i: global, 1-based deletion counter of the model (000 §2.3, pitfall P8)
    mechanism: str             # "gaussian" (noise into the state) or "exact" (restart / retrain)
    sigma: float               # per-coordinate noise standard deviation (0 for exact)
    sensitivity: float         # a_i: certified bound on the shift the example can still cause
    rho: float                 # Renyi charge per order: D_alpha <= alpha * rho  (a^2 / (2 sigma^2))
    details: Mapping[str, float] = field(default_factory=dict)  # public intermediates (Delta_u, Gamma, ...)
