"""Ledger maths: zCDP composition, conversion to (epsilon, delta) (CKS20 / classic), accounting modes.

Pure Python + scipy; no I/O and no imports from the rest of the project.
"""
from .conversions import (
    CONVERSIONS,
    add_up,
    compose,
    delta_from_rho,
    epsilon_from_rho,
    rho_from_epsilon_delta,
    rho_from_pure_dp,
    rho_from_rdp_gaussian,
    sigma_for_rho,
)
from .ledger import Accounting, BudgetExhausted, Charge, ChargeMismatch, LedgerState, LedgerSummary, capacity_step, fits, omega_charge
from .modes import ACCOUNTING_MODES, Capacity, OmegaSeries, PerUpdate, accounting_from_params, ledger_summary

__all__ = [
    "ACCOUNTING_MODES", "Accounting", "BudgetExhausted", "CONVERSIONS", "Capacity", "Charge", "ChargeMismatch",
    "LedgerState", "LedgerSummary", "OmegaSeries", "PerUpdate", "accounting_from_params", "add_up",
    "capacity_step", "compose", "delta_from_rho", "epsilon_from_rho", "fits", "ledger_summary", "omega_charge",
    "rho_from_epsilon_delta", "rho_from_pure_dp", "rho_from_rdp_gaussian", "sigma_for_rho",
]
