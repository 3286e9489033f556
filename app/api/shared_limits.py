"""Per-tenant limits that hold for the deployment, not per process (issue 37 item 5), on PostgreSQL.

``SharedTenantLimiter`` is ``TenantLimiter`` (app/api/fairness.py) with two of its limits drawn from the database
that every replica shares:

- **requests**: one token bucket per tenant, a row of ``tenant_rate_buckets`` (tokens, and when they were counted
  by the database's clock, so replicas' clocks need not agree).  A replica draws tokens from it in leases of
  ``OLU_TENANT_LIMIT_LEASE_SECONDS`` of the rate (at least 1; 10 at the default 200 requests/s): one statement
  (``_DRAW``: refill, take, under the row's lock) every ``lease`` requests, not per request, drawn in the
  background once half the lease is spent (a request waits for the database only when its replica's lease is
  empty).  Every request admitted
  spent a token taken from the shared bucket, so the replicas together admit at most ``burst + rate * t`` in any
  ``t`` seconds, as one process would; a lease not spent within ``LEASE_TTL`` is dropped (its tokens are lost, never
  handed out twice), so an idle replica does not hold tokens back.  When the bucket is empty, the replica refuses
  without asking again until the bucket should hold a token (``retry_at``).
- **concurrency**: each replica holds a number of in-flight slots per tenant, a row of ``tenant_slots`` (replica,
  slots, expiry).  A request that finds every slot of its replica busy claims one more (one claim for all the
  requests waiting at that moment), granted while the live
  slots of all replicas stay within ``OLU_TENANT_MAX_IN_FLIGHT`` (checked under the bucket row's lock).  Slots
  not used during a ``SWEEP_SECONDS`` period are given back, and a heartbeat renews the replica's rows every sweep;
  a replica that dies stops renewing and its slots count no more after ``SLOT_TTL`` seconds.

The compute share stays per process: it measures the process's own time (fairness.py).  SQLite deployments run one
process (its write lock is the process's): they keep ``TenantLimiter``.  Each database call runs in a worker thread,
one at a time per tenant per process; the requests that arrive meanwhile wait for its answer.
"""
from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import text

from .fairness import Refusal, TenantLimiter, _seconds

LEASE_TTL = 1.0  # seconds a leased token may wait to be spent
SLOT_TTL = 5.0  # seconds after its last heartbeat that a replica's slots stop counting
SWEEP_SECONDS = 0.5  # the heartbeat, and the period after which unused slots are given back
ASK_AGAIN = 0.05  # seconds before a refused slot claim is retried
log = logging.getLogger("olu.limits")

_NOW = "extract(epoch from clock_timestamp())"
_CREATE = text(f"INSERT INTO tenant_rate_buckets (tenant_id, tokens, updated_at) VALUES (:tid, :burst, {_NOW}) "
               "ON CONFLICT (tenant_id) DO NOTHING")
# refill to now (the database's clock), take min(lease, whole tokens available): one statement under the row lock
_DRAW = text(f"""
WITH cur AS (
  SELECT tenant_id, LEAST(CAST(:burst AS float8),
                          tokens + GREATEST(0.0, {_NOW} - updated_at) * :rate) AS avail, updated_at
  FROM tenant_rate_buckets WHERE tenant_id = :tid FOR UPDATE)
UPDATE tenant_rate_buckets b
SET tokens = cur.avail - LEAST(CAST(:lease AS float8), GREATEST(0.0, floor(cur.avail))),
    updated_at = GREATEST(cur.updated_at, {_NOW})
FROM cur WHERE b.tenant_id = cur.tenant_id
RETURNING LEAST(CAST(:lease AS float8), GREATEST(0.0, floor(cur.avail))), cur.avail""")
_LOCK = text("SELECT tokens FROM tenant_rate_buckets WHERE tenant_id = :tid FOR UPDATE")
_LIVE_SLOTS = text(f"SELECT COALESCE(SUM(slots), 0) FROM tenant_slots WHERE tenant_id = :tid AND expires_at > {_NOW}")
_CLAIM = text(f"INSERT INTO tenant_slots (tenant_id, replica, slots, expires_at) VALUES (:tid, :me, :n, {_NOW} + :ttl) "
              f"ON CONFLICT (tenant_id, replica) DO UPDATE SET slots = tenant_slots.slots + :n, "
              f"expires_at = {_NOW} + :ttl")
