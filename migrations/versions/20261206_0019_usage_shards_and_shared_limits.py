"""usage counter shards with quota escrow, and the deployment's shared tenant limits (issue 37 items 5 and 6)

``tenant_usage_shards``: a tenant's live models, records held and bytes stored, split over shards by a hash of the
model id (app/db/usage_shards.py), each with its slice (``cap_*``) of the tenant's remaining quota, so that writes to
different models of one tenant no longer queue on the tenant row's lock.  Backfilled from the tenant row's counters
(into shard 0, with no slice: the first growing write redistributes), which are dropped.

``tenant_rate_buckets`` and ``tenant_slots``: the per-tenant request bucket and in-flight slots every replica draws
from on PostgreSQL (app/api/shared_limits.py).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 07:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tenant_usage_shards',
        sa.Column('tenant_id', sa.String(length=40), nullable=False),
        sa.Column('shard', sa.Integer(), nullable=False),
        sa.Column('models', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('records', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('bytes', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('cap_models', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('cap_records', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('cap_bytes', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('basis', sa.String(length=80), nullable=False, server_default=''),
        sa.PrimaryKeyConstraint('tenant_id', 'shard', name=op.f('pk_tenant_usage_shards')),
    )
    op.get_bind().execute(sa.text(
        "INSERT INTO tenant_usage_shards (tenant_id, shard, models, records, bytes) "
        "SELECT id, 0, usage_models, usage_records, usage_bytes FROM tenants"))
    # in place, never by recreating the table: SQLite's copy-and-rename of ``tenants`` (alembic's batch mode) fails
    # its foreign keys once models reference the tenants (ALTER TABLE ... DROP COLUMN: SQLite >= 3.35)
    with op.batch_alter_table('tenants', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('usage_bytes')
        batch_op.drop_column('usage_records')
        batch_op.drop_column('usage_models')
    op.create_table(
        'tenant_rate_buckets',
        sa.Column('tenant_id', sa.String(length=40), nullable=False),
        sa.Column('tokens', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_tenant_rate_buckets')),
    )
    op.create_table(
        'tenant_slots',
        sa.Column('tenant_id', sa.String(length=40), nullable=False),
        sa.Column('replica', sa.String(length=40), nullable=False),
        sa.Column('slots', sa.Integer(), nullable=False),
        sa.Column('expires_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', 'replica', name=op.f('pk_tenant_slots')),
    )


def downgrade() -> None:
    op.drop_table('tenant_slots')
    op.drop_table('tenant_rate_buckets')
    with op.batch_alter_table('tenants', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('usage_models', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('usage_records', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('usage_bytes', sa.BigInteger(), nullable=False, server_default='0'))
    op.get_bind().execute(sa.text(
        "UPDATE tenants SET usage_models = (SELECT COALESCE(SUM(models), 0) FROM tenant_usage_shards u "
        "WHERE u.tenant_id = tenants.id), usage_records = (SELECT COALESCE(SUM(records), 0) FROM tenant_usage_shards u "
        "WHERE u.tenant_id = tenants.id), usage_bytes = (SELECT COALESCE(SUM(bytes), 0) FROM tenant_usage_shards u "
        "WHERE u.tenant_id = tenants.id)"))
    op.drop_table('tenant_usage_shards')
