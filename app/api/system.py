"""Public endpoints: signing keys, algorithms, health and readiness."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..schemas import AlgorithmList, Health, PublicKeys
from ..unlearning import ALGORITHMS
from .deps import get_ctx
from .problems import responses

router = APIRouter(tags=["system"])


@router.get("/v1/keys", response_model=PublicKeys)
def list_public_keys(request: Request):
    """Public keys that verify receipts and checkpoints (active and retired)."""
    return {"keys": get_ctx(request).keyring.public_keys()}


@router.get("/v1/algorithms", response_model=AlgorithmList)
def list_algorithms():
    """The model families this service offers, with their guarantees."""
    return {"items": [{"name": name, "accounting": cls.accounting, "needs_retained_data": cls.needs_retained_data,
                       "guarantee": {"definition": cls.guarantee_definition, "statement": cls.guarantee_words}}
                      for name, cls in sorted(ALGORITHMS.items())]}


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
