"""operations: long work (a retrain, a bulk unlearn, a large learn) run as an operation (issue 36 item 4)

``operations`` holds each operation's status, progress, lease (owner, fencing token, expiry) and result;
``operation_payloads`` its request in sealed chunks (commitments and examples, never raw record ids), shredded when it
ends; ``operation_receipts`` the receipt of each record a bulk unlearn forgot, in the request's order
(app/services/operations.py).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 10:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'operations',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('tenant_id', sa.String(length=40), nullable=False),
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('status', sa.String(length=12), nullable=False),
        sa.Column('done', sa.BigInteger(), nullable=False),
        sa.Column('total', sa.BigInteger(), nullable=False),
        sa.Column('cancel_requested', sa.Boolean(), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('owner', sa.String(length=80), nullable=True),
        sa.Column('fence', sa.String(length=32), nullable=True),
        sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('wrapped_key', sa.LargeBinary(), nullable=True),
        sa.Column('result', sa.Text(), nullable=True),
        sa.Column('problem', sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_operations_tenant_id_tenants')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_operations')),
    )
    op.create_index('ix_operations_tenant_id', 'operations', ['tenant_id', 'id'], unique=False)
    op.create_index('ix_operations_status_lease', 'operations', ['status', 'lease_until'], unique=False)
    op.create_table(
        'operation_payloads',
        sa.Column('operation_id', sa.String(length=40), nullable=False),
        sa.Column('seq', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('sealed', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['operation_id'], ['operations.id'],
                                name=op.f('fk_operation_payloads_operation_id_operations')),
        sa.PrimaryKeyConstraint('operation_id', 'seq', name=op.f('pk_operation_payloads')),
    )
    op.create_table(
        'operation_receipts',
        sa.Column('operation_id', sa.String(length=40), nullable=False),
        sa.Column('idx', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('receipt_id', sa.String(length=40), nullable=False),
        sa.ForeignKeyConstraint(['operation_id'], ['operations.id'],
                                name=op.f('fk_operation_receipts_operation_id_operations')),
        sa.PrimaryKeyConstraint('operation_id', 'idx', name=op.f('pk_operation_receipts')),
    )


def downgrade() -> None:
    op.drop_table('operation_receipts')
    op.drop_table('operation_payloads')
    op.drop_index('ix_operations_status_lease', table_name='operations')
    op.drop_index('ix_operations_tenant_id', table_name='operations')
    op.drop_table('operations')
