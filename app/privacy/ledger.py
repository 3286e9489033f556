"""Per-model privacy ledger: accounting modes with one shape, so the service never branches on algorithm names.

Every mode is an immutable *policy* (built from the model spec, persisted with ``params()``) acting on an
immutable ``LedgerState`` (persisted with ``LedgerState.as_dict()``):

    acct = accounting_from_params(spec_params)          # modes.py: or OmegaSeries(...), PerUpdate(...), ...
    charge = acct.next_charge(state)                      # what the next forget may spend; BudgetExhausted if none
    ... engine forgets, calibrated to charge.rho (sigma = Delta / sqrt(2 rho), see conversions.sigma_for_rho)
    state, charge = acct.spend(state, certified_rho=cert.rho, index=cert.deletion_index)
    acct.summary(state).as_dict()                         # the API's Ledger fields

Modes (API.md "Ledger.accounting"):

* ``omega_series`` -- passive / active OLU (000 §2.3 and §6; 001).  The i-th deletion (1-based, global within
  the epoch, pitfall P8) may spend rho_i = rho_budget (omega-1) / (omega i^omega).  Because
  sum_{i>=1} i^-omega <= omega/(omega-1) (000 Lemma B.3, proof of Thm 3.1) the running total stays below
  rho_budget for *any* number of deletions: no cap is needed.  With a known cap k~ the same proof allows the
  uniform allocation rho_i = rho_budget / k~ (000 §6 [eng]); deletion k~ + 1 is refused.
* ``per_update`` -- descent-to-delete (002 Def. 2.4, Thms 3.1-3.5, 4.5) and SGD rewind/descend-to-delete
  (004 Thms 2-4).  Each update's *published* output is (epsilon, delta)-indistinguishable from the published
  output of a retrain on the current data set.  The guarantee is per round, on the marginal distribution of
  the current publication; the papers make no statement about the joint view of several publications and there
  is no composition across updates (002 §1.4, Remark 2.5).  So the ledger does not add charges: it reports the
  per-round guarantee of the current publication (0 before any update), plus an optional deletion capacity
  (004: m_max fixed at training; 002: n_i >= n/2, pitfall 6).  For the secret-state variants the statement
  covers published models only -- the secret state is not indistinguishable (002 Remark 2.5); the perfect
  variant (Thm 3.2) covers the whole persisted state.  Mechanisms stated directly in (epsilon, delta) (004's
  relaxed Gaussian, Lemma 12: Markov tail + Gaussian) have no zCDP form; their rho is ``None``.
* ``capacity`` -- memory pair (003): uniform split rho_step = rho_tot / m over capacity m with an odometer;
  a deletion is refused once rho_spent + rho_step > rho_tot (003 "privacy odometer").

Epochs: zCDP charges compose by addition (``conversions.compose``) within an epoch.  An exact retrain on the
retained data produces a state that depends on no forgotten record, so it starts a new epoch with a fresh
ledger (``LedgerState.new_epoch``; 002 pitfall 10).  Nothing else may reset the ledger or the deletion index
(000 pitfall P8).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Mapping

from .conversions import (add_up)

__all__ = [
    "Accounting",
    "BudgetExhausted",
    "Charge",
    "ChargeMismatch",
    "LedgerState",
    "LedgerSummary",
    "capacity_step",
    "fits",
    "omega_charge",
]
# The modes themselves (OmegaSeries, Capacity, PerUpdate), ACCOUNTING_MODES, accounting_from_params and
# ledger_summary are in modes.py; this module holds what they share: the state, the charge, the errors, the base.

_U = 2.0 ** -52
# Engines recompute rho = a^2 / (2 sigma^2) from the sigma they calibrated to the allowance; that float
# round trip may exceed the allowance by a few ulps.  Within this relative tolerance the certified rho is
# treated as equal to the allowance (and the allowance is recorded); beyond it the charge is refused.
CERTIFIED_RHO_RTOL = 1e-9
MAX_CAPACITY = 10_000_000   # capacity_step's rounding argument needs m^2 << 2^51


# ----------------------------------------------------------------------------------------------------------
# errors and value objects
# ----------------------------------------------------------------------------------------------------------
class BudgetExhausted(Exception):
    """The next charge does not fit (API problem type ``deletion-capacity-exhausted``)."""

    def __init__(self, accounting: str, index: int, rho_spent: float | None, rho_budget: float | None,
                 reason: str) -> None:
        self.accounting, self.index, self.rho_spent, self.rho_budget, self.reason = (
            accounting, index, rho_spent, rho_budget, reason)
        super().__init__(f"{accounting}: charge {index} refused: {reason}")


class ChargeMismatch(ValueError):
    """The engine's certificate disagrees with the ledger (rho above the allowance, or index drift)."""


