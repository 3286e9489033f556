"""Declarative hyperparameter tables (issue 40): per family, each knob's type, default, range, description and
when it applies, the losses the family serves and the rules across fields.  One table serves both the check of a
new model's hyperparameters (``check_knobs``: unknown names with the closest accepted one, types, choices, ranges,
knobs that do not apply) and their JSON Schema (``knob_schema``, served by GET /v1/algorithms and carried by the
OpenAPI document).  A family's own ``normalize_hyperparameters`` still fills in the defaults and checks what depends
on the spec (a step size against the loss's smoothness, a burn-in against its curvature): those rules are listed in
the table's ``rules`` in words, with the fields they concern, and in the schema's ``x-rules``."""
from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import SpecError
from .spec import LIMIT_KEYS

_NO_DEFAULT = object()


@dataclass(frozen=True)
class Knob:
    """One hyperparameter.  ``kind``: "number", "integer", "boolean" or "choice"; ``choices``: the values of a
    choice, or the strings a number or integer also takes (memory_pair's ``burn_in: "auto"``).  ``default``: its
    value when absent, unless it is computed from the spec (``default_note`` says how) or ``required``.
    ``only_when``: ((other knob, its values), ...) the knob applies only when each other knob (given, or its
    default) has one of those values; ``losses``: it applies only with these losses; ``required_when``: it must be
    given when any one of these (other knob, values) conditions holds (``required``: always)."""

    name: str
    kind: str
    description: str
    default: Any = _NO_DEFAULT
    default_note: str | None = None
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    nullable: bool = False
    only_when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    losses: tuple[str, ...] = ()
    required: bool = False
    required_when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    refused: tuple[tuple[Any, str], ...] = ()  # (value, why): values of its type the family refuses, with the reason

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT


@dataclass(frozen=True)
class Rule:
    """A rule across fields that one JSON Schema cannot state (it depends on the spec's numbers, or compares two
    knobs): refused at creation with a 422 naming one of ``fields``."""

    text: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class KnobTable:
    knobs: tuple[Knob, ...]
    losses: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    loss_note: str = ""  # why a loss is not served, said with its refusal
    by_name: Mapping[str, Knob] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {k.name: k for k in self.knobs})

    @property
    def default_loss(self) -> str:
        return "logistic" if "logistic" in self.losses else self.losses[0]


# ---- the limit hyperparameters every family takes (contract/spec.py LIMIT_KEYS) ----------------------------------
_LIMIT_WORDS = {
    "max_records": "The most records the model keeps (families that keep their data); the service fills it in from "
                   "its work budget (OLU_MAX_REQUEST_WORK, OLU_MAX_RETAINED_RECORDS) when absent or null.",
    "max_learn_batch": "The most examples one learn request may carry for this model; filled in from the work budget "
                       "where it binds.",
    "max_forget_batch": "The most records one unlearn request may name for this model; filled in from the work "
                        "budget where it binds.",
}
LIMIT_KNOBS = tuple(Knob(k, "integer", _LIMIT_WORDS[k], default_note="from the service's work budget", minimum=1,
                         maximum=10**12, nullable=True) for k in LIMIT_KEYS)

HUBER_DELTA = Knob("huber_delta", "number", "The Huber loss's threshold: quadratic within it, linear beyond.",
                   default=1.0, minimum=0.0, exclusive_minimum=True, losses=("huber",))


# ---- the check -------------------------------------------------------------------------------------------------
def _effective(table: KnobTable, hp: Mapping[str, Any], name: str) -> Any:
    if name in hp and hp[name] is not None:
        return hp[name]
    knob = table.by_name.get(name)
    return knob.default if knob is not None and knob.has_default else None


def _holds(table: KnobTable, hp: Mapping[str, Any], conditions) -> bool:
    return all(_effective(table, hp, other) in values for other, values in conditions)


def _conditions_text(conditions) -> str:
    return " and ".join(f"{other} " + (" or ".join(map(str, values))) for other, values in conditions)


