"""Fair sharing of a replica between tenants (issue 29): per-tenant limits on top of the per-key token bucket.

Three limits, all per tenant, shared by every key of the tenant; per process here (N replicas allow N times each),
for the whole deployment with ``SharedTenantLimiter`` (app/api/shared_limits.py: requests and concurrency drawn from
PostgreSQL, issue 37 item 5):

- **requests** (``OLU_TENANT_RATE_LIMIT`` per second, burst ``OLU_TENANT_RATE_LIMIT_BURST``): one token bucket;
- **concurrency** (``OLU_TENANT_MAX_IN_FLIGHT``): requests of the tenant in flight at once in this process;
- **compute** (``OLU_TENANT_COMPUTE_SHARE``, burst ``OLU_TENANT_COMPUTE_BURST_SECONDS``): the server time the
  tenant's requests occupy, measured, not estimated.  A bucket of "request-seconds" refills at
  ``share`` per second and drains, at every instant, by the number of the tenant's requests then in flight; a
  request is admitted only while the bucket is above zero.  With a share of 1 the tenant holds on average at most
  one request in flight, about one core whatever its requests cost (a cheap predict or a long learn alike), and a
  client that sends one request at a time never drains it.

The refusal is cheap: the middleware (``RateLimit`` in app/api/ratelimit.py) knows the tenant of a key from the
SHA-256 of its bearer token (``attribute``, filled in by authentication and dropped on revocation), so a refused
request is answered before its body is read, before authentication and before any database work, with 429
``rate-limited`` (``limit`` names which), ``Retry-After``, and no write.  A closed-loop flooder that retries at
once would still make the server parse and answer refusals as fast as it can send them: the refusal is therefore
held back (``refusal_delay``, at most the Retry-After and at most ``MAX_HELD`` refusals held at once per process)
before it is sent, with no CPU spent meanwhile, so each of the flooder's connections costs a few refusals per second.

A key seen for the first time (or not seen for ``ATTRIBUTION_SECONDS``) is not yet attributed: its request passes
the middleware and is admitted right after authentication (app/api/deps.py) instead.

Behind the limits, ``FairScheduler`` orders the admitted requests' computations: per-tenant queues served round
robin in front of a bounded number of compute slots (``OLU_COMPUTE_SLOTS``), so one tenant's queue never delays
another's computation by more than one slot's turn (docs/operations.md §10.1).
"""
from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections import OrderedDict, deque
from contextlib import asynccontextmanager
from dataclasses import dataclass

ATTRIBUTION_SECONDS = 60.0  # a key not authenticated for this long is no longer attributed (revoked elsewhere)
MAX_KEYS = 100_000
MAX_TENANTS = 100_000
MAX_HELD = 512  # refusals held back at once (beyond, answered at once)


@dataclass
class Refusal:
    limit: str  # tenant-requests | tenant-concurrency | tenant-compute
    retry_after: int  # whole seconds
    detail: str


@dataclass
class _Tenant:
    tokens: float  # request bucket
    compute: float  # request-seconds bucket
    last: float  # time of the last update of both buckets
    in_flight: int = 0


