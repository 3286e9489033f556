"""erasure receipts: receipts.kind, tenants.deleted_at

Deleting a model appends one signed *erasure* receipt to the tenant's log (kind ``model_erasure``), beside the
per-record certificate receipts of unlearn (kind ``certificate``, the default for every existing row). The
records a deleted model had learned keep one ``records`` row each (status ``erased``: the HMAC commitment, the
step, the erasure receipt's id), so the audit can answer "erased with model X under receipt R".
``tenants.deleted_at`` marks a deleted tenant (its keys are revoked, its models erased).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 08:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('receipts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=16), nullable=False, server_default='certificate'))
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # erased-record rows have no meaning before 0009 (their model is gone): drop them with the columns
    op.execute("DELETE FROM records WHERE status = 'erased'")
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_column('deleted_at')
    with op.batch_alter_table('receipts', schema=None) as batch_op:
        batch_op.drop_column('kind')