_DEAD = text(f"DELETE FROM tenant_slots WHERE tenant_id = :tid AND expires_at < {_NOW} - 60")
_GIVE_BACK = text("UPDATE tenant_slots SET slots = slots - :n WHERE tenant_id = :tid AND replica = :me")
_HEARTBEAT = text(f"UPDATE tenant_slots SET expires_at = {_NOW} + :ttl WHERE replica = :me AND slots > 0")
_LEAVE = text("DELETE FROM tenant_slots WHERE replica = :me")
# the limits' own writes need not wait for the WAL's flush: a crash loses at most the last lease's bookkeeping (a
# few tokens given back to the tenant, or slots that expire anyway), never a client's data
_NO_FLUSH = text("SET LOCAL synchronous_commit TO OFF")


@dataclass
class _Lease:
    until: float = 0.0  # the leased tokens may be spent until then (this process's clock)
    retry_at: float = 0.0  # the shared bucket has no token before about then: do not ask sooner
    wait: float = 0.0  # seconds the shared bucket lacked a token at the last ask
    slots: int = 0  # in-flight slots this replica holds for the tenant
    peak: int = 0  # the most of them in use since the last sweep
    slot_retry_at: float = 0.0  # a claim was refused: do not ask again before then
    want_slots: int = 0  # requests waiting for a slot now (one claim asks for all of them)
    busy: asyncio.Future | None = None  # the database call under way for this tenant