class TenantLimiter:
    def __init__(self, rate: float | None, burst: float | None, max_in_flight: int | None,
                 compute_share: float | None, compute_burst: float | None, refusal_delay: float = 0.0,
                 clock=time.monotonic):
        self.rate = float(rate) if rate and rate > 0 else None
        self.burst = float(burst) if burst else (max(self.rate, 1.0) if self.rate else 0.0)
        self.max_in_flight = int(max_in_flight) if max_in_flight and max_in_flight > 0 else None
        self.share = float(compute_share) if compute_share and compute_share > 0 else None
        self.compute_burst = float(compute_burst) if compute_burst and compute_burst > 0 else (self.share or 0.0)
        self.refusal_delay = max(0.0, float(refusal_delay or 0.0))
        self.clock = clock
        self._keys: OrderedDict[bytes, tuple[str, float]] = OrderedDict()  # key digest -> (tenant, expiry)
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()
        self._lock = threading.Lock()
        self.held = 0  # refusals being held back now (event loop only)
        self.where = "in this process"  # the limits' scope, as the refusals name it

    @property
    def enabled(self) -> bool:
        return bool(self.rate or self.max_in_flight or self.share)

    # ---- which tenant a key belongs to ------------------------------------------------------------------------

    def tenant_of(self, digest: bytes) -> str | None:
        entry = self._keys.get(digest)
        if entry is None or entry[1] <= self.clock():
            return None
        return entry[0]

    def attribute(self, digest: bytes, tenant_id: str) -> None:
        """A successful authentication of the key with this SHA-256 ``digest`` (kept for ATTRIBUTION_SECONDS)."""
        with self._lock:
            self._keys[digest] = (tenant_id, self.clock() + ATTRIBUTION_SECONDS)
            if len(self._keys) > MAX_KEYS:
                self._keys.popitem(last=False)

    def forget(self, tenant_id: str | None = None, digest: bytes | None = None) -> None:
        """A revocation: the key (or every key of the tenant) is no longer attributed."""
        with self._lock:
            if digest is not None:
                self._keys.pop(digest, None)
            if tenant_id is not None:
                self._keys = OrderedDict((k, v) for k, v in self._keys.items() if v[0] != tenant_id)

    # ---- admission --------------------------------------------------------------------------------------------

    def _state(self, tenant_id: str, now: float) -> _Tenant:
        t = self._tenants.get(tenant_id)
        if t is None:
            t = self._tenants[tenant_id] = _Tenant(self._first_tokens(), self.compute_burst, now)
            if len(self._tenants) > MAX_TENANTS:  # forget idle tenants first (their buckets are full)
                for tid, st in list(self._tenants.items()):
                    if st.in_flight == 0 and tid != tenant_id:
                        del self._tenants[tid]
                        break
        else:
            self._tenants.move_to_end(tenant_id)
            dt = max(0.0, now - t.last)
            if self.rate:
                self._refill(t, dt)
            if self.share:  # drains by the requests in flight, refills at the share
                t.compute = min(self.compute_burst, t.compute + dt * (self.share - t.in_flight))
            t.last = now
        return t

    def _first_tokens(self) -> float:
        return self.burst

    def _refill(self, t: _Tenant, dt: float) -> None:
        """The request bucket's refill over ``dt`` seconds (here: in process; shared_limits.py: from the database)."""
        t.tokens = min(self.burst, t.tokens + dt * self.rate)

    def _in_flight_cap(self, tenant_id: str, t: _Tenant) -> int:
        """The tenant's requests this process may hold in flight now."""
        return self.max_in_flight

    async def admit_async(self, tenant_id: str) -> Refusal | None:
        """``admit`` for the event loop (shared_limits.py may ask the database first)."""
        return self.admit(tenant_id)

    def admit(self, tenant_id: str) -> Refusal | None:
        """None: admitted (call ``release`` when the request ends); else why not and when to retry."""
        now = self.clock()
        with self._lock:
            t = self._state(tenant_id, now)
            if self.max_in_flight and t.in_flight >= self._in_flight_cap(tenant_id, t):
                return Refusal("tenant-concurrency", 1, f"This tenant has {self.max_in_flight} requests in flight "
                               f"{self.where}, its limit (OLU_TENANT_MAX_IN_FLIGHT).")
            if self.share and t.compute <= 0.0:
                return Refusal("tenant-compute", _seconds(-t.compute / self.share if t.compute < 0 else 1.0),
                               f"This tenant's requests have occupied this process for more than its share "
                               f"({self.share:g} request-seconds per second, OLU_TENANT_COMPUTE_SHARE).")
            if self.rate:
                if t.tokens < 1.0:
                    return Refusal("tenant-requests", self._token_wait(tenant_id, t, now),
                                   f"This tenant is limited to {self.rate:g} requests per second over all its keys "
                                   "(OLU_TENANT_RATE_LIMIT).")
                t.tokens -= 1.0
            t.in_flight += 1
        return None

    def _token_wait(self, tenant_id: str, t: _Tenant, now: float) -> int:
        return _seconds((1.0 - t.tokens) / self.rate)

    def release(self, tenant_id: str) -> None:
        now = self.clock()
        with self._lock:
            t = self._state(tenant_id, now)
            t.in_flight = max(0, t.in_flight - 1)

    def hold_for(self, refusal: Refusal) -> float:
        """Seconds to hold this refusal back before answering it (0: answer at once)."""
        if not self.refusal_delay or self.held >= MAX_HELD:
            return 0.0
        return min(self.refusal_delay, float(refusal.retry_after))

    def in_flight(self, tenant_id: str) -> int:
        t = self._tenants.get(tenant_id)
        return 0 if t is None else t.in_flight