@dataclass(frozen=True)
class LedgerState:
    """Persisted ledger state of one model.

    rho_spent: omega_series / capacity: the zCDP total of this epoch (sum of recorded charges, rounded up);
               per_update: the per-round rho of the current publication (None if the mechanism has no
               zCDP statement).
    charges:   events charged in this epoch (the deletion index i of the last one).
    """
    rho_spent: float | None = 0.0
    charges: int = 0
    epoch: int = 0

    def new_epoch(self) -> "LedgerState":
        """Fresh ledger after an exact retrain on retained data (the only legitimate reset)."""
        return LedgerState(rho_spent=0.0, charges=0, epoch=self.epoch + 1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LedgerState":
        rho = d.get("rho_spent", 0.0)
        return cls(rho_spent=None if rho is None else float(rho), charges=int(d.get("charges", 0)),
                   epoch=int(d.get("epoch", 0)))


@dataclass(frozen=True)
class Charge:
    index: int                     # 1-based event index within the epoch
    rho: float | None              # zCDP charge (allowance before spending; recorded charge after)
    epsilon: float | None = None   # per_update: the per-round (epsilon, delta) statement
    delta: float | None = None


@dataclass(frozen=True)
class LedgerSummary:
    """The API's Ledger fields (API.md "Ledger"), plus bookkeeping extras (allowed: fields may be added)."""
    accounting: str
    rho_spent: float | None
    rho_budget: float | None
    epsilon: float
    delta: float
    conversion: str
    capacity_total: int | None
    capacity_left: int | None
    charges: int = 0
    epoch: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["details"] = dict(self.details)
        return d


# ----------------------------------------------------------------------------------------------------------
# float-safe arithmetic shared by the modes
# ----------------------------------------------------------------------------------------------------------
def fits(rho_spent: float, rho_charge: float, rho_budget: float) -> bool:
    """Does rho_spent + rho_charge stay within rho_budget?  The sum is rounded *up* (never under-counted) and
    compared exactly; the step sizes are rounded down (capacity_step, omega_charge) so that an exact budget
    split is not refused early by rounding."""
    return add_up(rho_spent, rho_charge) <= rho_budget


def capacity_step(rho_total: float, m: int) -> float:
    """rho_step = rho_total / m rounded down so that m float additions (each rounded up) stay <= rho_total.

    Each of the m additions errs by at most one ulp of a partial sum <= rho_total, i.e. <= 2^-52 rho_total,
    so shrinking the step by (2m + 4) 2^-52 (relative) absorbs them; m + 1 steps still exceed rho_total while
    1/m >> 2m 2^-52, which MAX_CAPACITY guarantees.  (003: rho_step = rho_tot / m.)
    """
    _check_count(m, "capacity")
    step = (rho_total / m) * (1.0 - (2 * m + 4) * _U)
    return math.nextafter(step, 0.0)


def omega_charge(rho_budget: float, omega: float, i: int) -> float:
    """Allowance of the i-th deletion: rho_budget (omega-1) / (omega i^omega) (000 §2.3 / §6), rounded down."""
    if i < 1:
        raise ValueError("deletion index is 1-based")
    val = rho_budget * ((omega - 1.0) / omega) * math.exp(-omega * math.log(i))
    for _ in range(4):
        val = math.nextafter(val, 0.0)
    return val


def _check_count(m: Any, name: str) -> int:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1 or m > MAX_CAPACITY:
        raise ValueError(f"{name} must be an integer in [1, {MAX_CAPACITY}], got {m!r}")
    return m


def _check_positive(x: Any, name: str) -> float:
    x = float(x)
    if not (x > 0.0) or math.isinf(x):
        raise ValueError(f"{name} must be finite and > 0, got {x!r}")
    return x


# ----------------------------------------------------------------------------------------------------------
# the common shape
# ----------------------------------------------------------------------------------------------------------
class Accounting(ABC):
    accounting: ClassVar[str]
    # whether the charges add up (a zCDP budget), or the ledger keeps only the current publication's guarantee
    additive: ClassVar[bool] = True
    delta: float
    conversion: str

    # --- what a mode defines ---
    @property
    @abstractmethod
    def rho_budget(self) -> float | None: ...

    @property
    @abstractmethod
    def capacity_total(self) -> int | None: ...

    @abstractmethod
    def capacity_left(self, state: LedgerState) -> int | None: ...

    @abstractmethod
    def next_charge(self, state: LedgerState) -> Charge:
        """The allowance of the next event; raises BudgetExhausted if it does not fit."""

    @abstractmethod
    def _after(self, state: LedgerState, recorded: float | None) -> LedgerState: ...

    @abstractmethod
    def _epsilon(self, state: LedgerState) -> float: ...

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """JSON-serialisable constructor arguments, including ``accounting``."""

    def _details(self, state: LedgerState) -> dict[str, Any]:
        return {}

    # --- shared behaviour ---
    def can_charge(self, state: LedgerState) -> bool:
        try:
            self.next_charge(state)
        except BudgetExhausted:
            return False
        return True

    def spend(self, state: LedgerState, certified_rho: float | None = None,
              index: int | None = None) -> tuple[LedgerState, Charge]:
        """Record one event.  ``certified_rho`` is the engine certificate's rho (checked against the
        allowance); ``index`` its deletion index (checked against the ledger's).  Returns the new state and
        the recorded charge.  Raises BudgetExhausted or ChargeMismatch and then changes nothing."""
        allowance = self.next_charge(state)
        if index is not None and index != allowance.index:
            raise ChargeMismatch(f"engine deletion index {index} != ledger index {allowance.index}")
        recorded = allowance.rho
        if certified_rho is not None:
            c = float(certified_rho)
            if math.isnan(c) or c < 0.0:
                raise ChargeMismatch(f"certified rho must be >= 0, got {certified_rho!r}")
            if allowance.rho is None:
                raise ChargeMismatch("this mechanism has no zCDP statement; a certified rho is unexpected")
            if c > allowance.rho * (1.0 + CERTIFIED_RHO_RTOL):
                raise ChargeMismatch(f"certified rho {c!r} exceeds the allowance {allowance.rho!r}")
            # more noise than allowed (e.g. an exact restart with rho = 0) is recorded as what it is
            recorded = min(c, allowance.rho)
        new = self._after(state, recorded)
        return new, Charge(index=allowance.index, rho=recorded, epsilon=allowance.epsilon,
                           delta=allowance.delta)

    def summary(self, state: LedgerState) -> LedgerSummary:
        return LedgerSummary(
            accounting=self.accounting,
            rho_spent=state.rho_spent,
            rho_budget=self.rho_budget,
            epsilon=self._epsilon(state),
            delta=self.delta,
            conversion=self.conversion,
            capacity_total=self.capacity_total,
            capacity_left=self.capacity_left(state),
            charges=state.charges,
            epoch=state.epoch,
            details=self._details(state),
        )
