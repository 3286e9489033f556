"""What a refused model specification's 422 offers instead, tried before it is said (issue 40).

A numeric field's accepted range is found by the registry (``registry.locate``: the family's own checks evaluated at
probes).  Here: a spec without a loss takes its family's default loss (one it serves), and a refused field with a
few possible values (the loss, a choice or a true/false knob) gets the values that make the specification valid with
every other field as given, each tried -- so "No value of X alone makes this valid" is said only when every value
was tried and refused."""
from __future__ import annotations

from typing import Any

from ..registry import _spec_of
from ..unlearning import SpecError, check_new_hyperparameters, hyperparameter_table
from ..unlearning.maths.losses import LOSSES


def with_default_loss(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with its family's default loss where it gives none."""
    if payload.get("loss") is not None:
        return payload
    return {**payload, "loss": hyperparameter_table(payload["algorithm"]).default_loss}


def _candidates(payload: dict[str, Any], field: str) -> list[Any] | None:
    """The values a field can take, when they are few: the loss, a choice knob, a true/false knob."""
    if field == "loss":
        return list(LOSSES)
    if not field.startswith("hyperparameters."):
        return None
    try:
        knob = hyperparameter_table(payload["algorithm"]).by_name.get(field.split(".", 1)[1])
    except SpecError:
        return None
    if knob is None:
        return None
    if knob.kind == "choice":
        return list(knob.choices)
    if knob.kind == "boolean":
        return [True, False]
    return None


def _with(payload: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    if field == "loss":
        return {**payload, "loss": value}
    name = field.split(".", 1)[1]
    return {**payload, "hyperparameters": {**(payload.get("hyperparameters") or {}), name: value}}


def accepted(payload: dict[str, Any], *, max_dim: int, budget=None) -> bool:
    """Whether the service would accept this creation payload (the knob table, then the family's checks, the
    calibration and, given a budget, the work budget)."""
    try:
        check_new_hyperparameters(payload["algorithm"], payload["loss"], payload.get("hyperparameters"))
        _spec_of(payload, max_dim=max_dim, budget=budget)
        return True
    except SpecError:
        return False


def with_choices(e: SpecError, payload: dict[str, Any], max_dim: int, budget=None) -> SpecError:
    """``e`` with its field (``e.field``) and, for a field of few values, ``e.accepted_values``: those of them that
    make the payload valid with every other field as given (``e.tried``: they were all tried)."""
    field = getattr(e, "field", None) or (e.fields[0] if e.fields else None)
    e.field = field  # type: ignore[attr-defined]
    if field is None or getattr(e, "accepted", None) is not None or "loss" not in payload:
        return e
    values = _candidates(payload, field)
    if values is None or len(values) > 16:
        return e
    current = payload.get("loss") if field == "loss" else (payload.get("hyperparameters") or {}).get(
        field.split(".", 1)[1])
    e.accepted_values = [v for v in values if v != current  # type: ignore[attr-defined]
                         and accepted(_with(payload, field, v), max_dim=max_dim, budget=budget)]
    e.tried = True  # type: ignore[attr-defined]
    return e
