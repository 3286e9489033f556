"""audit allowance, keyed journals, records a restart dropped (issue 37: F5-A, F5-C, item 8)

- ``tenants.quota_audit_bytes`` / ``usage_audit_bytes``: the audit trail's quota and what the tenant's forgets,
  model deletions and checkpoints left (app/services/audit_usage.py), backfilled here from the rows that exist, with
  the same per-row constants;
- ``idempotency_keys.model_id`` / ``first_step`` / ``last_step`` (an answered learn's records, so that forgetting one
  erases the row's fingerprint), an index on them and one on ``created_at`` (the retention purge);
  ``stream_events.first_step`` / ``last_step`` and their index;
- the stored fingerprints become keyed: ``idempotency_keys.request_hash`` and ``stream_events.body_sha256`` held the
  bare SHA-256 of the request (a database reader could confirm a guessed body); each becomes
  HMAC-SHA256(tenant fingerprint key, that SHA-256) (app/services/records.py ``keyed_fingerprint``), the form the
  service now computes, so stored answers still replay.  The record keys are opened with the encryption key (as
  0010 does: the caller's, else OLU_ENCRYPTION_KEY or <data dir>/encryption.key), only when such rows exist;
- ``models.n_dropped`` / ``dropped_through`` (app/services/dropped.py): 0, corrected at a restarted model's next
  forget.

Downgrade drops the columns; the keyed fingerprints stay keyed (the bare digests are not recoverable), so a
retry of an older request then answers 422 idempotency-key-reused instead of its replay.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 03:00:00
"""
from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

# app/services/audit_usage.py at this revision: bytes counted per row, besides its variable-length values
RECEIPT_ROW, NODE_ROW, RECORD_ROW, LEDGER_ROW, CHECKPOINT_ROW, MODEL_ROW = 216, 84, 228, 144, 56, 272
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _cipher():
    cfg = op.get_context().config
    cipher = cfg.attributes.get("cipher") if cfg is not None else None
    if cipher is not None:
        return cipher
    from app.config import Settings
    from app.crypto import KEY_FILE, load_cipher

    st = Settings()
    active = st.encryption_key.get_secret_value() if st.encryption_key else None
    if not active and not (st.data_dir / KEY_FILE).exists():
        raise RuntimeError("migration 0017 keys the stored request fingerprints: set OLU_ENCRYPTION_KEY or "
                           "OLU_DATA_DIR to the data directory holding encryption.key")
    return load_cipher(st.data_dir, active,
                       st.encryption_keys_old.get_secret_value() if st.encryption_keys_old else None)


def _key_fingerprints(conn) -> None:
    from app.services.records import fingerprint_key, keyed_fingerprint, open_record_key

    tenants = sa.table('tenants', sa.column('id', sa.String), sa.column('record_key', sa.LargeBinary))
    journals = (
        (sa.table('idempotency_keys', sa.column('tenant_id', sa.String), sa.column('key', sa.String),
                  sa.column('request_hash', sa.String)), 'key', 'request_hash'),
        (sa.table('stream_events', sa.column('tenant_id', sa.String), sa.column('event_id', sa.String),
                  sa.column('body_sha256', sa.String)), 'event_id', 'body_sha256'),
    )
    keys: dict[str, bytes] = {}
    cipher = [None]

    def key_of(tenant_id: str) -> bytes | None:
        if tenant_id not in keys:
            stored = conn.execute(sa.select(tenants.c.record_key).where(tenants.c.id == tenant_id)).scalar()
            if stored is None:
                return None
            cipher[0] = cipher[0] or _cipher()
            keys[tenant_id] = fingerprint_key(open_record_key(cipher[0], tenant_id, bytes(stored)))
        return keys[tenant_id]

    for table, pk, column in journals:
        rows = conn.execute(sa.select(table.c.tenant_id, table.c[pk], table.c[column])).all()
        for tenant_id, name, digest in rows:
            if not (isinstance(digest, str) and _HEX64.fullmatch(digest)):
                continue
            key = key_of(tenant_id)
            value = '' if key is None else keyed_fingerprint(key, bytes.fromhex(digest))  # no tenant: erased
            conn.execute(sa.update(table).where(table.c.tenant_id == tenant_id, table.c[pk] == name)
                         .values({column: value}))


_AUDIT = f"""UPDATE tenants SET usage_audit_bytes =
  COALESCE((SELECT SUM({RECEIPT_ROW} + LENGTH(body)) FROM receipts WHERE receipts.tenant_id = tenants.id), 0)
  + {NODE_ROW} * (SELECT COUNT(*) FROM merkle_nodes WHERE merkle_nodes.tenant_id = tenants.id)
  + {RECORD_ROW} * (SELECT COUNT(*) FROM records WHERE records.tenant_id = tenants.id)
  + COALESCE((SELECT SUM({CHECKPOINT_ROW} + LENGTH(body)) FROM checkpoints WHERE checkpoints.tenant_id = tenants.id), 0)
  + {LEDGER_ROW} * (SELECT COUNT(*) FROM ledger_entries JOIN models ON models.id = ledger_entries.model_id
                    WHERE models.tenant_id = tenants.id AND ledger_entries.receipt_id IS NOT NULL)
  + COALESCE((SELECT SUM({MODEL_ROW} + LENGTH(name) + LENGTH(spec_json) + LENGTH(ledger_json)
                         + LENGTH(constants_json) + LENGTH(guarantee_json) + LENGTH(algorithm) + LENGTH(status))
              FROM models WHERE models.tenant_id = tenants.id AND models.status = 'deleted'), 0)"""


def upgrade() -> None:
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.add_column(sa.Column('quota_audit_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('usage_audit_bytes', sa.BigInteger(), nullable=False, server_default='0'))
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.add_column(sa.Column('n_dropped', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('dropped_through', sa.BigInteger(), nullable=False, server_default='0'))
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('model_id', sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column('first_step', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('last_step', sa.BigInteger(), nullable=True))
        batch_op.create_index('ix_idempotency_keys_model_steps', ['model_id', 'last_step'], unique=False)
        batch_op.create_index('ix_idempotency_keys_created_at', ['created_at'], unique=False)
    with op.batch_alter_table('stream_events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('first_step', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('last_step', sa.BigInteger(), nullable=True))
        batch_op.create_index('ix_stream_events_model_steps', ['model_id', 'last_step'], unique=False)
    conn = op.get_bind()
    conn.execute(sa.text(_AUDIT))
    _key_fingerprints(conn)


def downgrade() -> None:
    with op.batch_alter_table('stream_events', schema=None) as batch_op:
        batch_op.drop_index('ix_stream_events_model_steps')
        batch_op.drop_column('last_step')
        batch_op.drop_column('first_step')
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.drop_index('ix_idempotency_keys_created_at')
        batch_op.drop_index('ix_idempotency_keys_model_steps')
        batch_op.drop_column('last_step')
        batch_op.drop_column('first_step')
        batch_op.drop_column('model_id')
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_column('dropped_through')
        batch_op.drop_column('n_dropped')
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_column('usage_audit_bytes')
        batch_op.drop_column('quota_audit_bytes')
