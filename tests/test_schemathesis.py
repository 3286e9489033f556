"""Schema-driven fuzzing of every operation in the committed openapi/openapi.json (schemathesis), with every check.

Bounded for CI: at most 30 examples per operation, positive and negative (schema-violating) data.  Requests
carry a valid credential (the admin token on /v1/tenants, a tenant key elsewhere); for about half of the
examples the path parameters are replaced by real ids seeded beforehand (a model with records and a
receipt, the tenant), so the handlers behind the 404 are exercised too.  Every answer must be a non-5xx
that conforms to the document (status code, content type, headers, body schema); every schema-violating request
must be refused (``negative_data_rejection``); and every schema-valid request must be accepted
(``positive_data_acceptance``, issue 21), except where it breaks a rule the document states in words because JSON
Schema cannot: those are listed below, each with its reason, and nothing else passes.
"""
from __future__ import annotations

import re
import uuid
import zlib

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from app.openapi_dump import OUT  # noqa: E402
from app.services.idempotency import KEY_PATTERN  # noqa: E402

from .conftest import ADMIN_TOKEN, start_server  # noqa: E402
from .helpers import create_model, examples, unit_rows  # noqa: E402

schema = schemathesis.openapi.from_path(str(OUT))

# The problem types a schema-valid request may still get (422, or 413 for the batch limits), each for a rule that
# depends on the model, the tenant's log or the deployment, or that JSON Schema cannot state; each is written in the
# description of the operations that answer it (app/api/models.py, app/api/audit.py).
DOCUMENTED_REFUSALS = {
    "invalid-model-spec": "create: the family's hyperparameters and calibration, OLU_MAX_DIM, and relations "
                          "between fields (features.dim = dim, n_classes = len(classes), lo < hi, ...)",
    "invalid-dimension": "learn, unlearn, predict: the model's dim",
    "out-of-bounds-input": "learn, predict: the model's declared bounds",
    "invalid-label": "learn, unlearn, evaluate: the labels of the model's loss and declared classes",
    "duplicate-record": "learn: an id twice among the examples (JSON Schema cannot make one property unique)",
    "features-required": "learn, unlearn, predict: the model has a feature spec",
    "features-not-declared": "learn, unlearn, predict: the model is dense",
    "unknown-feature": "the model's feature spec",
    "out-of-range-feature": "the model's feature spec",
    "invalid-features": "the model's feature spec",
    "deletion-features-required": "unlearn: the model's family needs the records' features",
    "example-mismatch": "unlearn: the features sent differ from those learned",
    "examples-not-accepted": "unlearn: the model keeps its data (ids only)",
    "forget-rejected": "unlearn: the model's family cannot certify this forget",
    "log-size-exceeded": "consistency, export's cursor: the tenant's log size",
    "batch-too-large": "learn, unlearn, predict: OLU_MAX_BATCH and the family's per-request limit (413)",
    "non-finite-result": "learn, predict: the model's state with these inputs",
}
IDEMPOTENCY_KEY = re.compile(KEY_PATTERN)


def _lengths_differ(body) -> bool:
    return isinstance(body, dict) and "ids" in body and isinstance(body.get("x"), list) and isinstance(
        body.get("y"), list) and not len(body["ids"]) == len(body["x"]) == len(body["y"])


def breaks_cross_field_rule(case) -> bool:
    """A schema-valid request that breaks a rule across fields JSON Schema cannot state (the operation says it):
    exactly one of export's record_id and model_id; consistency's from_size <= to_size; a columnar learn's ids, x
    and y of one length.  The service must refuse it with 422 validation-error."""
    q = case.query or {}
    if case.path == "/v1/audit/export":
        return (q.get("record_id") is None) == (q.get("model_id") is None)
    if case.path == "/v1/audit/consistency":
        return q.get("to_size") is not None and int(q["from_size"]) > int(q["to_size"])
    if case.path == "/v1/models/{model_id}/evaluate":  # one label per input (issue 39)
        body = case.body if isinstance(case.body, dict) else {}
        inputs = body.get("x") if body.get("x") is not None else body.get("features")
        return isinstance(inputs, list) and isinstance(body.get("y"), list) and len(inputs) != len(body["y"])
    return case.path == "/v1/models/{model_id}/learn" and _lengths_differ(case.body)