def _range_text(k: Knob) -> str:
    lo = "(" if k.exclusive_minimum else "["
    hi = ")" if k.exclusive_maximum else "]"
    a = "-inf" if k.minimum is None else f"{k.minimum:g}"
    b = "inf" if k.maximum is None else f"{k.maximum:g}"
    return f"{lo}{a}, {b}{hi}"


def describe(k: Knob) -> str:
    """What the knob accepts, in words: "an integer in [1, 10000]", "one of a, b"."""
    if k.kind == "boolean":
        return "true or false"
    if k.kind == "choice":
        return "one of " + ", ".join(map(str, k.choices))
    what = "an integer" if k.kind == "integer" else "a number"
    if k.minimum is not None and k.maximum is not None:
        what += f" in {_range_text(k)}"
    elif k.minimum is not None:
        what += f" {'>' if k.exclusive_minimum else '>='} {k.minimum:g}"
    elif k.maximum is not None:
        what += f" {'<' if k.exclusive_maximum else '<='} {k.maximum:g}"
    if k.choices:
        what = " or ".join([*(f'"{c}"' for c in k.choices), what])
    return what + (" (or null: the default)" if k.nullable else "")


def _value_ok(k: Knob, v: Any) -> bool:
    if v is None:
        return k.nullable
    if k.kind == "boolean":
        return isinstance(v, bool)
    if k.kind == "choice":
        return not isinstance(v, bool) and v in k.choices
    if isinstance(v, str):
        return v in k.choices
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    x = float(v)
    if not math.isfinite(x) or (k.kind == "integer" and x != int(x)):
        return False
    if k.minimum is not None and (x <= k.minimum if k.exclusive_minimum else x < k.minimum):
        return False
    if k.maximum is not None and (x >= k.maximum if k.exclusive_maximum else x > k.maximum):
        return False
    return True


def closest(name: str, accepted) -> str | None:
    found = difflib.get_close_matches(name, list(accepted), n=1, cutoff=0.5)
    return found[0] if found else None


def check_knobs(algorithm: str, table: KnobTable, loss: str, hp: Mapping[str, Any]) -> None:
    """Refuse (``SpecError`` naming the field, its accepted values in ``accepted_values`` or range in
    ``accepted``) a new model's loss or hyperparameters that the table does not accept."""
    if loss not in table.losses:
        err = SpecError(f"{algorithm} serves loss {' or '.join(table.losses)}, not {loss}" +
                        (f": {table.loss_note}" if table.loss_note else ""), fields=("loss",))
        err.accepted_values = list(table.losses)  # type: ignore[attr-defined]
        raise err
    accepted = [k.name for k in table.knobs]
    for name in hp:
        if name not in table.by_name:
            near = closest(name, accepted)
            err = SpecError(f"unknown hyperparameter {name!r} for {algorithm}"
                            + (f"; did you mean {near!r}?" if near else "")
                            + f" Accepted: {', '.join(accepted)} (GET /v1/algorithms gives each one's type, default "
                              "and range)", fields=(f"hyperparameters.{name}",))
            err.accepted_names, err.closest = accepted, near  # type: ignore[attr-defined]
            raise err
    for k in table.knobs:
        path = f"hyperparameters.{k.name}"
        given = k.name in hp and not (hp[k.name] is None and k.nullable)
        if given and k.losses and loss not in k.losses:
            raise SpecError(f"{k.name} applies only with loss {' or '.join(k.losses)}", fields=(path,))
        if given and k.only_when and not _holds(table, hp, k.only_when):
            raise SpecError(f"{k.name} applies only with {_conditions_text(k.only_when)}", fields=(path,))
        why = dict(k.refused).get(hp.get(k.name)) if k.name in hp and isinstance(hp[k.name], (str, int, float)) else None
        if why is not None:
            raise SpecError(f"{k.name} = {json.dumps(hp[k.name])} is refused: {why}; use {describe(k)}", fields=(path,))
        if k.name in hp and not _value_ok(k, hp[k.name]):
            err = SpecError(f"{k.name} must be {describe(k)}", fields=(path,))
            if k.kind in ("number", "integer") and not k.choices and k.minimum is not None and k.maximum is not None \
                    and not (k.exclusive_minimum or k.exclusive_maximum):
                err.accepted = (float(k.minimum), float(k.maximum))  # type: ignore[attr-defined]
            if k.kind in ("choice", "boolean"):
                err.accepted_values = list(k.choices) if k.kind == "choice" else [True, False]  # type: ignore
            raise err
        because = [c for c in k.required_when if _holds(table, hp, (c,))]
        if (k.required or because) and not given and (not k.losses or loss in k.losses):
            why = f" with {_conditions_text(because[:1])}" if because and not k.required else ""
            raise SpecError(f"{k.name} is required for {algorithm}{why}: {describe(k)}; {k.description.rstrip('.')}",
                            fields=(path,))


