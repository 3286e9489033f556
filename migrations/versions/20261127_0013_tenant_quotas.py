"""tenant quotas: per-tenant quotas of models, records held and bytes stored, and each model's bytes stored

``tenants.quota_models`` / ``quota_records`` / ``quota_bytes`` (NULL: the deployment's default, 0: no limit) are
set by the admin (PUT /v1/tenants/{id}/quotas); ``models.bytes_stored`` is what a model's data occupies, set by
every write (app/services/quotas.py).  Existing live models get it from the byte lengths already stored: the
sealed state, the retained examples and their wrapped keys, and per record held 40 bytes of record index (72 where
the model keeps example MACs).

Revision ID: 0013
Revises: 0012_i29forget
Create Date: 2026-11-27 23:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012_i29forget'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.add_column(sa.Column('quota_models', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('quota_records', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('quota_bytes', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.add_column(sa.Column('bytes_stored', sa.BigInteger(), nullable=False, server_default='0'))
    conn = op.get_bind()
    models = conn.execute(sa.text("SELECT id, n_records - n_forgotten FROM models WHERE status != 'deleted'")).all()
    for mid, held in models:
        total = 0
        for sql in ("SELECT COALESCE(SUM(LENGTH(blob)), 0) FROM model_states WHERE model_id = :m",
                    "SELECT COALESCE(SUM(LENGTH(sealed)), 0) FROM retained_examples WHERE model_id = :m",
                    "SELECT COALESCE(SUM(LENGTH(wrapped)), 0) FROM retained_keys WHERE model_id = :m"):
            total += int(conn.execute(sa.text(sql), {"m": mid}).scalar_one())
        macs = conn.execute(sa.text("SELECT COUNT(*) FROM record_batches WHERE model_id = :m AND example_macs IS NOT "
                                    "NULL"), {"m": mid}).scalar_one()
        total += int(held or 0) * (72 if macs else 40)
        conn.execute(sa.text("UPDATE models SET bytes_stored = :b WHERE id = :m"), {"b": total, "m": mid})


def downgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_column('bytes_stored')
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_column('quota_bytes')
        batch_op.drop_column('quota_records')
        batch_op.drop_column('quota_models')