def _seconds(wait: float) -> int:
    return max(1, math.ceil(wait)) if wait > 0 else 1


class FairScheduler:
    """Per-tenant queues in front of the compute, served round robin, with at most ``slots`` computations at once and
    at most ``slots - 1`` of one tenant (at least 1).

    The worker-thread part of learn, unlearn and the predictions too large to answer on the event loop
    (app/api/models.py) runs only while it holds a slot.  A free slot is taken at once unless others wait or the
    tenant already holds its most; otherwise the request waits in its tenant's queue, and each freed slot goes to the
    first tenant of the round that may take one: a tenant served moves to the back of the round.  So one tenant never
    holds every slot, a request of another tenant waits for at most one slot to free (not for a flooding tenant's
    whole queue), and the computations running at once stay about the server's cores (``OLU_COMPUTE_SLOTS``): fewer
    threads compete with the event loop for the GIL, and the loop answers the small requests (issue 29).
    Event-loop only (no lock): ``slot`` is awaited from the handlers.
    """

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self.per_tenant = max(1, self.slots - 1)
        self.busy = 0
        self._running: dict[str, int] = {}  # tenant -> slots it holds
        self._queues: OrderedDict[str, deque] = OrderedDict()  # tenant -> its waiters (futures), in round order

    def waiting(self, tenant_id: str | None = None) -> int:
        if tenant_id is not None:
            return len(self._queues.get(tenant_id, ()))
        return sum(len(q) for q in self._queues.values())

    def running(self, tenant_id: str) -> int:
        return self._running.get(tenant_id, 0)

    def _take(self, tenant_id: str) -> None:
        self.busy += 1
        self._running[tenant_id] = self._running.get(tenant_id, 0) + 1

    def _grant(self) -> None:
        while self.busy < self.slots:
            for tenant, queue in self._queues.items():  # the first of the round that may take one more
                if self._running.get(tenant, 0) < self.per_tenant:
                    break
            else:
                return
            waiter = queue.popleft()
            if queue:
                self._queues.move_to_end(tenant)  # served: to the back of the round
            else:
                del self._queues[tenant]
            if waiter.done():  # its request went away (cancelled) while it waited
                continue
            self._take(tenant)
            waiter.set_result(None)

    def _release(self, tenant_id: str) -> None:
        self.busy -= 1
        left = self._running[tenant_id] - 1
        if left:
            self._running[tenant_id] = left
        else:
            del self._running[tenant_id]
        self._grant()

    @asynccontextmanager
    async def slot(self, tenant_id: str):
        if self.busy < self.slots and not self._queues and self._running.get(tenant_id, 0) < self.per_tenant:
            self._take(tenant_id)
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._queues.setdefault(tenant_id, deque()).append(waiter)
            self._grant()  # a slot may be free for this tenant while the ones queued are at their most
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # granted just as it was cancelled: hand it on
                    self._release(tenant_id)
                raise
        try:
            yield
        finally:
            self._release(tenant_id)


def compute_slots(setting: int | None) -> int:
    """``OLU_COMPUTE_SLOTS``: None (unset) is the number of CPUs this process may run on, at least 2 (so that one
    tenant, which holds at most all but one, leaves a slot to the others); 0 turns the scheduler off."""
    if setting is not None:
        return max(0, int(setting))
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(2, cpus)
