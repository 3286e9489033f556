"""Models: create, list, get, delete, learn, unlearn, predict, published parameters."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from ..errors import Problem
from ..ids import id_pattern
from ..services.idempotency import KEY_PATTERN, MAX_KEY_LENGTH
from ..schemas.evaluation import EvaluateRequest
from ..services.prediction import NotInline
from ..unlearning import ALGORITHMS
from ..schemas import (NO_CONTROL, LearnColumnarRequest, LearnRequest, LearnResponse, Model, ModelCreate, ModelList, Parameters, PredictRequest,
                           PredictResponse, RetrainResponse, UnlearnRequest, UnlearnResponse)
from . import idempotent, operations
from .decode_pool import Chunks
from .json_body import INLINE_BODY_BYTES, openapi_body
from .json_body import parse as parse_json_body
from .learn_body import openapi_request_body, parse_learn_body
from .deps import AnyKey, Predictor, Writer, get_ctx
from .problems import responses

router = APIRouter(prefix="/v1/models", tags=["models"])
Limit = Annotated[int, Query(ge=1, le=200)]
ModelId = Annotated[str, Path(pattern=NO_CONTROL, description="A model id (no control characters).")]
Cursor = Annotated[str | None, Query(pattern=id_pattern("mdl"), description="The next_cursor of the previous page.")]
IdemKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=MAX_KEY_LENGTH, pattern=KEY_PATTERN, description=(
    "Retries with the same key and body return the first answer (the same key with another body: 422 "
    "idempotency-key-reused; while the first request runs: 409). 1 to 255 visible ASCII characters, spaces only "
    "inside (e.g. a UUID)."))]


@router.post("", status_code=201, response_model=Model, responses=responses(401, 403, 404, 409, 422))
def create_model(body: ModelCreate, request: Request, p: Writer, idempotency_key: IdemKey = None):
    """Create a model. Its public constants and privacy calibration derive from the declared bounds.

    Besides the schema (which states, among others, that `n_classes` and `classes` go with loss softmax or squared and
    that softmax needs one of them; with squared only a least-squares classifier takes them, exact_ridge), these rules are refused with 422 `invalid-model-spec`, naming the field: the
    family's `hyperparameters` (GET /v1/algorithms) and its calibration, which must be computable from the bounds,
    privacy target and `l2` (some families need `l2` > 0); `dim` at most the deployment's OLU_MAX_DIM (default
    100000), and for a classifier `n_classes` * (`dim` + 1) at most OLU_MAX_DIM + 1; `n_classes` equal to the number of
    `classes` when both are given; `features.dim` equal to `dim`, each numeric range `[lo, hi]` finite with
    lo < hi, no field both numeric and categorical, at most 1000 fields in all.

    A tenant at its quota of live models (or bytes stored) is answered 409 `quota-exceeded` naming the `quota`, its
    `limit` and the `usage` (GET /v1/tenant)."""
    return idempotent.run(request, p.tenant_id, body, Model, 201,
                          lambda guard: get_ctx(request).models.lifecycle.create(p.tenant_id, body.model_dump(), guard))


@router.get("", response_model=ModelList, responses=responses(401, 403, 422))
def list_models(request: Request, p: AnyKey, cursor: Cursor = None, limit: Limit = 50):
    """The tenant's models, oldest first, with cursor pagination."""
    return get_ctx(request).models.lifecycle.list(p.tenant_id, cursor, limit)


@router.get("/{model_id}", response_model=Model, responses=responses(401, 403, 404))
def get_model(model_id: ModelId, request: Request, p: AnyKey):
    return get_ctx(request).models.lifecycle.get(p.tenant_id, model_id)


@router.delete("/{model_id}", status_code=204, response_class=Response, responses=responses(401, 403, 404))
def delete_model(model_id: ModelId, request: Request, p: Writer):
    """Delete a model: secret state, records and data are erased, and one signed erasure receipt is appended to
    the tenant's log (see the ledger's ``erasure_receipt_id``); receipts and the log are kept. A deleted model is
    404, so a retry issues no second receipt."""
    get_ctx(request).models.lifecycle.delete(p.tenant_id, model_id)
    return Response(status_code=204)


async def _raw_body(request: Request) -> "bytes | Chunks":
    """The request body: bytes, or, when it is large enough for the decode pool, its chunks as received (Chunks,
    joined only in the pool's process: app/api/decode_pool.py)."""
    ctx = get_ctx(request)
    if getattr(ctx, "decode_pool", None) is None:
        return await request.body()
    chunks: list[bytes] = []
    async for chunk in request.stream():
        if chunk:
            chunks.append(chunk)
    body = Chunks(chunks)
    if len(body) > ctx.settings.decode_process_bytes:
        return body
    request._body = joined = b"".join(chunks)  # as Request.body() keeps it, for any later reader
    return joined


