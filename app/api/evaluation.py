"""Evaluate a model on labelled examples, and read its last evaluation (issue 39)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from ..schemas.evaluation import EvaluateRequest, Evaluation, LastEvaluation
from .deps import AnyKey, Predictor, get_ctx
from .json_body import openapi_body
from .models import ModelId, _compute, _raw_body, decode_inputs
from .problems import responses

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.post("/{model_id}/evaluate", response_model=Evaluation, responses=responses(401, 403, 404, 413, 422),
             openapi_extra=openapi_body(EvaluateRequest))
async def evaluate(model_id: ModelId, request: Request, p: Predictor, raw: Annotated[bytes, Depends(_raw_body)]):
    """Score the model's published parameters on labelled examples: the same inputs as predict (`x`, or `features`
    for a model with a feature spec) with one true label each in `y`. Answers `n`, and for classifiers `accuracy`,
    `correct` and the confusion matrix (up to 50 classes), `log_loss` where the scores are probabilities (logistic,
    softmax), and `mean_squared_error` for regression. The model learns nothing, and nothing of the examples is
    kept: only these figures, as the model's last evaluation (GET .../evaluation, shown in the console).

    Rules that depend on the model, as for predict: `x` for a dense model, `features` for a model with a feature spec
    (422 `features-not-declared` / `features-required`, then `unknown-feature`, `out-of-range-feature`,
    `invalid-features`); each vector has the model's `dim` values (422 `invalid-dimension`) small enough to score
    (422 `out-of-bounds-input`); `y` one label per input (422 `validation-error`), a class of the model for a
    classifier (422 `invalid-label`); at most OLU_MAX_BATCH inputs, and a model with a feature map at most its
    `feature_map.max_rows` (413 `batch-too-large`)."""
    evaluation = get_ctx(request).models.evaluation
    content_type = request.headers.get("content-type")

    def work():
        x, features, y = decode_inputs(request, raw, content_type, p.tenant_id, model_id, "evaluate")
        return evaluation.evaluate(p.tenant_id, model_id, x, features, y)

    return await _compute(request, p.tenant_id, work)


@router.get("/{model_id}/evaluation", response_model=LastEvaluation, responses=responses(401, 403, 404))
def last_evaluation(model_id: ModelId, request: Request, p: AnyKey):
    """The figures of the model's last evaluation (POST .../evaluate), or `evaluation: null` if it has none."""
    return get_ctx(request).models.evaluation.last(p.tenant_id, model_id)


def install_openapi(app) -> None:
    """Publish EvaluateRequest's schema (the route parses its body itself, so FastAPI does not see it)."""
    from fastapi.openapi.models import Schema
    from pydantic.json_schema import models_json_schema

    build = app.openapi

    def openapi():
        if app.openapi_schema is None:
            doc = build()
            _, defs = models_json_schema([(EvaluateRequest, "validation")], ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, d in defs["$defs"].items():
                schemas.setdefault(name, Schema(**d).model_dump(by_alias=True, exclude_none=True))
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
