"""The privacy figures a certificate receipt signs (issue 37 item 7): its ``guarantee`` numbers and its
``ledger_after``, per certificate of a request, as the model's ledger states them.

- Where the service keeps its own ledger of the model (app/services/book.py), each receipt states that ledger after
  its certificate, taken one by one: an additive zCDP budget (omega series, capacity) sums the charges; a
  ``per_update`` ledger keeps the bound of the current publication -- the group allocation's window bound
  (docs/passive_group_allocation.md §3) -- and adds nothing.  (The receipts added every ledger's charges: a group
  model's receipts 2..k read 2 rho, 3 rho, ... and epsilon 1.45, 1.81, ... while its ledger said rho and epsilon 1.)
- Without a book, an additive accounting sums the certificates' rho; otherwise the receipt carries the ledger's own
  figure for the current publication.
- An exact certificate (mechanism ``exact``: a restart, an exact family's forget) states epsilon = delta = 0 with no
  conversion (``"none"``): it spends nothing, so no (epsilon, delta) conversion applies; and ``ledger_after`` gives a
  delta only with a positive rho or epsilon (a ledger that has spent nothing is (0, 0)).
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from ..privacy.modes import accounting_from_params
from ..unlearning import Certificate, Unlearner
from . import book
from .ledger import CONVERSION, epsilon_spent

EXACT = "exact"


def receipt_figures(row, engine: Unlearner, certs: Sequence[Certificate], ledger: dict[str, Any],
                    delta: float) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Per certificate: (the guarantee's epsilon, delta, conversion; the ledger after it)."""
    states = book.after_each(json.loads(row.ledger_json).get("book"), certs)
    params = engine.accounting_params()
    additive = params is not None and accounting_from_params(params).additive
    rho, cap_final, out = float(row.rho_spent or 0.0), ledger.get("capacity_left"), []
    for j, cert in enumerate(certs):
        if cert.details.get("restart"):
            rho = 0.0  # a new ledger epoch
        if states is not None:
            rho = float(states[j]["rho_spent"] or 0.0)
        elif additive:
            rho = rho + cert.rho
        else:
            rho = float(ledger.get("rho_spent") or 0.0)
        eps = float(ledger["epsilon"]) if "epsilon" in ledger else epsilon_spent({"rho_spent": rho}, delta)
        cap = None if cap_final is None else int(cap_final) + (len(certs) - 1 - j)
        after = {"rho_spent": rho, "epsilon": eps, "delta": delta if (rho > 0.0 or eps > 0.0) else 0.0,
                 "capacity_left": cap}
        if cert.mechanism == EXACT:
            guarantee = {"epsilon": 0.0, "delta": 0.0, "conversion": "none"}
        else:
            guarantee = {"epsilon": eps, "delta": delta, "conversion": ledger.get("conversion", CONVERSION)}
        out.append((guarantee, after))
    return out
