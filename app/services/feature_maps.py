"""A model's public feature map at creation (app/feature_map.py): the map spec normalised, the engine's spec built
on the mapped dimension and bound, and the map's work and memory checked against the per-request budget.

The engine never sees the raw rows: its spec has ``dim`` = the map's D and ``bounds.x_norm`` = the map's bound
(min(1, the declared x_norm)), so every constant and certificate it computes holds for the mapped vectors.  A
refusal the engine's checks make about its ``dim`` is about the map's size: it names ``feature_map.centres``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import Problem
from ..feature_map import (FeatureMapError, memory_bytes, normalize_map, precompute_work, prepared,
                           rows_work)
from ..registry import build_spec
from ..unlearning import ModelSpec, SpecError, engine_class
from ..unlearning.maths.work_budget import Budget, largest


def map_spec_problem(e: FeatureMapError) -> Problem:
    """422 invalid-model-spec naming the map's field (API path and JSON pointer) and its accepted range."""
    item: dict[str, Any] = {"field": e.field, "pointer": "/" + e.field.replace(".", "/"),
                            "loc": ["body", *e.field.split(".")], "msg": str(e)}
    detail = f"{e.field}: {e}"
    if e.accepted is not None:
        item["minimum"], item["maximum"] = e.accepted
        detail += f". {e.field} is accepted in [{e.accepted[0]:.6g}, {e.accepted[1]:.6g}] with the other fields as given"
    return Problem(422, "invalid-model-spec", detail, errors=[item])


def engine_payload(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the creation payload as the engine's spec sees it, the normalised map or None).  With a map the engine's
    ``dim`` is the map's D and its ``bounds.x_norm`` the map's bound; hashed feature dictionaries do not combine
    with a map (a row is either a dictionary or a dense vector to map)."""
    raw = payload.get("feature_map")
    out = {k: v for k, v in payload.items() if k != "feature_map"}
    if raw is None:
        return out, None
    if payload.get("features") is not None:
        raise map_spec_problem(FeatureMapError("a feature map applies to dense rows x: it does not combine with "
                                               "feature dictionaries (features)", "feature_map"))
    try:
        fm = normalize_map(raw, int(payload["dim"]), float(payload["bounds"]["x_norm"]))
    except FeatureMapError as e:
        raise map_spec_problem(e) from None
    out["dim"] = fm["dim"]
    out["bounds"] = {**payload["bounds"], "x_norm": fm["bound"]}
    return out, fm


def engine_budget(budget: Budget, fm: dict[str, Any] | None) -> Budget:
    """The budget the engine's own checks get: the request budget less the mapping of one block of rows, so that
    the caps the registry derives from it (max_records, the per-request limits) leave room for the map."""
    if fm is None:
        return budget
    return dataclasses.replace(budget, work=max(budget.work - rows_work(fm, 1), 1.0))


def _fits(payload: dict[str, Any], fm: dict[str, Any], budget: Budget, max_dim: int, C: int) -> bool:
    """Whether the model with C centres (every other field as given) passes every check: the engine's spec and
    budget, and the map's own work and memory beside one learn and one forget of the engine."""
    f = {**fm, "centres": C, "dim": C}
    if not (precompute_work(f) <= budget.work and rows_work(f, 1) <= budget.work
            and memory_bytes(f) <= budget.memory):
        return False
    try:
        spec = build_spec({**payload, "dim": C}, max_dim=max_dim, budget=engine_budget(budget, f))
        cls = engine_class(spec.algorithm)
        one = cls.cost(spec, 1)
        forget = one.forget if cls(spec).needs_deletion_features else 0.0
    except (SpecError, ArithmeticError, ValueError):
        return False
    return one.learn + rows_work(f, 1) <= budget.work and forget + rows_work(f, 1) <= budget.work


def accepted_centres(payload: dict[str, Any], fm: dict[str, Any], budget: Budget,
                     max_dim: int) -> tuple[float, float] | None:
    """The accepted range of feature_map.centres with every other field as given (rff: even numbers)."""
    step = 2 if fm["kind"] == "rff" else 1
    best = largest(lambda k: _fits(payload, fm, budget, max_dim, k * step), 1, fm["centres"] // step)
    return None if best is None else (float(step), float(best * step))


def renamed(e: SpecError, fm: dict[str, Any] | None, payload: dict[str, Any], budget: Budget,
            max_dim: int) -> SpecError:
    """A refusal of the engine's spec in the client's terms: with a map, the engine's ``dim`` is
    ``feature_map.centres``, and its accepted range counts the map's own work too."""
    if fm is None:
        return e
    if getattr(e, "field", None) == "dim":
        e.field = "feature_map.centres"
        e.accepted = accepted_centres(payload, fm, budget, max_dim)
        e.args = (f"{e} (with a feature map the model's parameters are sized by feature_map.centres, the mapped "
                  "dimension)",)
    e.fields = tuple("feature_map.centres" if f == "dim" else f for f in (e.fields or ()))
    return e


def finish(spec: ModelSpec, fm: dict[str, Any] | None, budget: Budget, payload: dict[str, Any],
           max_dim: int) -> ModelSpec:
    """The engine's spec with its map: the map's own work (precomputation, rows) and memory within ``budget``, the
    per-request limits (``max_learn_batch``, ``max_forget_batch``) lowered so that mapping the rows fits beside the
    engine's work, and ``fm["max_rows"]``, the most rows one predict or evaluate request maps.  The map's
    precomputation is built once here (a map that cannot be factorised is refused now, not at its first use)."""
    if fm is None:
        return spec
    fm = dict(fm)

    def refuse(what: str, amount: float, limit: float) -> FeatureMapError:
        return FeatureMapError(f"the feature map's {what} would take about {amount:.3g} "
                               f"{'bytes' if what == 'largest array' else 'work units'}, over the service's per-request "
                               f"budget of {limit:.3g}; lower feature_map.centres", "feature_map.centres",
                               accepted_centres(payload, fm, budget, max_dim))

    try:
        for what, amount, limit in (("precomputation", precompute_work(fm), budget.work),
                                    ("mapping of one row", rows_work(fm, 1), budget.work),
                                    ("largest array", memory_bytes(fm), budget.memory)):
            if not amount <= limit:
                raise refuse(what, amount, limit)
        cls = engine_class(spec.algorithm)
        engine = cls(spec)
        hp = dict(spec.hyperparameters)
        one = cls.cost(spec, 1)
        learn_most = int(hp.get("max_learn_batch") or budget.batch)
        b = largest(lambda n: cls.cost(spec, n).learn + rows_work(fm, n) <= budget.work, 1, learn_most)
        if b is None:
            raise refuse("mapping of a learn of one example", one.learn + rows_work(fm, 1), budget.work)
        if b < learn_most:
            hp["max_learn_batch"] = b
        if engine.needs_deletion_features:  # the client resends the records: the map runs at forget too
            forget_most = int(hp.get("max_forget_batch") or budget.batch)
            k = largest(lambda n: one.forget_request(n) + rows_work(fm, n) <= budget.work, 1, forget_most)
            if k is None:
                raise refuse("mapping of a forget of one record", one.forget + rows_work(fm, 1), budget.work)
            if k < forget_most:
                hp["max_forget_batch"] = k
        fm["max_rows"] = largest(lambda n: rows_work(fm, n) <= budget.work, 1, budget.batch) or 1
        prepared(fm)
    except FeatureMapError as e:
        raise map_spec_problem(e) from None
    return dataclasses.replace(spec.with_hyperparameters(hp), feature_map=fm)
