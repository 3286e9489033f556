"""Per-API-key rate limiting: an in-process token bucket, 429 + Retry-After beyond it.

The bucket is keyed by a hash of the bearer token (so unknown and revoked tokens are limited too, and the
raw token is never kept).  It is **per process**: N replicas behind a load balancer allow up to N times the
configured rate in total.  ``OLU_RATE_LIMIT`` is requests per second per key (burst = the same number, or
``OLU_RATE_LIMIT_BURST``); empty or 0 turns the limiter off.  Requests without a bearer token are not
limited here (they can only reach public endpoints or get 401).
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import OrderedDict

from .problems import MEDIA_TYPE, PROBLEM_BASE


class TokenBuckets:
    def __init__(self, rate: float, burst: float | None = None, max_keys: int = 100_000,
                 clock=time.monotonic):
        self.rate = float(rate)
        self.burst = float(burst) if burst else max(self.rate, 1.0)
        self.max_keys, self.clock = max_keys, clock
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # key -> (tokens, last time)
        self._lock = threading.Lock()

    def take(self, key: bytes) -> float:
        """0 when the request may proceed, else the seconds until a token is available."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[key] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
            while len(self._buckets) > self.max_keys:  # forget the least recently seen keys (they are full)
                self._buckets.popitem(last=False)
        return wait


class RateLimit:
    """Pure ASGI middleware in front of the app."""

    def __init__(self, app, rate: float, burst: float | None = None):
        self.app = app
        self.buckets = TokenBuckets(rate, burst) if rate and rate > 0 else None

    async def __call__(self, scope, receive, send):
        if self.buckets is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        token = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, rest = value.partition(b" ")
                if scheme.lower() == b"bearer" and rest.strip():
                    token = rest.strip()
                break
        if token is None:
            return await self.app(scope, receive, send)
        wait = self.buckets.take(hashlib.sha256(token).digest())
        if wait <= 0:
            return await self.app(scope, receive, send)
        retry_after = str(max(1, math.ceil(wait)))
        body = json.dumps({"type": PROBLEM_BASE + "rate-limited", "title": "Too many requests", "status": 429,
                           "detail": f"This key is limited to {self.buckets.rate:g} requests per second.",
                           "instance": scope.get("path")}).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", retry_after.encode())]})
        await send({"type": "http.response.body", "body": body})
