"""Public endpoints: signing keys, algorithms, health and readiness."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..schemas import AlgorithmList, Health, PublicKeys
from ..unlearning import ALGORITHMS, hyperparameter_schema, hyperparameter_table
from .deps import get_ctx
from .problems import responses

router = APIRouter(tags=["system"])


@router.get("/v1/keys", response_model=PublicKeys)
def list_public_keys(request: Request):
    """Public keys that verify receipts and checkpoints (active and retired)."""
    return {"keys": get_ctx(request).keyring.public_keys()}


@router.get("/v1/algorithms", response_model=AlgorithmList)
def list_algorithms():
    """The model families this service offers: their guarantees, the losses each serves and its default loss, and
    the JSON Schema of its hyperparameters (names, types, defaults, ranges, descriptions, when each applies, the
    rules across fields)."""
    return {"items": [{"name": name, "accounting": cls.accounting, "needs_retained_data": cls.needs_retained_data,
                       "guarantee": {"definition": cls.guarantee_definition, "statement": cls.guarantee_words},
                       "losses": list(hyperparameter_table(name).losses),
                       "default_loss": hyperparameter_table(name).default_loss,
                       "hyperparameters": hyperparameter_schema(name)}
                      for name, cls in sorted(ALGORITHMS.items())]}


def install_hyperparameter_schemas(app) -> None:
    """Carry every family's hyperparameter JSON Schema in the OpenAPI document: one component schema per family
    (Hyperparameters_<algorithm>), linked from ModelCreate by algorithm (its x-hyperparameters extension).
    ModelCreate.hyperparameters stays an open object, so that the SDKs keep one create_model body."""
    build = app.openapi

    def openapi():
        if app.openapi_schema is None:
            doc = build()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            links = {}
            for name in sorted(ALGORITHMS):
                schemas[f"Hyperparameters_{name}"] = hyperparameter_schema(name)
                links[name] = {"$ref": f"#/components/schemas/Hyperparameters_{name}"}
            schemas["ModelCreate"]["x-hyperparameters"] = links
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request):
    """Prometheus metrics: HTTP traffic and domain counters (no per-tenant or per-record labels)."""
    body, content_type = get_ctx(request).metrics.render()
    return Response(body, media_type=content_type)


_HEALTHY = b'{"status":"ok","checks":{}}'


@router.get("/healthz", response_model=Health)
async def healthz():
    """Liveness: the process answers (no I/O)."""
    return Response(_HEALTHY, media_type="application/json")


READINESS_GATES = ("database", "schema", "signing_key")


@router.get("/readyz", response_model=Health, responses=responses(503))
def readyz(request: Request):
    """Readiness: database reachable, schema at the migration head, signing key loaded, and the compiled kernels
    no longer compiling (503 otherwise).  ``kernels``: "ok" (loaded), "compiling" (a cold numba cache: requests
    are served meanwhile on the numpy path, slower on large models, so a load balancer should send them to warm
    replicas), "off" (no numba: the numpy path always) or "failed" (the compilation failed: the numpy path);
    only "compiling" makes the replica unready.  Liveness is /healthz."""
    checks = get_ctx(request).readiness()
    ok = all(checks.get(name) == "ok" for name in READINESS_GATES) and checks.get("kernels") != "compiling"
    return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503)
