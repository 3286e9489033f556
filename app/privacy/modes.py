"""The accounting modes (ledger.py's module docstring describes them): omega_series and capacity share a zCDP
budget (``_BudgetMode``); per_update reports the per-round guarantee of the current publication.  The registry of
modes by name (``ACCOUNTING_MODES``) and ``accounting_from_params`` are the only place a mode name is looked up."""
from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, Mapping

from .conversions import _check_conversion, _check_delta, add_up, epsilon_from_rho, rho_from_epsilon_delta
from .ledger import (Accounting, BudgetExhausted, Charge, LedgerState,
                     _check_count, _check_positive, capacity_step, fits, omega_charge)

__all__ = ["ACCOUNTING_MODES", "Capacity", "OmegaSeries", "PerUpdate", "accounting_from_params", "ledger_summary"]


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
    additive = False  # the guarantee of the current publication: charges are not added (receipts neither)
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
