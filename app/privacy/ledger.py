"""Per-model privacy ledger: accounting modes with one shape, so the service never branches on algorithm names.

Every mode is an immutable *policy* (built from the model spec, persisted with ``params()``) acting on an
immutable ``LedgerState`` (persisted with ``LedgerState.as_dict()``):

    acct = accounting_from_params(spec_params)          # or OmegaSeries(...), PerUpdate(...), Capacity(...)
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

from .conversions import (_check_conversion, _check_delta, add_up, epsilon_from_rho,
                          rho_from_epsilon_delta)

__all__ = [
    "ACCOUNTING_MODES",
    "Accounting",
    "BudgetExhausted",
    "Capacity",
    "Charge",
    "ChargeMismatch",
    "LedgerState",
    "LedgerSummary",
    "OmegaSeries",
    "PerUpdate",
    "accounting_from_params",
    "capacity_step",
    "fits",
    "ledger_summary",
    "omega_charge",
]

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


class _BudgetMode(Accounting):
    """Shared by omega_series and capacity: a zCDP budget, charges add up, epsilon from CKS20 of rho_spent."""
    _rho_budget: float

    @property
    def rho_budget(self) -> float:
        return self._rho_budget

    @abstractmethod
    def _allowance(self, i: int) -> float: ...

    def next_charge(self, state: LedgerState) -> Charge:
        i = state.charges + 1
        cap = self.capacity_total
        spent = 0.0 if state.rho_spent is None else state.rho_spent
        if cap is not None and i > cap:
            raise BudgetExhausted(self.accounting, i, spent, self._rho_budget, f"capacity {cap} used up")
        rho = self._allowance(i)
        if not (rho > 0.0):
            raise BudgetExhausted(self.accounting, i, spent, self._rho_budget, "charge underflows to 0")
        if not fits(spent, rho, self._rho_budget):
            raise BudgetExhausted(self.accounting, i, spent, self._rho_budget,
                                  f"rho_spent {spent!r} + {rho!r} > rho_budget {self._rho_budget!r}")
        return Charge(index=i, rho=rho)

    def _after(self, state: LedgerState, recorded: float | None) -> LedgerState:
        spent = 0.0 if state.rho_spent is None else state.rho_spent
        return LedgerState(rho_spent=add_up(spent, recorded or 0.0), charges=state.charges + 1,
                           epoch=state.epoch)

    def _epsilon(self, state: LedgerState) -> float:
        return epsilon_from_rho(state.rho_spent or 0.0, self.delta, self.conversion)

    def _details(self, state: LedgerState) -> dict[str, Any]:
        return {"epsilon_budget": epsilon_from_rho(self._rho_budget, self.delta, self.conversion)}


class OmegaSeries(_BudgetMode):
    """omega_series accounting (000 §2.3 / §6).  ``cap=None``: omega-series allocation, unlimited deletions;
    ``cap=k``: uniform allocation rho_budget / k, deletion k + 1 refused."""
    accounting = "omega_series"

    def __init__(self, rho_budget: float, delta: float, omega: float = 1.2, cap: int | None = None,
                 conversion: str = "cks20") -> None:
        self._rho_budget = _check_positive(rho_budget, "rho_budget")
        self.delta = _check_delta(delta)
        self.omega = float(omega)
        if not (self.omega > 1.0) or math.isinf(self.omega):
            raise ValueError(f"omega must be finite and > 1, got {omega!r}")
        self.cap = None if cap is None else _check_count(cap, "cap")
        self.conversion = _check_conversion(conversion)
        self._uniform = None if self.cap is None else capacity_step(self._rho_budget, self.cap)

    @classmethod
    def from_target(cls, epsilon: float, delta: float, conversion: str = "cks20", **kw: Any) -> "OmegaSeries":
        """Calibrate rho_budget from an (epsilon, delta) target (largest rho certifying it)."""
        return cls(rho_from_epsilon_delta(epsilon, delta, conversion), delta, conversion=conversion, **kw)

    @property
    def allocation(self) -> str:
        return "omega" if self.cap is None else "uniform"

    @property
    def capacity_total(self) -> int | None:
        return self.cap

    def capacity_left(self, state: LedgerState) -> int | None:
        return None if self.cap is None else max(self.cap - state.charges, 0)

    def _allowance(self, i: int) -> float:
        if self._uniform is not None:
            return self._uniform
        return omega_charge(self._rho_budget, self.omega, i)

    def _details(self, state: LedgerState) -> dict[str, Any]:
        return {**super()._details(state), "allocation": self.allocation, "omega": self.omega}

    def params(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "rho_budget": self._rho_budget, "delta": self.delta,
                "omega": self.omega, "cap": self.cap, "conversion": self.conversion}


class Capacity(_BudgetMode):
    """capacity accounting (003 memory pair odometer): rho_step = rho_tot / m, refuse once
    rho_spent + rho_step > rho_tot."""
    accounting = "capacity"

    def __init__(self, rho_total: float, capacity: int, delta: float, conversion: str = "cks20") -> None:
        self._rho_budget = _check_positive(rho_total, "rho_total")
        self.m = _check_count(capacity, "capacity")
        self.delta = _check_delta(delta)
        self.conversion = _check_conversion(conversion)
        self.rho_step = capacity_step(self._rho_budget, self.m)

    @classmethod
    def from_target(cls, epsilon: float, delta: float, capacity: int, conversion: str = "cks20") -> "Capacity":
        return cls(rho_from_epsilon_delta(epsilon, delta, conversion), capacity, delta, conversion)

    @property
    def capacity_total(self) -> int:
        return self.m

    def capacity_left(self, state: LedgerState) -> int:
        # Recorded charges never exceed rho_step, so the count is the binding limit; the odometer check
        # guards against a state whose rho_spent does not match its count.
        left = max(self.m - state.charges, 0)
        if left and not fits(state.rho_spent or 0.0, self.rho_step, self._rho_budget):
            return 0
        return left

    def _allowance(self, i: int) -> float:
        return self.rho_step

    def _details(self, state: LedgerState) -> dict[str, Any]:
        return {**super()._details(state), "rho_step": self.rho_step}

    def params(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "rho_total": self._rho_budget, "capacity": self.m,
                "delta": self.delta, "conversion": self.conversion}


class PerUpdate(Accounting):
    """per_update accounting (002, 004): each update's published output is (epsilon, delta)-indistinguishable
    from a retrain's; no composition across updates.  Give ``rho`` (Gaussian publication of a deterministic
    state within sensitivity Delta: rho = Delta^2 / (2 sigma^2), 002 Lemma A.3) or ``epsilon`` (a mechanism
    stated directly in (epsilon, delta), e.g. 004's relaxed Gaussian; then ``delta`` is the certified total,
    2 delta in 004's notation).  ``capacity``: optional cap on deletions (004 m_max; 002 n_i >= n/2).
    ``variant``: "secret_state" (guarantee covers published outputs only) or "perfect" (002 Thm 3.2: the whole
    persisted state).

    ``rho`` is only a zCDP statement when the distance to the retrain is bounded *deterministically*
    (002 Thms 3.1, 3.4, 3.5).  When the bound holds only with probability 1 - delta_tail (002 Thm 3.2: delta/2
    for the conditioning of Lemma A.1, delta/2 for the Gaussian), pass ``delta_tail``: the reported epsilon is
    then the conversion of rho at delta - delta_tail, so that the total is (epsilon, delta).  The perfect
    variant with ``rho`` therefore requires delta_tail > 0."""
    accounting = "per_update"
    VARIANTS = ("secret_state", "perfect")

    def __init__(self, delta: float, rho: float | None = None, epsilon: float | None = None,
                 capacity: int | None = None, variant: str = "secret_state", conversion: str = "cks20",
                 delta_tail: float = 0.0) -> None:
        self.delta = _check_delta(delta)
        if (rho is None) == (epsilon is None):
            raise ValueError("give exactly one of rho (zCDP per update) or epsilon (direct (eps, delta))")
        self.delta_tail = float(delta_tail)
        if not (0.0 <= self.delta_tail < self.delta):
            raise ValueError(f"delta_tail must be in [0, delta), got {delta_tail!r}")
        if epsilon is not None and self.delta_tail != 0.0:
            raise ValueError("delta_tail applies to rho statements; a direct (epsilon, delta) already includes it")
        if rho is not None and variant == "perfect" and self.delta_tail == 0.0:
            raise ValueError("the perfect variant's bound holds w.p. 1 - delta/2 (002 Thm 3.2): give delta_tail")
        self.rho = None if rho is None else _check_positive(rho, "rho")
        if epsilon is not None:
            epsilon = float(epsilon)
            if not (epsilon >= 0.0) or math.isinf(epsilon):
                raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
        self._stated_epsilon = epsilon
        self.m = None if capacity is None else _check_count(capacity, "capacity")
        if variant not in self.VARIANTS:
            raise ValueError(f"variant must be one of {self.VARIANTS}, got {variant!r}")
        self.variant = variant
        # a direct (epsilon, delta) statement involves no conversion
        self.conversion = _check_conversion(conversion) if self.rho is not None else "none"
        # delta left for the conversion, rounded down (a smaller delta gives a larger, safe epsilon)
        self.delta_conversion = (self.delta if self.delta_tail == 0.0
                                 else math.nextafter(self.delta - self.delta_tail, 0.0))
        self.round_epsilon = (epsilon_from_rho(self.rho, self.delta_conversion, self.conversion)
                              if self.rho is not None else epsilon)

    @property
    def rho_budget(self) -> None:
        return None

    @property
    def capacity_total(self) -> int | None:
        return self.m

    def capacity_left(self, state: LedgerState) -> int | None:
        return None if self.m is None else max(self.m - state.charges, 0)

    def next_charge(self, state: LedgerState) -> Charge:
        i = state.charges + 1
        if self.m is not None and i > self.m:
            raise BudgetExhausted(self.accounting, i, state.rho_spent, None, f"capacity {self.m} used up")
        return Charge(index=i, rho=self.rho, epsilon=self.round_epsilon, delta=self.delta)

    def _after(self, state: LedgerState, recorded: float | None) -> LedgerState:
        # not added: the guarantee of the current publication is the per-round one (002 Def. 2.4)
        return LedgerState(rho_spent=recorded, charges=state.charges + 1, epoch=state.epoch)

    def _epsilon(self, state: LedgerState) -> float:
        if state.charges == 0:
            return 0.0     # the publication before any update *is* a retrain's output
        if state.rho_spent is not None:
            return epsilon_from_rho(state.rho_spent, self.delta_conversion, self.conversion)
        assert self.round_epsilon is not None
        return self.round_epsilon

    def _details(self, state: LedgerState) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "scope": "persisted_state" if self.variant == "perfect" else "published_outputs",
            "composition": "none: per-round guarantee on the current publication (002 Def. 2.4)",
            "delta_tail": self.delta_tail,
        }

    def params(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "delta": self.delta, "rho": self.rho,
                "epsilon": self._stated_epsilon, "capacity": self.m, "variant": self.variant,
                "conversion": self.conversion if self.rho is not None else "cks20", "delta_tail": self.delta_tail}


ACCOUNTING_MODES: dict[str, type[Accounting]] = {
    OmegaSeries.accounting: OmegaSeries,
    PerUpdate.accounting: PerUpdate,
    Capacity.accounting: Capacity,
}


def accounting_from_params(params: Mapping[str, Any]) -> Accounting:
    """Rebuild a policy from ``params()`` output (the only place a mode name is looked up)."""
    p = dict(params)
    name = p.pop("accounting", None)
    if name not in ACCOUNTING_MODES:
        raise ValueError(f"unknown accounting {name!r}; expected one of {tuple(ACCOUNTING_MODES)}")
    return ACCOUNTING_MODES[name](**p)


def ledger_summary(accounting: Accounting | Mapping[str, Any], state: LedgerState | Mapping[str, Any]
                   ) -> dict[str, Any]:
    """API Ledger fields (minus model_id / epoch-entries, which the service owns) from a policy and a state."""
    acct = accounting if isinstance(accounting, Accounting) else accounting_from_params(accounting)
    st = state if isinstance(state, LedgerState) else LedgerState.from_dict(state)
    return acct.summary(st).as_dict()