# The hot routes are async and make one worker-thread hop for the blocking part (decode, service call, encode).
@router.post("/{model_id}/learn", response_model=LearnResponse,
             responses=responses(401, 403, 404, 409, 413, 422) | operations.ACCEPTED, openapi_extra=openapi_request_body())
async def learn(model_id: ModelId, request: Request, p: Writer, raw: Annotated[bytes, Depends(_raw_body)],
                idempotency_key: IdemKey = None, prefer: operations.PreferHeader = None):
    """Learn a batch of examples in order. Record ids must be new to the model; the batch is all-or-nothing.

    Two body shapes: per example `{"examples": [{"id", "x", "y"}]}` (or `{"id", "features", "y"}` for a model with
    a feature spec), or columnar `{"ids": [..], "x": [[..]], "y": [..]}` for dense models (faster to decode; also
    as `application/msgpack`, see the requestBody's `x-msgpack`).

    Rules the schema cannot state: columnar `ids`, `x` and `y` have one entry per id (422 `validation-error`);
    the ids of the `examples` are distinct (422 `duplicate-record`) and new to the model (409 `duplicate-record`);
    and the model's own: each `x` has the model's `dim` values (422 `invalid-dimension`) within its `bounds`
    (422 `out-of-bounds-input`); `x` for a dense model, `features` for a model with a feature spec (422
    `features-not-declared` / `features-required`), encoded by that spec (422 `unknown-feature`,
    `out-of-range-feature`, `invalid-features`); `y` a label of its loss (422 `invalid-label`: 0/1 for logistic, a
    class index or declared class name for softmax, a class name only for a model that declared class names);
    at most the deployment's OLU_MAX_BATCH examples and the family's per-request limit (413 `batch-too-large`),
    and for a model with a feature spec at most as many as fit OLU_MAX_REQUEST_MEMORY once encoded (rows x its
    hashed dim x 8 bytes; 413 `batch-too-large` with `limit` and `max_rows`);
    within the tenant's quotas of records held and bytes stored (409 `quota-exceeded` naming the `quota`, its
    `limit` and the `usage`; the batch is refused whole).

    More examples than the family's per-request limit `max_learn_batch` (or `Prefer: respond-async`): 202 Accepted
    with the operation that learns them in committed chunks of that size, in order, after the same checks
    (`Location: /v1/operations/{id}`)."""
    models = get_ctx(request).models

    def work():
        batch = _learn_batch(request, raw, p.tenant_id)
        started = operations.start_learn(request, p.tenant_id, model_id, batch)  # 202: long work (api/operations.py)
        if started is not None:
            return started
        return idempotent.run(request, p.tenant_id, batch.model, LearnResponse, 200, lambda guard: models.learning.learn(
            p.tenant_id, model_id, batch.ids, batch.X, batch.y, guard, batch.F, digests=batch.digests))

    return await _compute(request, p.tenant_id, work)


def decode_pool_for(request: Request, raw: bytes):
    """The decode pool (app/api/decode_pool.py) when this body is large enough to be decoded there (so that its
    long C calls do not hold this process's GIL), else None: decoded here."""
    ctx = get_ctx(request)
    pool = getattr(ctx, "decode_pool", None)
    return pool if pool is not None and len(raw) > ctx.settings.decode_process_bytes else None


def _learn_batch(request: Request, raw: bytes, tenant_id: str):
    """The learn body decoded, in the decode pool when it is large, with its ids' commitments computed there."""
    pool, content_type = decode_pool_for(request, raw), request.headers.get("content-type")
    if pool is not None:
        return pool.learn_body(raw, content_type, fingerprint=idempotent.HEADER in request.headers,
                               key=get_ctx(request).models.learning.record_key(tenant_id))
    return parse_learn_body(raw, content_type)


async def _compute(request: Request, tenant_id: str, fn, *args):
    """``fn(*args)`` on a worker thread once the tenant's turn in the fair scheduler comes (app/api/fairness.py
    FairScheduler; OLU_COMPUTE_SLOTS), directly when it is off."""
    scheduler = getattr(get_ctx(request), "scheduler", None)
    if scheduler is None:
        return await run_in_threadpool(fn, *args)
    async with scheduler.slot(tenant_id):
        return await run_in_threadpool(fn, *args)


