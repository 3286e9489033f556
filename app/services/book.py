"""The service's own privacy ledger of a model, kept with ``app.privacy`` and checked against the engine.

For families whose guarantee is an additive zCDP budget (``Unlearner.accounting_params()``), every discrete-Gaussian
certificate is spent against the ledger policy before the write commits: a certificate claiming more rho
than the policy allows (an engine that under-noises) fails the request and changes nothing.  Exact
certificates cost nothing; a restart or an exact retrain opens a new ledger epoch.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from ..errors import Problem
from ..privacy.ledger import BudgetExhausted, ChargeMismatch, LedgerState
from ..privacy.modes import accounting_from_params
from ..unlearning import Certificate, Unlearner
from ..unlearning.mechanism.release import MECHANISM

log = logging.getLogger("olu.ledger")
Book = dict[str, Any]  # {"params": accounting params, "state": LedgerState.as_dict()}


def open_book(engine: Unlearner) -> Book | None:
    params = engine.accounting_params()
    return None if params is None else {"params": params, "state": LedgerState().as_dict()}


def record(book: Book | None, certs: Sequence[Certificate]) -> Book | None:
    if book is None:
        return None
    policy = accounting_from_params(book["params"])
    state = LedgerState.from_dict(book["state"])
    for cert in certs:
        if cert.details.get("restart"):
            state = state.new_epoch()
        elif cert.mechanism == MECHANISM:  # "discrete_gaussian": a noised release is charged
            try:
                state, _ = policy.spend(state, certified_rho=cert.rho)
            except (ChargeMismatch, BudgetExhausted) as e:
                # an engine certificate the ledger policy does not allow: never publish it
                log.error("certificate rejected by the ledger", extra={"reason": type(e).__name__})
                raise Problem(500, "internal-error", "A deletion certificate did not match the model's privacy "
                                                     "ledger; nothing was changed.") from None
    return {"params": book["params"], "state": state.as_dict()}


def after_each(book: Book | None, certs: Sequence[Certificate]) -> list[dict[str, Any]] | None:
    """The ledger's summary (rho_spent, epsilon, delta, conversion, capacity_left) after each certificate of a
    request, as ``record`` takes them one by one: what each receipt's ``ledger_after`` states (issue 37 item 7: a
    per_update ledger -- the group allocation's windows -- keeps the current window's bound and adds nothing, so the
    receipts must not add either).  None for a model without a book."""
    if book is None:
        return None
    out = []
    for cert in certs:
        book = record(book, [cert])
        out.append(summary(book))
    return out


def new_epoch(book: Book | None) -> Book | None:
    if book is None:
        return None
    return {"params": book["params"], "state": LedgerState.from_dict(book["state"]).new_epoch().as_dict()}


def summary(book: Book | None) -> dict[str, Any] | None:
    if book is None:
        return None
    return accounting_from_params(book["params"]).summary(LedgerState.from_dict(book["state"])).as_dict()
