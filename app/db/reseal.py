"""Re-seal every secret value under the active encryption key (the step that completes a key rotation).

Run with the new key active and the old one(s) in ``OLU_ENCRYPTION_KEYS_OLD``::

    OLU_ENCRYPTION_KEY=<new> OLU_ENCRYPTION_KEYS_OLD=<old> python -m app.db.reseal

Safe while the service runs: each model is re-sealed in its own write transaction under the model's lock, and
a tenant's record key is rewritten in place (same key bytes, new seal), and so is the wrapped data key of every
retained chunk and of every state delta (the sealed chunks and deltas are not rewritten: envelope encryption,
app/db/retained.py, app/db/state_log.py).  Afterwards the old key can be
dropped from ``OLU_ENCRYPTION_KEYS_OLD``.  Plaintext values from before encryption existed are sealed too.
"""
from __future__ import annotations

from sqlalchemy import select

from ..crypto import Cipher
from .session import Database
from .operation_payloads import reseal_keys as reseal_operation_keys
from .retained import PURPOSE as RETAINED_KEY
from .state_log import PURPOSE as DELTA_KEY
from .tables import Model, ModelState, ModelStateDeltaKey, RetainedChunkKey, Tenant


def reseal_all(db: Database, cipher: Cipher) -> dict[str, int]:
    counts = {"tenants": 0, "models": 0, "retained_keys": 0, "delta_keys": 0}
    with db.read() as s:
        tenant_ids = list(s.scalars(select(Tenant.id)))
        model_ids = list(s.scalars(select(ModelState.model_id)))
    for tid in tenant_ids:
        with db.write() as s:
            row = s.scalars(select(Tenant).where(Tenant.id == tid).with_for_update()).one()
            if cipher.key_id_in(row.record_key) != cipher.active_key_id:
                row.record_key = cipher.seal(cipher.open(row.record_key, "record-key", tid), "record-key", tid)
                counts["tenants"] += 1
    for mid in model_ids:
        with db.write() as s:
            q = select(Model.id).where(Model.id == mid)
            if not db.is_sqlite:
                q = q.with_for_update()  # the model's lock: no write interleaves
            s.execute(q)
            state = s.get(ModelState, mid)
            if state is not None and cipher.key_id_in(state.blob) != cipher.active_key_id:
                state.blob = cipher.seal(cipher.open(state.blob, "state", mid), "state", mid)
                counts["models"] += 1
            # the data keys of retained chunks and state deltas are re-wrapped; the sealed rows are not rewritten
            for key in s.scalars(select(RetainedChunkKey).where(RetainedChunkKey.model_id == mid)):
                if cipher.key_id_in(key.wrapped) != cipher.active_key_id:
                    owner = f"{mid}:{key.chunk_id}"
                    key.wrapped = cipher.seal(cipher.open(key.wrapped, RETAINED_KEY, owner), RETAINED_KEY, owner)
                    counts["retained_keys"] += 1
            for key in s.scalars(select(ModelStateDeltaKey).where(ModelStateDeltaKey.model_id == mid)):
                if cipher.key_id_in(key.wrapped) != cipher.active_key_id:
                    owner = f"{mid}:{key.version}"
                    key.wrapped = cipher.seal(cipher.open(key.wrapped, DELTA_KEY, owner), DELTA_KEY, owner)
                    counts["delta_keys"] += 1
    counts["operation_keys"] = reseal_operation_keys(db, cipher)  # the sealed requests of running operations
    return counts


def main() -> None:  # pragma: no cover - thin CLI
    from ..config import Settings
    from ..crypto import load_cipher

    settings = Settings()
    cipher = load_cipher(settings.data_dir,
                         settings.encryption_key.get_secret_value() if settings.encryption_key else None,
                         settings.encryption_keys_old.get_secret_value() if settings.encryption_keys_old else None)
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        print(reseal_all(db, cipher))
    finally:
        db.dispose()


if __name__ == "__main__":  # pragma: no cover
    main()