class SharedTenantLimiter(TenantLimiter):
    def __init__(self, db, rate: float | None, burst: float | None, max_in_flight: int | None,
                 compute_share: float | None, compute_burst: float | None, refusal_delay: float = 0.0,
                 lease_seconds: float = 0.05, clock=time.monotonic):
        super().__init__(rate, burst, max_in_flight, compute_share, compute_burst, refusal_delay, clock)
        self.db = db
        self.lease = max(1, min(int(self.burst), math.floor(self.rate * lease_seconds))) if self.rate else 0
        self.replica = secrets.token_hex(8)
        self.where = "over the deployment"
        self._leases: dict[str, _Lease] = {}
        self._sweeper: asyncio.Task | None = None
        self._prefetches: set[asyncio.Task] = set()  # the background lease draws under way
        self.round_trips = 0  # database calls made (the bench divides by the requests admitted)

    # ---- fairness.TenantLimiter hooks: tokens only from leases, slots only as held --------------------------

    def _first_tokens(self) -> float:
        return 0.0

    def _refill(self, t, dt: float) -> None:
        pass  # the tokens are refilled in the shared bucket, not here

    def _in_flight_cap(self, tenant_id: str, t) -> int:
        lease = self._leases.get(tenant_id)
        return 0 if lease is None else min(lease.slots, self.max_in_flight)

    def _token_wait(self, tenant_id: str, t, now: float) -> int:
        lease = self._leases.get(tenant_id)
        return _seconds(max(lease.retry_at - now if lease is not None else 0.0, 1.0 / self.rate))

    # ---- admission ------------------------------------------------------------------------------------------

    async def admit_async(self, tenant_id: str) -> Refusal | None:
        if self._sweeper is None and self.max_in_flight:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        counted: _Lease | None = None  # the lease whose ``want_slots`` counts this request
        try:
            for _ in range(3):  # a lease may be spent by the requests that waited for it too
                lease = self._leases.setdefault(tenant_id, _Lease())  # again: a sweep may drop an idle one
                now = self.clock()
                with self._lock:
                    t = self._state(tenant_id, now)
                    if self.rate and lease.until <= now:
                        t.tokens = 0.0  # a lease not spent in time is dropped
                    want_tokens = bool(self.rate) and t.tokens < 1.0 and now >= lease.retry_at
                    want_slot = (bool(self.max_in_flight) and t.in_flight >= lease.slots
                                 and lease.slots < self.max_in_flight and now >= lease.slot_retry_at)
                if not (want_tokens or want_slot):
                    break
                if want_slot and counted is not lease:
                    if counted is not None:
                        counted.want_slots -= 1
                    counted = lease
                    lease.want_slots += 1
                if lease.busy is not None:
                    await asyncio.shield(lease.busy)
                    continue
                if not await self._refresh(tenant_id, lease, want_tokens, want_slot):
                    # the database is unreachable: this request is not refused for that (it will answer the
                    # database's failure); it counts in flight here
                    with self._lock:
                        self._state(tenant_id, self.clock()).in_flight += 1
                    return None
        finally:
            if counted is not None:
                counted.want_slots -= 1
        refusal = self.admit(tenant_id)
        if refusal is None:
            lease = self._leases.setdefault(tenant_id, _Lease())
            lease.peak = max(lease.peak, self.in_flight(tenant_id))
            t = self._tenants.get(tenant_id)
            if (self.lease > 1 and lease.busy is None and t is not None and t.tokens < self.lease / 2
                    and self.clock() >= lease.retry_at):  # the next lease, drawn before this one runs out
                task = asyncio.get_running_loop().create_task(self._refresh(tenant_id, lease, True, False))
                self._prefetches.add(task)
                task.add_done_callback(self._prefetches.discard)
        return refusal

    def _refresh(self, tenant_id: str, lease: _Lease, want_tokens: bool, want_slot: bool):
        """One database call for the tenant (``_ask`` on a worker thread), marked under way (``busy``) from now, not
        from when the coroutine first runs; it answers False if the call failed.  A slot claim asks for one slot
        per request waiting for one."""
        lease.busy = asyncio.get_running_loop().create_future()
        slots = max(1, lease.want_slots) if want_slot else 0
        return self._refreshing(tenant_id, lease, want_tokens, slots)

    async def _refreshing(self, tenant_id: str, lease: _Lease, want_tokens: bool, want_slots: int) -> bool:
        try:
            granted, avail, slots = await asyncio.to_thread(self._ask, tenant_id, want_tokens, want_slots)
        except Exception:
            log.warning("shared tenant limits: the database call failed", exc_info=True)
            return False
        finally:
            lease.busy.set_result(None)
            lease.busy = None
        now = self.clock()
        with self._lock:
            t = self._state(tenant_id, now)
            if want_tokens:
                t.tokens = (t.tokens if lease.until > now else 0.0) + granted
                lease.until = now + LEASE_TTL
                if granted == 0:  # empty: the next token in (1 - avail) / rate seconds
                    lease.wait = (1.0 - avail) / self.rate
                    lease.retry_at = now + min(lease.wait, 1.0)
            if want_slots:
                lease.slots += slots
                if slots < want_slots:
                    lease.slot_retry_at = now + ASK_AGAIN
        return True

    def _ask(self, tenant_id: str, want_tokens: bool, want_slots: int) -> tuple[int, float, int]:
        """One transaction: draw a lease of tokens, claim up to ``want_slots`` more slots (worker thread)."""
        self.round_trips += 1
        granted, avail, slots = 0, 0.0, 0
        params = {"tid": tenant_id, "burst": self.burst if self.rate else 1.0, "rate": self.rate or 0.0,
                  "lease": self.lease, "me": self.replica, "ttl": SLOT_TTL}
        with self.db.engine.begin() as conn:
            conn.execute(_NO_FLUSH)
            if want_tokens:
                row = conn.execute(_DRAW, params).first()
                if row is None:  # the tenant's first request: its bucket starts full
                    conn.execute(_CREATE, params)
                    row = conn.execute(_DRAW, params).first()
                granted, avail = int(row[0]), float(row[1])
            if want_slots:
                conn.execute(_CREATE, params)
                conn.execute(_LOCK, params)  # the tenant's claims, one at a time over the deployment
                conn.execute(_DEAD, params)
                free = self.max_in_flight - int(conn.execute(_LIVE_SLOTS, params).scalar_one())
                slots = max(0, min(want_slots, free))
                if slots:
                    conn.execute(_CLAIM, {**params, "n": slots})
        return granted, avail, slots

    # ---- slots: give back the unused, heartbeat -------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep()
            except Exception:  # pragma: no cover - logged, retried at the next sweep
                log.warning("shared tenant limits: sweep failed", exc_info=True)

    async def sweep(self) -> None:
        give_back: dict[str, int] = {}
        now = self.clock()
        with self._lock:
            for tenant_id, lease in list(self._leases.items()):
                keep = max(self.in_flight(tenant_id), lease.peak)
                if lease.slots > keep:
                    give_back[tenant_id] = lease.slots - keep
                    lease.slots = keep
                lease.peak = self.in_flight(tenant_id)
                if not lease.slots and lease.busy is None and lease.until < now and lease.retry_at < now:
                    del self._leases[tenant_id]  # idle: nothing held, nothing to remember
        await asyncio.to_thread(self._sweep_db, give_back)

    def _sweep_db(self, give_back: dict[str, int]) -> None:
        with self.db.engine.begin() as conn:
            conn.execute(_NO_FLUSH)
            for tenant_id, n in give_back.items():
                conn.execute(_GIVE_BACK, {"tid": tenant_id, "me": self.replica, "n": n})
            conn.execute(_HEARTBEAT, {"me": self.replica, "ttl": SLOT_TTL})

    async def close(self) -> None:
        """At shutdown: the replica's slots are given back at once (not after SLOT_TTL)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        try:
            await asyncio.to_thread(self._leave)
        except Exception:  # pragma: no cover - the slots expire anyway
            log.warning("shared tenant limits: could not give the slots back at shutdown", exc_info=True)

    def _leave(self) -> None:
        with self.db.engine.begin() as conn:
            conn.execute(_LEAVE, {"me": self.replica})
