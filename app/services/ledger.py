"""The public ledger view: the engine's accounting plus the (epsilon, delta) conversion of rho spent."""
from __future__ import annotations

from typing import Any

from ..privacy import epsilon_from_rho
from . import book

CONVERSION = "cks20"


def epsilon_spent(ledger: dict[str, Any], delta: float) -> float:
    """Epsilon at the model's delta for the rho spent so far (CKS20 conversion), unless the family states its own."""
    if "epsilon" in ledger:
        return float(ledger["epsilon"])
    return epsilon_from_rho(float(ledger["rho_spent"]), delta, conversion=CONVERSION)


def _with_book(ledger: dict[str, Any]) -> dict[str, Any]:
    """Where the service keeps its own zCDP ledger (app.privacy), the amounts reported are that ledger's."""
    kept = book.summary(ledger.get("book"))
    if kept is None:
        return ledger
    return {**ledger, "rho_spent": kept["rho_spent"], "rho_budget": kept["rho_budget"],
            "capacity_total": kept["capacity_total"], "capacity_left": kept["capacity_left"]}


STANDARD = {"accounting", "rho_spent", "rho_budget", "capacity_total", "capacity_left", "epsilon", "delta",
            "conversion", "book"}


def details(ledger: dict[str, Any]) -> dict[str, Any]:
    """The engine's other public ledger numbers (JSON scalars only)."""
    return {k: v for k, v in ledger.items() if k not in STANDARD and (v is None or isinstance(v, (int, float, str, bool)))}


def _spent(ledger: dict[str, Any], delta: float) -> tuple[float, float, str]:
    """(epsilon, delta, conversion) of what the ledger has spent: a ledger that has spent nothing (every forget of an
    exact family, a noise model before its first forget) is (0, 0) with no conversion, as its receipts state
    (app/services/receipt_figures.py); else epsilon at the model's delta by the ledger's conversion."""
    eps = epsilon_spent(ledger, delta)
    if not (float(ledger.get("rho_spent") or 0.0) > 0.0 or eps > 0.0):
        return 0.0, 0.0, "none"
    return eps, delta, ledger.get("conversion", CONVERSION)


def ledger_summary(ledger: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    ledger = _with_book(ledger)
    eps, delta, _ = _spent(ledger, spec["delta"])
    return {
        "accounting": ledger["accounting"], "rho_spent": ledger["rho_spent"], "rho_budget": ledger.get("rho_budget"),
        "epsilon": eps, "delta": delta,
        "capacity_left": ledger.get("capacity_left"), "details": details(ledger),
    }


def ledger_view(row, ledger: dict[str, Any], spec: dict[str, Any], entries) -> dict[str, Any]:
    ledger = _with_book(ledger)
    eps, delta, conversion = _spent(ledger, spec["delta"])
    return {
        "model_id": row.id, "epoch": row.epoch, "accounting": ledger["accounting"],
        "rho_spent": ledger["rho_spent"], "rho_budget": ledger.get("rho_budget"),
        "epsilon": eps, "delta": delta, "conversion": conversion,
        "capacity_total": ledger.get("capacity_total"), "capacity_left": ledger.get("capacity_left"),
        "entries": [{"receipt_id": e.receipt_id, "kind": e.kind, "step": e.step, "sigma": e.sigma, "rho": e.rho}
                    for e in entries],
        "details": details(ledger),
    }
