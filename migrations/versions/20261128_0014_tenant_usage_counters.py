"""tenant usage counters: live models, records held and bytes stored kept on the tenant row (issue 32)

``tenants.usage_models`` / ``usage_records`` / ``usage_bytes`` are what the quotas check (app/services/quotas.py):
every write changes them by its delta in its own transaction, so a learn reads one row instead of summing over all
the tenant's models.  Backfilled here from the sums over the live models.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 04:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

_LIVE = "FROM models WHERE models.tenant_id = tenants.id AND models.status != 'deleted'"


def upgrade() -> None:
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.add_column(sa.Column('usage_models', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('usage_records', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('usage_bytes', sa.BigInteger(), nullable=False, server_default='0'))
    op.get_bind().execute(sa.text(
        f"UPDATE tenants SET usage_models = (SELECT COUNT(*) {_LIVE}), "
        f"usage_records = (SELECT COALESCE(SUM(n_records - n_forgotten), 0) {_LIVE}), "
        f"usage_bytes = (SELECT COALESCE(SUM(bytes_stored), 0) {_LIVE})"))


def downgrade() -> None:
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_column('usage_bytes')
        batch_op.drop_column('usage_records')
        batch_op.drop_column('usage_models')
