"""Rate limits: per API key (all requests), and per client address (failed authentications only).

**Per key.**
The bucket is keyed by a hash of the bearer token (so unknown and revoked tokens are limited too, and the
raw token is never kept).  It is **per process**: N replicas behind a load balancer allow up to N times the
configured rate in total.  ``OLU_RATE_LIMIT`` is requests per second per key (burst = the same number, or
``OLU_RATE_LIMIT_BURST``); empty or 0 turns the limiter off.  Requests without a bearer token are not
limited here (they can only reach public endpoints or get 401).

**Failed authentications, per client address and per token** (``AuthFailureThrottle``): every request whose
bearer token is neither the admin token nor a live API key takes one token from its client address's bucket and
one from the bucket of that bearer token (by its hash).  The buckets hold ``OLU_AUTH_FAILURE_LIMIT`` failures and
refill at ``OLU_AUTH_FAILURE_LIMIT`` per ``OLU_AUTH_FAILURE_WINDOW`` seconds.  A failure from an address, or with
a token, whose bucket is empty is answered 429 + Retry-After instead of 401; a token whose own bucket is empty is
refused before it is looked up.  A valid key is never refused here: it is checked whatever its address's bucket
holds, so one client behind a shared address (NAT, proxy) cannot lock out the others with bad tokens (keys carry
256 random bits: a guess that passes the check is not a risk the throttle has to bound).  Addresses and tokens
that never fail are not tracked; at most ``OLU_AUTH_FAILURE_MAX_ADDRESSES`` of each are (least recently failing
forgotten first).  IPv6 clients are counted per /64, the block one host usually holds.  The client address is
the socket's, or a trusted proxy's word for it (``app/api/clientaddr.py``, ``OLU_TRUSTED_PROXIES``).
"""
from __future__ import annotations

import asyncio
import hashlib
import ipaddress
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

    def wait(self, key: bytes) -> float:
        """Seconds until ``key`` has a token again (0: it has one now); takes nothing, tracks nothing new."""
        now = self.clock()
        with self._lock:
            entry = self._buckets.get(key)
        if entry is None:
            return 0.0
        tokens = min(self.burst, entry[0] + (now - entry[1]) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

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


class AuthFailureThrottle:
    """Failed authentications per client address (see the module docstring)."""

    def __init__(self, limit: int, window_seconds: float, max_addresses: int = 100_000, clock=time.monotonic):
        self.limit, self.window = int(limit), float(window_seconds)
        self.buckets = TokenBuckets(self.limit / self.window, self.limit, max_keys=max_addresses, clock=clock)
        self.tokens = TokenBuckets(self.limit / self.window, self.limit, max_keys=max_addresses, clock=clock)

    @staticmethod
    def address_key(host: str | None) -> bytes:
        if not host:
            return b"?"
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:  # not an IP (a unix socket path, a test client name): the string itself
            return host.encode("utf-8", "replace")
        if ip.version == 6:
            if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d is the IPv4 client a.b.c.d
                return ip.ipv4_mapped.packed
            return ipaddress.ip_network(f"{ip}/64", strict=False).network_address.packed
        return ip.packed

    def retry_after(self, host: str | None) -> int:
        """0 when ``host``'s failure bucket is not empty, else whole seconds to wait (Retry-After)."""
        return _seconds(self.buckets.wait(self.address_key(host)))

    def token_retry_after(self, token: str) -> int:
        """0 unless ``token`` has failed more than the limit lately: then whole seconds to wait."""
        return _seconds(self.tokens.wait(self.token_key(token)))

    def failed(self, host: str | None, token: str | None = None) -> int:
        """Count a failed authentication of ``host`` (and ``token``); 0: answer 401, else 429 with this
        Retry-After (the address's or the token's bucket was already empty)."""
        wait = self.buckets.take(self.address_key(host))
        if token is not None:
            wait = max(wait, self.tokens.take(self.token_key(token)))
        return _seconds(wait)

    @staticmethod
    def token_key(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()[:16]


def _seconds(wait: float) -> int:
    return max(1, math.ceil(wait)) if wait > 0 else 0


class RateLimit:
    """Pure ASGI middleware in front of the app: the per-key bucket, then the tenant's limits (app/api/fairness.py)
    when the key's tenant is known; refusals are answered here, before the body is read or the key checked."""

    def __init__(self, app, rate: float, burst: float | None = None, tenants=None, metrics=None):
        self.app = app
        self.buckets = TokenBuckets(rate, burst) if rate and rate > 0 else None
        self.tenants = tenants if tenants is not None and tenants.enabled else None  # a fairness.TenantLimiter
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if (self.buckets is None and self.tenants is None) or scope["type"] != "http":
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
        digest = hashlib.sha256(token).digest()
        if self.buckets is not None:
            wait = self.buckets.take(digest)
            if wait > 0:
                return await self._refuse(scope, send, max(1, math.ceil(wait)), "key-requests",
                                          f"This key is limited to {self.buckets.rate:g} requests per second.")
        limiter = self.tenants
        if limiter is None:
            return await self.app(scope, receive, send)
        tenant = limiter.tenant_of(digest)
        state = {"digest": digest, "tenant": None}  # deps.authenticate admits a key not attributed yet
        scope["olu.tenant_limits"] = state
        if tenant is not None:
            refusal = await limiter.admit_async(tenant)
            if refusal is not None:
                hold = limiter.hold_for(refusal)
                if hold > 0:
                    limiter.held += 1
                    try:
                        await asyncio.sleep(hold)
                    finally:
                        limiter.held -= 1
                return await self._refuse(scope, send, refusal.retry_after, refusal.limit, refusal.detail)
            state["tenant"] = tenant
        try:
            await self.app(scope, receive, send)
        finally:
            if state["tenant"] is not None:
                limiter.release(state["tenant"])

    async def _refuse(self, scope, send, retry_after: int, limit: str, detail: str) -> None:
        if self.metrics is not None:
            self.metrics.refusals.labels("rate-limited").inc()
        body = json.dumps({"type": PROBLEM_BASE + "rate-limited", "title": "Too many requests", "status": 429,
                           "detail": detail, "limit": limit, "retry_after": retry_after,
                           "instance": scope.get("path")}).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", str(retry_after).encode())]})
        await send({"type": "http.response.body", "body": body})