# ---- the JSON Schema ---------------------------------------------------------------------------------------------
def _value_schema(k: Knob) -> dict[str, Any]:
    if k.kind == "boolean":
        s: dict[str, Any] = {"type": "boolean"}
    elif k.kind == "choice":
        s = {"type": "string", "enum": list(k.choices)}
    else:
        s = {"type": k.kind}
        if k.minimum is not None:
            s["exclusiveMinimum" if k.exclusive_minimum else "minimum"] = k.minimum
        if k.maximum is not None:
            s["exclusiveMaximum" if k.exclusive_maximum else "maximum"] = k.maximum
        if k.choices:
            s = {"anyOf": [s, {"type": "string", "enum": list(k.choices)}]}
    if k.nullable:
        s = {"anyOf": [s, {"type": "null"}]} if "anyOf" not in s else {"anyOf": [*s["anyOf"], {"type": "null"}]}
    return s


def _when(table: KnobTable, conditions) -> dict[str, Any]:
    """The JSON Schema condition "each knob (given, or its default) has one of these values"."""
    props, required = {}, []
    for other, values in conditions:
        props[other] = {"enum": list(values)}
        knob = table.by_name.get(other)
        if not (knob is not None and knob.has_default and knob.default in values):
            required.append(other)  # absent means the default, which is not among the values
    out: dict[str, Any] = {"properties": props}
    if required:
        out["required"] = required
    return out


def knob_schema(algorithm: str, table: KnobTable) -> dict[str, Any]:
    """The JSON Schema (2020-12) of the family's ``hyperparameters`` object: each knob's type, default, range and
    description (``x-default`` says how a default computed from the spec is found), which knobs apply when
    (``if``/``then`` on the knobs they depend on), which are required, and the cross-field rules in ``x-rules``."""
    props: dict[str, Any] = {}
    conds: list[dict[str, Any]] = []
    required: list[str] = []
    for k in table.knobs:
        s = _value_schema(k)
        s["description"] = k.description + (
            f" Applies only with {_conditions_text(k.only_when)}." if k.only_when else "") + (
            f" Applies only with loss {' or '.join(k.losses)}." if k.losses else "")
        if k.has_default:
            s["default"] = k.default
        if k.default_note:
            s["x-default"] = k.default_note
        props[k.name] = s
        if k.only_when:
            absent = {"properties": {k.name: {"type": "null"}}} if k.nullable else {"not": {"required": [k.name]}}
            conds.append({"if": {"not": _when(table, k.only_when)}, "then": absent})
        if k.required:
            required.append(k.name)
        else:
            conds += [{"if": _when(table, (c,)), "then": {"required": [k.name]}} for c in k.required_when]
    schema: dict[str, Any] = {
        "title": f"{algorithm} hyperparameters", "type": "object", "properties": props,
        "additionalProperties": False,
        "description": f"The hyperparameters of {algorithm}; every knob not given takes its default. Losses: "
                       f"{', '.join(table.losses)} (default {table.default_loss})." + (
                           " Rules across fields: " + "; ".join(r.text for r in table.rules) + "."
                           if table.rules else ""),
    }
    if required:
        schema["required"] = required
    if conds:
        schema["allOf"] = conds
    if table.rules:
        schema["x-rules"] = [{"rule": r.text, "fields": list(r.fields)} for r in table.rules]
    return schema
