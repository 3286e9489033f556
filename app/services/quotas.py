"""Per-tenant quotas (issue 29, finding 3): live models, records held and bytes stored.

Each tenant's quota is its own (``tenants.quota_models`` / ``quota_records`` / ``quota_bytes``, set by the admin
with ``PUT /v1/tenants/{id}/quotas``) or, where that is NULL, the deployment's default (``OLU_TENANT_MAX_MODELS``,
``OLU_TENANT_MAX_RECORDS``, ``OLU_TENANT_MAX_BYTES``); 0 means no limit.

Usage is that of the tenant's live models: their number, their records held (``n_records - n_forgotten``) and
their ``bytes_stored``, which every write sets (``model_bytes``).  It is kept as counters (issue 32), in shards by
model (app/db/usage_shards.py, issue 37 item 6): every write adds its delta (``bump``) in its own transaction, so a
quota check reads at most ``SHARDS`` rows, not a sum over all the tenant's models (30 ms at 10⁴ models on
PostgreSQL; docs/performance.md §10), and writes to different models of a tenant do not queue on one row.  A model's
bytes are the byte lengths of what the model keeps, namely
its sealed secret state, and per record held 32 bytes of commitment and 8 of step in the record index, 32 more of
example MAC for a family whose clients send features to forget, and for a family that keeps its data the example's
8 (dim + 1) bytes and its 8-byte step in its sealed chunk (app/db/retained.py; a chunk's nonce, tag and wrapped key,
about 100 bytes per thousands of records, are not counted).  Not counted: the database's own page
and index overhead, and what is kept for audit after a forget or an erasure (receipts, the log, the forgotten
records' commitments), which a quota must not refuse to write.

The audit trail (issue 37, F5-A) has a quota of its own, ``audit_bytes`` (``quota_audit_bytes``, default
``OLU_TENANT_MAX_AUDIT_BYTES``): what the tenant's forgets, model deletions and checkpoints left for audit
(``usage_audit_bytes``, kept by app/services/audit_usage.py).  Nothing frees it (the log is append-only) and it never
refuses a forget or a deletion; once it is spent, every request that would let the trail grow further -- a learn
(its records will be forgotten or erased one day) and a model creation -- is refused.  So the trail passes the quota
by at most what the records held then leave when they are forgotten or erased.

A model creation past the models (or bytes) quota, and a learn past the records or bytes quota, answer 409
``quota-exceeded`` naming the quota, its limit and the usage, and change nothing: the learn is checked before it
computes, and again at the end of its write transaction against the committed usage, by quota escrow
(app/db/usage_shards.py: each shard holds a slice of what is left of the quota; a write that its shard's slice
cannot hold redistributes under the tenant's row lock), so concurrent writes of one tenant cannot pass a quota
together; a refusal there rolls the whole learn back.  Forgets, retrains and deletions are never
refused by a quota; forgetting records and deleting models give their quota back.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select

from ..db import usage_shards
from ..db.tables import Tenant
from ..errors import Problem

QUOTAS = ("models", "records", "bytes", "audit_bytes")
GROWING = ("models", "records")  # a request adding these is refused while the audit allowance is spent
_T = Tenant.__table__
_AUDIT = select(_T.c.usage_audit_bytes).where(_T.c.id == bindparam("tid"))
_QUOTAS = select(_T.c.quota_models, _T.c.quota_records, _T.c.quota_bytes, _T.c.quota_audit_bytes).where(
    _T.c.id == bindparam("tid"))
INDEX_BYTES = 32 + 8  # commitment and step of a record in the record index
MAC_BYTES = 32
SEALED_OVERHEAD = 12 + 16  # AES-GCM nonce and tag of a sealed retained example


def record_bytes(engine, dim: int, wrapped_key_bytes: int) -> int:
    """The bytes one record held by this model occupies (module docstring)."""
    n = INDEX_BYTES
    if engine.needs_retained_data:
        n += 8 * (dim + 1) + 8  # its row and step in a sealed chunk (wrapped_key_bytes: per chunk, not counted)
    elif engine.needs_deletion_features:
        n += MAC_BYTES
    return n


def model_bytes(state_bytes: int, records_held: int, per_record: int) -> int:
    return int(state_bytes) + int(records_held) * int(per_record)


def bump(s, tenant_id: str, model_id: str, models: int = 0, records: int = 0, stored: int = 0) -> None:
    """Add a write's change of the tenant's live models, records held and bytes stored (by model ``model_id``) to
    its usage counters, in the write's transaction (a rollback takes it back with the write).  Applied at the end
    of the transaction (usage_shards.py), checked against the quotas where ``check_locked`` is called."""
    usage_shards.note(s, tenant_id, model_id, models=models, records=records, stored=stored)


class Quotas:
    def __init__(self, db, settings):
        self.db = db
        self.defaults = {"models": int(getattr(settings, "tenant_max_models", 0) or 0),
                         "records": int(getattr(settings, "tenant_max_records", 0) or 0),
                         "bytes": int(getattr(settings, "tenant_max_bytes", 0) or 0),
                         "audit_bytes": int(getattr(settings, "tenant_max_audit_bytes", 0) or 0)}

    def limits(self, s, tenant_id: str) -> dict[str, int | None]:
        """The tenant's effective quotas (None: no limit; shown as 0 by ``view``)."""
        row = s.connection().execute(_QUOTAS, {"tid": tenant_id}).first()
        own = (None,) * len(QUOTAS) if row is None else tuple(row)
        out: dict[str, int | None] = {}
        for name, value in zip(QUOTAS, own):
            v = self.defaults[name] if value is None else int(value)
            out[name] = v or None
        return out

    def overrides(self, s, tenant_id: str) -> dict[str, int | None]:
        row = s.connection().execute(_QUOTAS, {"tid": tenant_id}).first()
        return dict(zip(QUOTAS, (None,) * len(QUOTAS) if row is None else tuple(row)))

    @staticmethod
    def usage(s, tenant_id: str) -> dict[str, int]:
        conn = s.connection()
        models, records, stored = usage_shards.usage(conn, tenant_id)
        audit = conn.execute(_AUDIT, {"tid": tenant_id}).scalar_one_or_none()
        return {"models": models, "records": records, "bytes": stored, "audit_bytes": int(audit or 0)}

    def check_locked(self, s, tenant_id: str, grew: dict[str, int]) -> None:
        """At the end of a write that grew the tenant's data by ``grew`` (noted with ``bump``): apply its pending
        usage deltas now, 409 quota-exceeded if the committed usage plus ``grew`` passes a quota (exact under
        concurrent writes: usage_shards.py's escrow), or if it grows the tenant while its audit allowance is spent
        (read as committed: a concurrent forget may pass it by what it leaves, as the module docstring allows)."""
        limits = self.limits(s, tenant_id)
        checked = tuple(k for k in grew if k in usage_shards.DIMENSIONS)
        try:
            usage_shards.grow(s, tenant_id, {k: limits[k] for k in usage_shards.DIMENSIONS}, checked)
        except usage_shards.QuotaExceeded as e:
            raise quota_problem(e.name, e.limit, e.usage, e.requested) from None
        if any(k in GROWING for k in grew) and limits["audit_bytes"] is not None:
            self.check(s, tenant_id, {"audit_bytes": 0}, limits=limits)

    def check(self, s, tenant_id: str, adding: dict[str, int], usage: dict[str, int] | None = None,
              limits: dict[str, int | None] | None = None) -> None:
        """409 quota-exceeded when ``usage`` (default: read now) plus ``adding`` passes a quota, or when ``adding``
        grows the tenant (``GROWING``: a learn, a creation) while its audit allowance is spent."""
        limits = self.limits(s, tenant_id) if limits is None else limits
        if any(k in GROWING for k in adding):
            adding = {**adding, "audit_bytes": 0}
        if not any(limits[k] is not None for k in adding):
            return
        used = self.usage(s, tenant_id) if usage is None else usage
        for name, more in adding.items():
            limit = limits[name]
            if name == "audit_bytes":
                if limit is not None and used[name] >= limit:
                    raise audit_problem(limit, used[name])
            elif limit is not None and used[name] + more > limit:
                raise quota_problem(name, limit, used[name], more)

    def view(self, s, tenant_id: str) -> dict[str, Any]:
        """The quotas in force (0: no limit), the tenant's own settings (None: the deployment's default) and the
        usage: one spelling each (issue 37 item 8: ``null`` meant "no limit" in one and "default" in the other)."""
        return {"quotas": {k: v or 0 for k, v in self.limits(s, tenant_id).items()},
                "quota_overrides": self.overrides(s, tenant_id), "usage": self.usage(s, tenant_id)}


