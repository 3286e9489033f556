"""Admission: the work and memory one request of a model may take, checked at creation (issues 21 and 36).

At creation the service asks the model's family for the worst case of one request, from the spec alone
(``Unlearner.estimate``, app/unlearning/maths/work_budget.py), and refuses a spec one request of which exceeds the
budget (``Settings.max_request_work`` / ``max_request_memory``), naming the field to lower and its accepted range.
What is admitted is what one request does: a learn of the largest batch, a forget request (one record, and the
``max_forget_batch`` it fills in).  An exact retrain is not a request bound (issue 36 item 3): one that exceeds the
budget runs as a long operation; its figure stays in ``Cost.retrain``.  Families that keep records get their
retained-record cap ``max_records`` filled in from the budget.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from .unlearning import ModelSpec, SpecError, Unlearner
from .unlearning.maths.work_budget import FORGET_BATCH, Budget, Cost, largest as _largest


def request_budget(settings) -> Budget:
    """The per-request budget of app.config.Settings."""
    return Budget(work=float(settings.max_request_work), memory=float(settings.max_request_memory),
                  batch=int(settings.max_batch), max_records=int(settings.max_retained_records))


def _excess(cost: Cost, budget: Budget) -> list[tuple[str, float, float, tuple[str, ...]]]:
    """(what, amount, limit, fields) for each figure of one request over the budget."""
    out = []
    # an exact retrain is not one request's work: beyond the budget it runs as a long operation (issue 36)
    for what, value, fields in (("learn", cost.learn, cost.learn_fields),
                                ("forget of one record", cost.forget, cost.forget_fields)):
        if not value <= budget.work:
            out.append((what, value, budget.work, fields))
    biggest = max(cost.array_bytes, 16.0 * cost.solve * cost.solve)  # a dense p x p system and LAPACK's copy
    if not biggest <= budget.memory:
        out.append(("largest array", biggest, budget.memory, cost.memory_fields))
    return out


def _fits(cls: type[Unlearner], spec: ModelSpec, budget: Budget, batch: int = 1) -> bool:
    try:
        return not _excess(cls.cost(spec, batch), budget)
    except (SpecError, ArithmeticError, ValueError, OverflowError):
        return False


def _varied(spec: ModelSpec, path: str, value: int) -> ModelSpec:
    if path == "dim":
        return dataclasses.replace(spec, dim=value)
    if path == "n_classes":
        return dataclasses.replace(spec, n_classes=value)
    return spec.with_hyperparameters({**spec.hyperparameters, path.split(".", 1)[1]: value})


def _budget_range(cls, spec: ModelSpec, budget: Budget, fields: Sequence[str]) -> tuple[str | None, tuple | None]:
    """The first integer field among ``fields`` some smaller value of which fits the budget (a learn of one
    example) with every other field as given: (field, (smallest accepted, largest accepted))."""
    hp = spec.hyperparameters
    for path in fields:
        current = (spec.dim if path == "dim" else spec.n_classes if path == "n_classes"
                   else hp.get(path.split(".", 1)[1]) if path.startswith("hyperparameters.") else None)
        if isinstance(current, bool) or not isinstance(current, int) or current < 1:
            continue
        low = 2 if path == "n_classes" else 1
        best = _largest(lambda v: _fits(cls, _varied(spec, path, v), budget), low, current)
        if best is not None:
            return path, (float(low), float(best))
    return None, None


def core_time(units: float) -> str:
    """Work units as the time of one core of the reference machine (one unit ~ 1 ns): "about 3.2 s of one core"."""
    seconds = units * 1e-9
    if not seconds < 1e6:
        return "more than 10^6 s of one core"
    text = (f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3
            else f"{seconds * 1e6:.3g} us")
    return f"about {text} of one core"


def work_text(units: float) -> str:
    """"about 3.2e+09 work units (about 3.2 s of one core)"."""
    return f"about {units:.3g} work units ({core_time(units)})"


def _refusal(cls, spec: ModelSpec, budget: Budget, what: str, amount: float, limit: float,
             fields: Sequence[str], hint: str = "") -> SpecError:
    if what == "largest array":
        amount_text, limit_text, setting = f"about {amount:.3g} bytes", f"{limit:.3g} bytes", "OLU_MAX_REQUEST_MEMORY"
    else:
        amount_text, limit_text, setting = work_text(amount), work_text(limit)[6:], "OLU_MAX_REQUEST_WORK"
    err = SpecError(f"{spec.algorithm}: one {what} would take {amount_text}, over the service's per-request budget "
                    f"of {limit_text} (the setting {setting} raises it); lower {' or '.join(fields[:3])}{hint}",
                    fields=fields)
    err.field, err.accepted = _budget_range(cls, spec, budget, fields)
    return _located(err, fields)


def _per_request(hp: dict[str, Any], key: str, fits, most: int, err) -> int | None:
    """The per-request limit ``key`` (max_learn_batch / max_forget_batch): the largest count in [1, most] that
    ``fits``; None when ``most`` fits (no limit needed); a given value above it is refused."""
    if fits(most):
        return hp.get(key)
    k = _largest(fits, 1, most)
    if k is None:
        raise err(None)
    given = hp.get(key)
    if given is not None and given > k:
        raise err(k)
    return k if given is None else given


def check_budget(cls: type[Unlearner], spec: ModelSpec, budget: Budget) -> ModelSpec:
    """Refuse a spec one request of which would exceed the budget (work units of one core, bytes of one array,
    the dense system LAPACK would be handed), naming the field to lower and its accepted range; fill in the
    retained-record cap ``max_records`` of a family that keeps records (the most records within the budget, at
    most ``budget.max_records``) and the per-request limits ``max_learn_batch`` / ``max_forget_batch`` where
    they bind (the most examples / records one request may name within the budget)."""
    hp = dict(spec.hyperparameters)
    if not cls.keeps_records(spec) and hp.get("max_records") is not None:
        raise _located(SpecError(f"{spec.algorithm}: max_records applies to models that keep the learned records; "
                                 "this one keeps none", fields=("hyperparameters.max_records",)))
    if cls.keeps_records(spec) and hp.get("max_records") is None:
        def room(batch: int, forgets: int):
            def ok(n: int) -> bool:  # a learn of ``batch`` and a forget of ``forgets`` records fit too
                try:
                    c = cls.cost(spec.with_hyperparameters({**hp, "max_records": n}), batch)
                except (SpecError, ArithmeticError, ValueError, OverflowError):
                    return False
                return not _excess(c, budget) and c.forget_request(forgets) <= budget.work
            return ok
        wide = min(FORGET_BATCH, budget.batch)
        hp["max_records"] = next((n for ok in (room(budget.batch, wide), room(1, wide), room(1, 1))
                                  if (n := _largest(ok, 1, budget.max_records)) is not None), 1)
    spec = spec.with_hyperparameters(hp)
    one = cls.estimate(spec, 1)
    over = _excess(one, budget)
    if over:
        raise _refusal(cls, spec, budget, *over[0], hint=one.hint)

    def limit_error(key: str, what: str):
        def make(k: int | None) -> SpecError:
            field = f"hyperparameters.{key}"
            e = SpecError(f"{spec.algorithm}: a {what} of {hp.get(key)} would exceed the per-request work budget of "
                          f"{work_text(budget.work)[6:]} (the setting OLU_MAX_REQUEST_WORK raises it)",
                          fields=(field,))
            e.field, e.accepted = field, (None if k is None else (1.0, float(k)))
            return _located(e)
        return make

    def learn_fits(b: int) -> bool:  # the family's own arrays, and the batch's encoded rows (below)
        return _fits(cls, spec, budget, b) and encoded_rows_fit(spec, b, budget)

    hp["max_learn_batch"] = _per_request(hp, "max_learn_batch", learn_fits, min(budget.batch, hp.get("max_learn_batch")
                                         or budget.batch), limit_error("max_learn_batch", "learn request"))
    cost = cls.estimate(spec, int(hp["max_learn_batch"] or budget.batch))
    hp["max_forget_batch"] = _per_request(hp, "max_forget_batch", lambda k: cost.forget_request(k) <= budget.work,
                                          min(budget.batch, hp.get("max_forget_batch") or budget.batch),
                                          limit_error("max_forget_batch", "forget request"))
    return spec.with_hyperparameters({k: v for k, v in hp.items() if v is not None or k not in
                                      ("max_learn_batch", "max_forget_batch")})


def encoded_rows_fit(spec: ModelSpec, batch: int, budget: Budget) -> bool:
    """Whether a learn of ``batch`` feature dictionaries fits the memory budget once encoded (issue 37, F5-F): a
    hashed model's learn hands the engine batch x dim float64 rows however small its body, so its per-request
    limit ``max_learn_batch`` is filled in to fit them (predict and evaluate encode in chunks and need no limit;
    dense rows are the body's own, bounded by OLU_MAX_BODY_BYTES)."""
    features = getattr(spec, "features", None)
    return features is None or 8.0 * batch * int(features["dim"]) <= budget.memory


def _located(err: SpecError, fields: Sequence[str] = ()) -> SpecError:
    if err.field is None and (fields or err.fields):
        err.field = (fields or err.fields)[0]
    err.located = True  # type: ignore[attr-defined]
    return err