def positive_data_acceptance_as_documented(ctx, response, case):
    """positive_data_acceptance, less the documented refusals above."""
    if case.meta is not None and case.meta.generation.mode.is_positive:
        if breaks_cross_field_rule(case):  # refused, as validation-error or a documented problem checked first
            assert response.status_code == 422, response.text
            assert response.json()["type"].rpartition("/problems/")[2] in ("validation-error", *DOCUMENTED_REFUSALS)
            return None
        if response.status_code in (413, 422) and response.headers.get("content-type", [""])[0].startswith(
                "application/problem+json"):
            slug = response.json().get("type", "").rpartition("/problems/")[2]
            if slug in DOCUMENTED_REFUSALS:
                return None
    return positive_data_acceptance(ctx, response, case)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    d = tmp_path_factory.mktemp("schemathesis")
    srv, (uv, thread) = start_server(f"sqlite:///{d / 'olu.db'}", d, "sqlite")
    tenant_id, key = srv.new_tenant("fuzz")
    with srv.client(key) as c:
        mid = create_model(c, dim=2)["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(40, 2))}).status_code == 200
        receipt = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).json()["receipts"][0]["id"]
        # a model that keeps its data, and a softmax model with class names and a feature spec: their own rules
        kept = create_model(c, dim=2, algorithm="retrain")["id"]
        assert c.post(f"/v1/models/{kept}/learn", json={"examples": examples(unit_rows(10, 2))}).status_code == 200
        named = create_model(c, dim=4, loss="softmax", classes=["a", "b", "c"], features={
            "type": "hashed", "dim": 4, "numeric": {"v": [0, 1]}, "categorical": ["c"]})["id"]
        assert c.post(f"/v1/models/{named}/learn", json={"examples": [
            {"id": f"rec-{i}", "features": {"v": i / 10, "c": "abc"[i % 3]}, "y": "abc"[i % 3]} for i in range(10)
        ]}).status_code == 200
        # a least-squares classifier that keeps no data (exact_ridge): unlearns need the records resent
        ridge = create_model(c, dim=2, algorithm="exact_ridge", loss="squared", n_classes=2)["id"]
        assert c.post(f"/v1/models/{ridge}/learn", json={"examples": examples(unit_rows(10, 2))}).status_code == 200
    real = {"tenant_id": tenant_id, "receipt_id": receipt, "record_id": "rec-1"}
    yield srv, key, real, (mid, kept, named, ridge)
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
def test_every_operation_conforms_and_never_5xx(case, seeded):
    srv, key, real, models = seeded
    admin = case.path.startswith("/v1/tenants")
    params = case.path_parameters or {}
    # half of the examples aim at real objects, one of the four models (never the tenant's own key, never a real
    # model or the real tenant for DELETE: that would erase what the other examples aim at)
    pick = zlib.crc32(repr(sorted(params.items())).encode())  # deterministic (not hash())
    if params and pick % 2 == 0:
        real = {**real, "model_id": models[pick // 2 % len(models)]}
        for name in params:
            if name in real and not (case.method == "DELETE" and case.path in ("/v1/models/{model_id}",
                                                                                "/v1/tenants/{tenant_id}")):
                params[name] = real[name]
    key_sent = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key_sent, str) and IDEMPOTENCY_KEY.fullmatch(key_sent):
        # unique per example (keys are per-request by design), still a valid key: 12 hex digits, then its tail
        prefix = uuid.uuid4().hex[:12]
        case.headers["Idempotency-Key"] = prefix + (key_sent[12:] if len(key_sent) > 243 else key_sent)
    case.call_and_validate(base_url=srv.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN if admin else key}"},
                           excluded_checks=[positive_data_acceptance],
                           additional_checks=[positive_data_acceptance_as_documented])