_WHAT = {"models": "live models", "records": "records held (learned and not forgotten, nor dropped by a restart)",
         "bytes": "bytes stored (estimated from the byte lengths of its states, records and retained examples)"}


# what frees each quota (issue 40: the models quota's refusal suggested forgetting records, which frees no model);
# tests/test_messages.py does each and sees the refused request accepted
_FREES = {"models": "delete one of the tenant's models (DELETE /v1/models/{id}: its state and records are erased, "
                    "with a signed erasure receipt); forgetting records does not free a model",
          "records": "forget records the tenant holds (POST /v1/models/{id}/unlearn) or delete a model "
                     "(DELETE /v1/models/{id}), which gives back every record it held",
          "bytes": "delete a model (DELETE /v1/models/{id}), or forget records (POST /v1/models/{id}/unlearn), which "
                   "frees what the model kept for them"}
_FREED_BY = {"models": ["DELETE /v1/models/{id}"],
             "records": ["POST /v1/models/{id}/unlearn", "DELETE /v1/models/{id}"],
             "bytes": ["DELETE /v1/models/{id}", "POST /v1/models/{id}/unlearn"]}


def quota_problem(name: str, limit: int, usage: int, requested: int) -> Problem:
    return Problem(409, "quota-exceeded",
                   f"This tenant's quota of {_WHAT[name]} is {limit}; it uses {usage} and this request needs "
                   f"{requested} more. Nothing was changed: {_FREES[name]}; or ask the administrator to raise the "
                   "quota (PUT /v1/tenants/{id}/quotas).", quota=name, limit=limit, usage=usage, requested=requested,
                   freed_by=_FREED_BY[name])


def audit_problem(limit: int, usage: int) -> Problem:
    return Problem(409, "quota-exceeded",
                   f"This tenant's audit allowance (quota audit_bytes: the receipts, log entries and commitments its "
                   f"forgets and model deletions leave for audit) is {limit} bytes and {usage} are used, so no new "
                   "records or models are accepted. Nothing was changed. Forgets and deletions are still answered; "
                   "the audit trail is never deleted, so only the administrator can make room, by raising the quota "
                   "(PUT /v1/tenants/{id}/quotas, audit_bytes).", quota="audit_bytes", limit=limit, usage=usage,
                   requested=0, freed_by=["PUT /v1/tenants/{id}/quotas"])