def install_openapi(app) -> None:
    """Publish the body schemas of the routes that parse their bodies themselves (FastAPI does not see them)."""
    from fastapi.openapi.models import Schema
    from pydantic.json_schema import models_json_schema

    build = app.openapi

    def openapi():
        if app.openapi_schema is None:
            doc = build()
            _, defs = models_json_schema([(m, "validation") for m in (LearnRequest, LearnColumnarRequest,
                                                                       UnlearnRequest, PredictRequest)],
                                         ref_template="#/components/schemas/{model}")
            schemas = {name: Schema(**d).model_dump(by_alias=True, exclude_none=True)  # as FastAPI renders its own
                       for name, d in defs["$defs"].items()}
            doc.setdefault("components", {}).setdefault("schemas", {}).update(schemas)
            # the families on offer (the registry's names: GET /v1/algorithms); another name is 422
            doc["components"]["schemas"]["ModelCreate"]["properties"]["algorithm"]["enum"] = sorted(ALGORITHMS)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi


@router.post("/{model_id}/unlearn", response_model=UnlearnResponse,
             responses=responses(401, 403, 404, 409, 413, 422) | operations.ACCEPTED,
             openapi_extra=openapi_body(UnlearnRequest))
async def unlearn(model_id: ModelId, request: Request, p: Writer, raw: Annotated[bytes, Depends(_raw_body)],
                  idempotency_key: IdemKey = None, prefer: operations.PreferHeader = None):
    """Forget records by id. Each forgotten record gets a signed certificate receipt; all-or-nothing.

    Rules that depend on the model: each id was learned (404 `record-not-found`) and not yet forgotten (409
    `record-already-forgotten`); `examples` are for a model that keeps no data but needs the forgotten records'
    features (memory_pair and exact_ridge with deletion_features=client: 422 `deletion-features-required` without them, 422
    `example-mismatch` when they differ from what was learned, with the labels and dimension rules of learn);
    a model that keeps its data takes the ids only (422 `examples-not-accepted`); other families ignore them.
    A forget the family's analysis cannot certify is exact instead (a restart or an exact retrain, said in the
    receipt), except that a model that keeps its data and has spent its deletion capacity answers 409
    `deletion-capacity-exhausted` (then `retrain-required` until retrained) with a `retrain` member naming the
    retrain operation, after which the forget works; a model that keeps no data never answers those (such a refusal
    would name `delete`, the model's deletion, instead). 422 `forget-rejected`, 409 `record-not-deletable`: a
    forget the engine refuses as asked; at most OLU_MAX_BATCH ids (413 `batch-too-large`).

    More ids than the model's `max_forget_batch` (or `Prefer: respond-async`): 202 Accepted with the operation that
    forgets them in committed batches, after the same checks (`Location: /v1/operations/{id}`; its receipts, one per
    id in order: GET /v1/operations/{id}/receipts)."""
    models = get_ctx(request).models
    content_type = request.headers.get("content-type")

    def work(body: UnlearnRequest | None):
        pool = None if body is not None else decode_pool_for(request, raw)
        if pool is not None:  # a large body: decoded in the decode pool, its ids' commitments computed there
            body, examples = pool.unlearn_body(raw, content_type, fingerprint=idempotent.HEADER in request.headers,
                                               key=models.forgetting.record_key(p.tenant_id))
        else:
            if body is None:
                body = parse_json_body(UnlearnRequest, raw, content_type)
            examples = body.resent()
        started = operations.start_unlearn(request, p.tenant_id, model_id, body, examples)  # 202: long work
        if started is not None:
            return started
        return idempotent.run(request, p.tenant_id, body, UnlearnResponse, 200, lambda guard: models.forgetting.unlearn(
            p.tenant_id, model_id, list(body.ids), guard, examples, digests=getattr(body, "digests", None)))

    # a body above the inline bound is decoded and validated on the worker thread too, in the tenant's turn
    # (issue 37, F5-G: a 19 MiB body decoded on the event loop stalled every other tenant); a small one is decoded
    # here, so that a malformed request is answered without a turn
    body = None if len(raw) > INLINE_BODY_BYTES else parse_json_body(UnlearnRequest, raw, content_type)
    return await _compute(request, p.tenant_id, work, body)


@router.post("/{model_id}/retrain", response_model=RetrainResponse,
             responses=responses(401, 403, 404, 409, 422) | operations.ACCEPTED)
