"""Tenants and their API keys.  Keys are shown once and stored as SHA-256 hashes."""
from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

from sqlalchemy import bindparam, select, update

from ..errors import Problem
from .auth import Principal
from ..db.session import Database
from ..db.tables import ApiKey, Tenant
from ..ids import new_id, utcnow
from .records import open_record_key, seal_record_key

ALL_SCOPES = ("write", "predict", "audit")


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


# the columns authentication needs, looked up by the key's public prefix
_KEY_BY_PREFIX = select(ApiKey.id, ApiKey.tenant_id, ApiKey.key_hash, ApiKey.scopes, ApiKey.revoked_at).where(
    ApiKey.prefix == bindparam("prefix"))
AUTH_CACHE_MAX = 10_000


def _new_key() -> tuple[str, str]:
    """(prefix, full key).  The prefix is a public lookup handle; the rest is 256 bits of secret."""
    prefix = secrets.token_hex(6)
    return prefix, f"olu_{prefix}_{secrets.token_urlsafe(32)}"


class TenantService:
    """``auth_cache_seconds`` > 0 keeps successful authentications per process for that long: a key revoked
    through this service is refused at once; one revoked elsewhere (another replica, the CLI) within that time."""

    def __init__(self, db: Database, cipher=None, auth_cache_seconds: float = 0.0, clock=time.monotonic):
        self.db, self.cipher = db, cipher  # cipher: app.crypto.Cipher sealing record keys at rest
        self.auth_cache_seconds, self.clock = max(0.0, float(auth_cache_seconds or 0.0)), clock
        self._auth_cache: dict[str, tuple[float, Principal]] = {}  # SHA-256 of the key -> (expiry, principal)
        self._auth_lock = threading.Lock()
        self._revocations = 0  # bumped on every revocation: a lookup that raced one is not cached
        # told of every revocation through this process: (tenant id or None, SHA-256 digest of the key or None)
        self.on_revoke = None

    def create_tenant(self, name: str) -> dict:
        now = utcnow()
        tenant_id = new_id("ten")
        with self.db.write() as s:
            s.add(Tenant(id=tenant_id, name=name, record_key=seal_record_key(self.cipher, tenant_id, secrets.token_bytes(32)), log_size=0, created_at=now))
            s.flush()
            key_id, raw = self._add_key(s, tenant_id, ALL_SCOPES, "initial")
        return {"id": tenant_id, "name": name, "api_key": raw}

    def create_key(self, tenant_id: str, scopes: list[str], label: str | None) -> dict:
        scopes = sorted(set(scopes), key=ALL_SCOPES.index)
        with self.db.write() as s:
            tenant = s.get(Tenant, tenant_id)
            if tenant is None:
                raise Problem(404, "tenant-not-found", f"No tenant {tenant_id}.")
            if tenant.deleted_at is not None and set(scopes) != {"audit"}:
                raise Problem(409, "tenant-deleted", f"Tenant {tenant_id} is deleted: only audit keys can be created.")
            key_id, raw = self._add_key(s, tenant_id, scopes, label)
        return {"id": key_id, "api_key": raw, "scopes": scopes, "label": label}

    def revoke_key(self, tenant_id: str, key_id: str) -> None:
        with self.db.write() as s:
            key = s.get(ApiKey, key_id)
            if key is None or key.tenant_id != tenant_id:
                raise Problem(404, "key-not-found", f"No key {key_id} for tenant {tenant_id}.")
            if key.revoked_at is None:
                key.revoked_at = utcnow()
            digest = bytes.fromhex(key.key_hash)
        self._drop_cached(lambda principal: principal.key_id == key_id)
        if self.on_revoke is not None:
            self.on_revoke(None, digest)

    def _drop_cached(self, revoked) -> None:
        """A revocation: authentications in flight are re-checked (the counter) and cached principals for which
        ``revoked(principal)`` holds leave the cache at once."""
        with self._auth_lock:
            self._revocations += 1
            self._auth_cache = {h: e for h, e in self._auth_cache.items() if not revoked(e[1])}

    def delete_tenant(self, tenant_id: str, models) -> dict:
        """Delete a tenant: revoke every key and mark it deleted (one transaction, so no new model can be created:
        ``ModelLifecycle.create`` reads the mark under a share lock), then erase every live model of the tenant
        (``models.erase_tenant_models``: one signed erasure receipt each, the same code path as
        DELETE /v1/models/{id}) in a second transaction that takes the models' locks in the order every other
        write does (model, then the tenant's log), so it never deadlocks with a concurrent unlearn.

        Retry-safe: a deleted tenant that still has live models (a crash between the two transactions) has them
        erased by the next call; a deleted tenant without live models is 404.  Kept for audit: the tenant row
        (name, sealed record key, log size), its signed log (receipts, Merkle nodes, checkpoints), the deleted
        models' public rows and ledgers, and the erased records' commitments (docs/operations.md)."""
        with self.db.write() as s:
            q = select(Tenant).where(Tenant.id == tenant_id)
            tenant = s.scalars(q if self.db.is_sqlite else q.with_for_update()).first()
            if tenant is None:
                raise Problem(404, "tenant-not-found", f"No tenant {tenant_id}.")
            already = tenant.deleted_at is not None
            revoked = 0
            if not already:
                tenant.deleted_at = utcnow()
                revoked = s.execute(update(ApiKey).where(ApiKey.tenant_id == tenant_id,
                                                         ApiKey.revoked_at.is_(None))
                                    .values(revoked_at=tenant.deleted_at)).rowcount
            deleted_at = tenant.deleted_at
        self._drop_cached(lambda principal: principal.tenant_id == tenant_id)
        if self.on_revoke is not None:
            self.on_revoke(tenant_id, None)
        with self.db.write() as s:
            receipts = models.erase_tenant_models(s, tenant_id)
        models.evict(r["model_id"] for r in receipts)
        if already and not receipts:
            raise Problem(404, "tenant-not-found", f"No tenant {tenant_id}.")
        return {"tenant_id": tenant_id, "deleted_at": deleted_at, "keys_revoked": int(revoked),
                "models_erased": [{"model_id": r["model_id"], "erasure_receipt_id": r["id"]} for r in receipts]}

    @staticmethod
    def _add_key(s, tenant_id: str, scopes, label) -> tuple[str, str]:
        prefix, raw = _new_key()
        key_id = new_id("key")
        s.add(ApiKey(id=key_id, tenant_id=tenant_id, prefix=prefix, key_hash=_hash(raw), scopes=" ".join(scopes),
                     label=label, created_at=utcnow(), revoked_at=None))
        return key_id, raw

    def cached_principal(self, raw: str) -> Principal | None:
        """The principal of a recently authenticated key, without I/O (None: not cached or expired)."""
        if not self.auth_cache_seconds or len(raw) > 200:
            return None
        entry = self._auth_cache.get(_hash(raw))
        if entry is None or entry[0] <= self.clock():
            return None
        return entry[1]

    def authenticate(self, raw: str) -> Principal | None:
        parts = raw.split("_")
        if len(parts) < 3 or parts[0] != "olu" or len(raw) > 200:
            return None
        digest = _hash(raw)
        if self.auth_cache_seconds:
            entry = self._auth_cache.get(digest)
            if entry is not None and entry[0] > self.clock():
                return entry[1]
        started, revocations = self.clock(), self._revocations
        with self.db.engine.connect() as c:
            key = c.execute(_KEY_BY_PREFIX, {"prefix": parts[1]}).first()
        if key is None or key.revoked_at is not None or not hmac.compare_digest(key.key_hash, digest):
            return None
        principal = Principal(key.tenant_id, frozenset(key.scopes.split()), key.id)
        if self.auth_cache_seconds:
            with self._auth_lock:
                if revocations == self._revocations:  # else a revocation may have raced this lookup
                    if len(self._auth_cache) >= AUTH_CACHE_MAX:
                        now = self.clock()
                        self._auth_cache = {h: e for h, e in self._auth_cache.items() if e[0] > now}
                        if len(self._auth_cache) >= AUTH_CACHE_MAX:
                            self._auth_cache = {}
                    # expiry counts from before the read: a revocation elsewhere is seen within the TTL
                    self._auth_cache[digest] = (started + self.auth_cache_seconds, principal)
        return principal

    def view(self, tenant_id: str, quotas, deleted_is_404: bool = False) -> dict:
        """The tenant with its quotas in force, its own quota settings and its usage (app/services/quotas.py)."""
        with self.db.read() as s:
            tenant = s.get(Tenant, tenant_id)
            if tenant is None or (deleted_is_404 and tenant.deleted_at is not None):
                raise Problem(404, "tenant-not-found", f"No tenant {tenant_id}.")
            return {"id": tenant.id, "name": tenant.name, "created_at": tenant.created_at,
                    "deleted_at": tenant.deleted_at, **quotas.view(s, tenant_id)}

    def set_quotas(self, tenant_id: str, values: dict, quotas) -> dict:
        """Set the tenant's own quotas (None: the deployment's default; 0: no limit).  Lowering one below the usage refuses no
        existing data: the next model creation or learn past it is refused."""
        with self.db.write() as s:
            tenant = s.get(Tenant, tenant_id)
            if tenant is None or tenant.deleted_at is not None:
                raise Problem(404, "tenant-not-found", f"No tenant {tenant_id}.")
            tenant.quota_models, tenant.quota_records = values.get("models"), values.get("records")
            tenant.quota_bytes, tenant.quota_audit_bytes = values.get("bytes"), values.get("audit_bytes")
        return self.view(tenant_id, quotas)

    def record_key(self, s, tenant_id: str) -> bytes:
        return open_record_key(self.cipher, tenant_id,
                               s.execute(select(Tenant.record_key).where(Tenant.id == tenant_id)).scalar_one())
