"""A tenant's usage counters in shards, with quota escrow (issue 37 item 6).

A tenant's live models, records held and bytes stored are kept in ``SHARDS`` rows of ``tenant_usage_shards``, one per
hash of the model id: writes to different models of one tenant update different rows, so their transactions no
longer queue on one row lock (before: the tenant row's, held from the first write of a learn to its commit).  Usage
is the sum of the tenant's shards.

Quotas still hold exactly, by escrow (O'Neil, "The escrow transactional method", TODS 1986): each shard holds a slice
of the tenant's quota, ``cap_*``, with Σ cap ≤ limit, so a shard whose own usage stays within its cap keeps the
tenant within its quota without looking at the other shards.  A growing write adds its delta to its shard only if the
shard stays within its cap and the caps were computed for the limits in force (``basis``): one UPDATE of one row
(``grow``, the fast path).  Otherwise it redistributes (``rebalance``): under the tenant row's lock, it locks every
shard of the tenant, sums their committed usage, refuses (``QuotaExceeded``) if that sum plus its delta passes a
quota, else adds its delta and gives every shard its usage plus an equal share of what is left of each quota.  So a
write is refused exactly when the committed usage plus its own delta passes the quota, as under one row lock.

Deltas are applied at the end of the write's transaction (``bump`` only notes them; the pending ones are applied by
``apply_pending``, which runs before every commit), so that a transaction holds a shard's lock only after every other
lock it takes: a rebalance (tenant row, then shards in order) never waits for a writer that waits for it.
Deltas that no quota checks (a forget, a retrain, a deletion: never refused) are added with no condition; one that
takes a shard past its cap sends the next growing write of that shard to ``rebalance``.
"""
from __future__ import annotations

import zlib
from collections.abc import Mapping

from sqlalchemy import bindparam, select, text

from .tables import Tenant, TenantUsageShard

SHARDS = 16
DIMENSIONS = ("models", "records", "bytes")
UNLIMITED = 1 << 62  # the cap of a dimension with no quota
_PENDING = "olu.usage_pending"
_S = TenantUsageShard.__table__
_USAGE = select(_S.c.models, _S.c.records, _S.c.bytes).where(_S.c.tenant_id == bindparam("tid"))
_LOCK_TENANT = select(Tenant.__table__.c.id).where(Tenant.__table__.c.id == bindparam("tid")).with_for_update()
_LOCK_SHARDS = select(_S.c.shard, _S.c.models, _S.c.records, _S.c.bytes).where(
    _S.c.tenant_id == bindparam("tid")).order_by(_S.c.shard).with_for_update()
# an unconditioned delta (insert the shard row if the tenant has none yet); the caps stay as they are
_ADD = text("INSERT INTO tenant_usage_shards (tenant_id, shard, models, records, bytes, cap_models, cap_records, "
            "cap_bytes, basis) VALUES (:tid, :shard, :dm, :dr, :db, 0, 0, 0, '') "
            "ON CONFLICT (tenant_id, shard) DO UPDATE SET models = tenant_usage_shards.models + :dm, "
            "records = tenant_usage_shards.records + :dr, bytes = tenant_usage_shards.bytes + :db")
_GROW = text("UPDATE tenant_usage_shards SET models = models + :dm, records = records + :dr, bytes = bytes + :db "
             "WHERE tenant_id = :tid AND shard = :shard AND basis = :basis AND models + :dm <= cap_models "
             "AND records + :dr <= cap_records AND bytes + :db <= cap_bytes")
_SET = text("UPDATE tenant_usage_shards SET models = :models, records = :records, bytes = :bytes, "
            "cap_models = :cap_models, cap_records = :cap_records, cap_bytes = :cap_bytes, basis = :basis "
            "WHERE tenant_id = :tid AND shard = :shard")
_INSERT_EMPTY = text("INSERT INTO tenant_usage_shards (tenant_id, shard, models, records, bytes, cap_models, "
                     "cap_records, cap_bytes, basis) VALUES (:tid, :shard, 0, 0, 0, 0, 0, 0, '') "
                     "ON CONFLICT (tenant_id, shard) DO NOTHING")


class QuotaExceeded(Exception):
    def __init__(self, name: str, limit: int, usage: int, requested: int):
        super().__init__(name)
        self.name, self.limit, self.usage, self.requested = name, limit, usage, requested