def retrain(model_id: ModelId, request: Request, p: Writer, idempotency_key: IdemKey = None,
            prefer: operations.PreferHeader = None):
    """Exact retrain on the retained examples (data-holding families): starts a new ledger epoch. A model that
    keeps no data answers 409 `retrain-not-supported` (its forgets never need a retrain).

    A retrain whose work exceeds one request's budget (OLU_MAX_REQUEST_WORK, for the records the model holds), or
    asked with `Prefer: respond-async`, answers 202 Accepted with the operation that runs it (`Location:
    /v1/operations/{id}`; docs/operations.md "Operations")."""
    started = operations.start_retrain(request, p.tenant_id, model_id)  # 202: long work (api/operations.py)
    if started is not None:
        return started
    return idempotent.run(request, p.tenant_id, None, RetrainResponse, 200,
                          lambda guard: get_ctx(request).models.learning.retrain(p.tenant_id, model_id, guard))


@router.post("/{model_id}/predict", response_model=PredictResponse, responses=responses(401, 403, 404, 413, 422),
             openapi_extra=openapi_body(PredictRequest))
async def predict(model_id: ModelId, request: Request, p: Predictor, raw: Annotated[bytes, Depends(_raw_body)]):
    """Predict with the published parameters: dense vectors `x`, or feature dictionaries `features` for a model
    with a feature spec (encoded exactly as at learning).

    Rules that depend on the model: `x` for a dense model, `features` for a model with a feature spec (422
    `features-not-declared` / `features-required`, then `unknown-feature`, `out-of-range-feature`,
    `invalid-features`); each vector has the model's `dim` values (422 `invalid-dimension`) small enough to score
    (422 `out-of-bounds-input`); at most OLU_MAX_BATCH inputs (413 `batch-too-large`)."""
    prediction = get_ctx(request).models.prediction
    content_type = request.headers.get("content-type")

    def answer(body: PredictRequest | None, inline: bool = False):
        if body is None:
            x, features, _ = decode_inputs(request, raw, content_type, p.tenant_id, model_id)
        else:
            x, features = body.x, body.feature_dicts()
        return idempotent.json_response(PredictResponse, prediction.predict(
            p.tenant_id, model_id, x, inline=inline, features=features))

    # Only small predictions are answered on the event loop (no worker-thread hop); a large body is decoded,
    # validated and computed on a worker thread in its tenant's turn, so that one tenant's large predictions do
    # not hold the loop, and every other tenant's requests queued behind them, for milliseconds each (issue 29)
    if len(raw) > prediction.INLINE_BODY_BYTES:
        return await _compute(request, p.tenant_id, answer, None)
    body = parse_json_body(PredictRequest, raw, content_type)
    if prediction.predict_inline(body.x if body.features is None else body.feature_dicts()):
        try:
            return answer(body, inline=True)
        except NotInline:  # feature dictionaries whose dense rows (rows x the model's dim) are too large for the loop
            pass
    return await _compute(request, p.tenant_id, answer, body)


def decode_inputs(request: Request, raw: bytes, content_type: str | None, tenant_id: str, model_id: str,
                  kind: str = "predict") -> tuple:
    """A predict's or an evaluate's (``kind``) (x, features, y) (y None for predict), decoded on the worker thread
    holding the tenant's turn: a hashed model's body in the decode pool, its dictionaries hashed there too
    (``DecodePool.hashed_inputs``), so that the Python work of 1 000 dictionaries (~20 ms) does not hold this
    process's GIL in turns with the event loop; any other body in the pool when it is large
    (``decode_pool_for``), else here."""
    ctx = get_ctx(request)
    pool = getattr(ctx, "decode_pool", None)
    if pool is not None:
        try:
            hashed = ctx.models.prediction.hashed_spec(tenant_id, model_id)
        except Problem:  # no such model: answered by the usual path, after the body's own checks, as before
            hashed = None
        if hashed is not None and pool.warm():  # (until the pool's first process is up: decoded here)
            return pool.hashed_inputs(kind, raw, content_type, hashed, ctx.settings.max_batch)
    pool = decode_pool_for(request, raw)
    if pool is not None:  # a large body: decoded in the decode pool
        return pool.inputs(kind, raw, content_type)
    body = parse_json_body(PredictRequest if kind == "predict" else EvaluateRequest, raw, content_type)
    return body.x, body.feature_dicts(), list(body.y) if kind == "evaluate" else None


@router.get("/{model_id}/parameters", response_model=Parameters, responses=responses(401, 403, 404))
def get_parameters(model_id: ModelId, request: Request, p: Predictor):
    """The published parameters, the only parameters that ever leave the service: noisy for the noise families,
    exact for retrain, sisa and exact_ridge (exact_ridge with publication private: solved from noisy sums)."""
    return get_ctx(request).models.prediction.parameters(p.tenant_id, model_id)
