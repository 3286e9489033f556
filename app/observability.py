"""Prometheus metrics and structured JSON logs with request ids.

Metrics live in a registry per app (so several apps in one process, as in tests, do not collide).  Labels are
bounded: method, route template, status class, problem type; never tenant, model or record ids.
"""
from __future__ import annotations

import json
import logging
import secrets
import sys
import time
from contextvars import ContextVar

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("olu_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=r)
        self.latency = Histogram("olu_http_request_duration_seconds", "HTTP request latency", ["method", "route"],
                                 registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10))
        self.examples_learned = Counter("olu_examples_learned_total", "Examples learned", registry=r)
        self.deletions = Counter("olu_deletions_total", "Records forgotten (receipts issued)", ["mechanism"], registry=r)
        self.refusals = Counter("olu_refusals_total", "Requests refused with a problem", ["type"], registry=r)
        self.rho_spent = Counter("olu_rho_spent_total", "zCDP rho charged by deletions, summed over models", registry=r)
        self.models_created = Counter("olu_models_created_total", "Models created", registry=r)

    def watch_records(self, book) -> None:
        """Serve the record index's counts (a ``RecordBook``'s), read at each scrape."""
        self.registry.register(_RecordIndexCollector(book))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _RecordIndexCollector:
    """The per-process record index (app/db/record_batches.py): entries held, and rebuilds of indexes dropped for
    OLU_RECORD_INDEX_MAX_ENTRIES (a steady rate of them is thrashing: raise the setting)."""

    def __init__(self, book) -> None:
        self.book = book

    def collect(self):
        yield CounterMetricFamily("olu_record_index_rebuilds", "Record indexes rebuilt from the database after "
                                  "being dropped for OLU_RECORD_INDEX_MAX_ENTRIES", value=self.book.rebuilds)
        yield GaugeMetricFamily("olu_record_index_entries", "Learned records held in this process's record "
                                "indexes (16 bytes each)", value=self.book.entries)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, and any ``extra`` fields."""

    RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
    _second: tuple[int, str] = (-1, "")  # the last second formatted, and its text

    def format(self, record: logging.LogRecord) -> str:
        second, text = self._second
        if int(record.created) != second:
            second = int(record.created)
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        out = {"ts": f"{text}.{int(record.msecs):03d}Z", "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage(), "request_id": request_id_var.get()}
        for k, v in record.__dict__.items():
            if k not in self.RESERVED and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None  # no values: no secrets
        try:
            raw = orjson.dumps(out, default=str)
            if raw.isascii():  # else json's \u escapes keep the line ASCII, whatever the stream's encoding
                return raw.decode()
        except (TypeError, orjson.JSONEncodeError):  # e.g. an integer beyond 64 bits
            pass
        return json.dumps(out, default=str)


def configure_logging(level: str = "INFO") -> None:
    root = logging.getLogger("olu")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


access_log = logging.getLogger("olu.access")


class ObservabilityMiddleware:
    """Request id (X-Request-ID in and out), access log line and HTTP metrics, as pure ASGI."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics
        self._series: dict[tuple, tuple] = {}  # (method, route, status class) -> metric children (labels looked up once)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = None
        for name, value in scope.get("headers") or ():
            if name == b"x-request-id":
                rid = value  # the last one, as before
        if rid is not None:
            rid = rid.decode("latin-1")
            if not (0 < len(rid) <= 64 and rid.isprintable()):
                rid = None
        if rid is None:
            rid = secrets.token_hex(8)
        rid_header = (b"x-request-id", rid.encode())
        token = request_id_var.set(rid)
        start = time.perf_counter()
        status = 500

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - start
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            key = (method, template, status // 100)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = (self.metrics.requests.labels(method, template, f"{status // 100}xx"),
                                              self.metrics.latency.labels(method, template))
            series[0].inc()
            series[1].observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info("request", extra={"method": method, "route": template, "status": status,
                                                  "duration_ms": round(elapsed * 1000, 3)})
            request_id_var.reset(token)