def shard_of(model_id: str) -> int:
    return zlib.crc32(model_id.encode()) % SHARDS


def note(s, tenant_id: str, model_id: str, models: int = 0, records: int = 0, stored: int = 0) -> None:
    """Remember a write's change of the tenant's usage, applied before the transaction commits."""
    if not (models or records or stored):
        return
    pending = s.info.setdefault(_PENDING, {})
    d = pending.setdefault((tenant_id, shard_of(model_id)), [0, 0, 0])
    d[0] += int(models)
    d[1] += int(records)
    d[2] += int(stored)


def usage(conn, tenant_id: str) -> tuple[int, int, int]:
    """The tenant's committed usage (models, records, bytes): the sum of its shards."""
    total = [0, 0, 0]
    for row in conn.execute(_USAGE, {"tid": tenant_id}):
        for i in range(3):
            total[i] += int(row[i])
    return total[0], total[1], total[2]


def _basis(limits: Mapping[str, int | None]) -> str:
    return ":".join(str(limits.get(k) or 0) for k in DIMENSIONS)


def grow(s, tenant_id: str, limits: Mapping[str, int | None], checked: tuple[str, ...]) -> None:
    """Apply the tenant's pending deltas now, each shard's within its slice of the quotas (fast path) or by
    ``rebalance``; ``QuotaExceeded`` when the committed usage plus a delta passes a quota named in ``checked``.
    The caller's transaction holds the shards' locks until it ends."""
    pending = s.info.get(_PENDING, {})
    conn = s.connection()
    for key in sorted(k for k in pending if k[0] == tenant_id):
        delta = pending.pop(key)
        params = {"tid": tenant_id, "shard": key[1], "dm": delta[0], "dr": delta[1], "db": delta[2],
                  "basis": _basis(limits)}
        if conn.execute(_GROW, params).rowcount != 1:
            rebalance(s, tenant_id, key[1], delta, limits, checked)


def rebalance(s, tenant_id: str, shard: int, delta, limits: Mapping[str, int | None],
              checked: tuple[str, ...]) -> None:
    """Under the tenant's row lock and every shard's: refuse the delta if it passes a checked quota, else add it
    to ``shard`` and give each shard its usage plus an equal share of each quota's remainder (the escrow)."""
    conn = s.connection()
    if conn.dialect.name != "sqlite":  # SQLite's write transaction holds the database's lock already
        conn.execute(_LOCK_TENANT, {"tid": tenant_id})
    conn.execute(_INSERT_EMPTY, {"tid": tenant_id, "shard": shard})
    rows = [list(r) for r in conn.execute(_LOCK_SHARDS, {"tid": tenant_id})]
    totals = [sum(int(r[i + 1]) for r in rows) for i in range(3)]
    for name in checked:
        i = DIMENSIONS.index(name)
        limit = limits.get(name)
        if limit is not None and totals[i] + delta[i] > limit:
            raise QuotaExceeded(name, limit, totals[i], delta[i])
    for r in rows:
        if r[0] == shard:
            for i in range(3):
                r[i + 1] = int(r[i + 1]) + delta[i]
    caps = []
    for i, name in enumerate(DIMENSIONS):
        limit = limits.get(name)
        if limit is None:
            caps.append([UNLIMITED] * len(rows))
            continue
        spare = limit - (totals[i] + delta[i])
        share, rest = divmod(spare, len(rows))  # floor division: Σ cap = limit exactly, even when spare < 0
        caps.append([int(r[i + 1]) + share + (rest if r[0] == shard else 0) for r in rows])
    basis = _basis(limits)
    conn.execute(_SET, [{"tid": tenant_id, "shard": r[0], "models": r[1], "records": r[2], "bytes": r[3],
                         "cap_models": caps[0][j], "cap_records": caps[1][j], "cap_bytes": caps[2][j],
                         "basis": basis} for j, r in enumerate(rows)])


def apply_pending(s) -> None:
    """Before a commit: add the deltas no quota checked (forgets, retrains, deletions), each to its shard."""
    pending = s.info.pop(_PENDING, None)
    if not pending:
        return
    conn = s.connection()
    for (tenant_id, shard), d in sorted(pending.items()):
        if any(d):
            conn.execute(_ADD, {"tid": tenant_id, "shard": shard, "dm": d[0], "dr": d[1], "db": d[2]})


def discard_pending(s) -> None:
    s.info.pop(_PENDING, None)
