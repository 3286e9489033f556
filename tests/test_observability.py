"""Prometheus metrics (bounded labels) and JSON logs that carry the request id and no secrets."""
from __future__ import annotations

import json
import logging
import time

from prometheus_client.parser import text_string_to_metric_families

from app.observability import JsonFormatter

from .helpers import create_model, examples, unit_rows


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self.setFormatter(JsonFormatter())

    def emit(self, record):
        self.lines.append(self.format(record))


def _metric(text: str, name: str, **labels) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_metrics_count_domain_events_without_identifiers(server, tenant):
    tenant_id, c = tenant
    before = c.get("/metrics").text
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(7, 2), prefix="secret-record")})
    c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["secret-record-1", "secret-record-2"]})
    c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["nope"]})
    after = c.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text
    assert _metric(text, "olu_examples_learned_total") - _metric(before, "olu_examples_learned_total") == 7
    assert _metric(text, "olu_deletions_total", mechanism="discrete_gaussian") - \
        _metric(before, "olu_deletions_total", mechanism="discrete_gaussian") == 2
    assert _metric(text, "olu_refusals_total", type="record-not-found") >= 1
    assert _metric(text, "olu_rho_spent_total") > _metric(before, "olu_rho_spent_total")
    assert _metric(text, "olu_http_requests_total", method="POST", route="/v1/models/{model_id}/learn",
                   status="2xx") >= 1
    for ident in (tenant_id, mid, "secret-record"):
        assert ident not in text


def test_json_logs_carry_request_ids_and_no_secrets(server):
    handler = _Collect()
    olu = logging.getLogger("olu")
    level = olu.level
    olu.addHandler(handler)
    # the process's first app set the "olu" logger's level (configure_logging); another test's app may have asked
    # for WARNING first, which would hide the access lines this test reads
    olu.setLevel(logging.INFO)
    try:
        tenant_id, key = server.new_tenant("logs")
        with server.client(key) as c:
            r = c.get("/v1/models", headers={"x-request-id": "trace-abc-123"})
            assert r.headers["x-request-id"] == "trace-abc-123"
            r2 = c.get("/v1/models")
            generated = r2.headers["x-request-id"]
            assert len(generated) == 16
        # the access line is written once the response is complete, which the client may see first
        deadline = time.monotonic() + 5
        while generated not in "\n".join(handler.lines) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        olu.removeHandler(handler)
        olu.setLevel(level)
    records = [json.loads(line) for line in handler.lines]
    access = [r for r in records if r["logger"] == "olu.access"]
    assert any(r["request_id"] == "trace-abc-123" and r["route"] == "/v1/models" for r in access)
    assert any(r["request_id"] == generated for r in access)
    blob = "\n".join(handler.lines)
    for secret in (key, server.app.state.ctx.settings.admin_token.get_secret_value()):
        assert secret not in blob


def test_middleware_counts_each_status_class_and_echoes_request_ids():
    """Metric children are looked up once per (method, route, status class): counts stay separate."""
    import asyncio

    from app.observability import Metrics, ObservabilityMiddleware

    class Route:
        path = "/v1/things/{id}"

    statuses = iter([200, 404, 200])

    async def app(scope, receive, send):
        scope["route"] = Route()
        await send({"type": "http.response.start", "status": next(statuses), "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b""})

    metrics = Metrics()
    mw = ObservabilityMiddleware(app, metrics)
    sent = []

    async def send(message):
        sent.append(message)

    async def run(headers):
        await mw({"type": "http", "method": "GET", "path": "/v1/things/1", "headers": headers}, None, send)

    asyncio.run(run([(b"x-request-id", b"first"), (b"x-request-id", b"trace-1")]))
    asyncio.run(run([(b"x-request-id", b"bad\x01id")]))
    asyncio.run(run([]))
    ids = [dict(m["headers"])[b"x-request-id"] for m in sent if m["type"] == "http.response.start"]
    assert ids[0] == b"trace-1" and len(ids[1]) == 16 and ids[1] != b"bad\x01id" and len(ids[2]) == 16
    assert all(dict(m["headers"])[b"a"] == b"b" for m in sent if m["type"] == "http.response.start")
    text = metrics.render()[0].decode()
    assert _metric(text, "olu_http_requests_total", route="/v1/things/{id}", status="2xx") == 2
    assert _metric(text, "olu_http_requests_total", route="/v1/things/{id}", status="4xx") == 1
    assert _metric(text, "olu_http_request_duration_seconds_count", route="/v1/things/{id}") == 3
