"""What an unlearning step certifies, in public numbers only."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

_NO_DETAILS = object()


@dataclass(frozen=True, init=False)
class Certificate:
    learned_step: int          # u: the step that consumed the example
    forgotten_step: int        # tau: the step after which the forget was applied
    deletion_index: int        # i: global, 1-based deletion counter of the model (000 §2.3, pitfall P8)
    mechanism: str             # "discrete_gaussian" (lattice noise into the state, release.py) or "exact"
    sigma: float               # per-coordinate scale sigma' of the noise drawn (0 for exact); details["grid"] = g
    sensitivity: float         # a_i' = a_i + g sqrt(d+1): bound on the released lattice points' distance
    rho: float                 # Renyi charge per order: D_alpha <= alpha * rho  (a^2 / (2 sigma^2))
    details: Mapping[str, float] = field(default_factory=dict)  # public intermediates (Delta_u, Gamma, ...)

    def __init__(self, learned_step: int, forgotten_step: int, deletion_index: int, mechanism: str, sigma: float,
                 sensitivity: float, rho: float,
                 details: Mapping[str, float] = _NO_DETAILS):  # type: ignore[assignment]
        # Same signature and result as the frozen dataclass's generated __init__, which calls object.__setattr__
        # once per field (~2 us, a fifth of a passive forget); the instance dict is filled directly instead.
        d = self.__dict__
        d["learned_step"] = learned_step
        d["forgotten_step"] = forgotten_step
        d["deletion_index"] = deletion_index
        d["mechanism"] = mechanism
        d["sigma"] = sigma
        d["sensitivity"] = sensitivity
        d["rho"] = rho
        d["details"] = {} if details is _NO_DETAILS else details


def exact_retrain_certificates(steps: Sequence[int], forgotten_step: int, deletions_before: int,
                               details: Mapping[str, float]) -> list[Certificate]:
    """One exact certificate (sigma = sensitivity = rho = 0) per forgotten step after a retrain without them: the
    new state is the comparator itself.  The first carries ``restart`` (a new ledger epoch), every one ``retrain``,
    and deletion indices continue from ``deletions_before``."""
    return [Certificate(learned_step=u, forgotten_step=forgotten_step, deletion_index=deletions_before + j + 1,
                        mechanism="exact", sigma=0.0, sensitivity=0.0, rho=0.0,
                        details={"restart": 1.0 if j == 0 else 0.0, "retrain": 1.0, **details})
            for j, u in enumerate(steps)]

