"""records: one narrow integer lookup index instead of two 64-character commitment indexes

A B-tree keyed by random values dirties about one page per inserted row once it is larger than a batch; with
``uq_records_model_commitment`` and ``ix_records_tenant_commitment`` a 1000-example learn wrote ~8 MB of pages at
10^5 records. ``lookup`` (the commitment's first 8 bytes as a signed BIGINT) is the only commitment index now;
rows are matched on the full commitment, and uniqueness per model is checked under the model's write lock.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21 13:20:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def _lookup(commitment_hex: str) -> int:
    return int.from_bytes(bytes.fromhex(commitment_hex[:16]), "big", signed=True)


def upgrade() -> None:
    with op.batch_alter_table('records', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lookup', sa.BigInteger(), nullable=True))
    conn = op.get_bind()
    records = sa.table('records', sa.column('id', sa.BigInteger), sa.column('commitment', sa.String),
                       sa.column('lookup', sa.BigInteger))
    last = -1
    while True:  # keyset batches: bounded memory on large tables
        rows = conn.execute(sa.select(records.c.id, records.c.commitment).where(records.c.id > last)
                            .order_by(records.c.id).limit(5000)).all()
        if not rows:
            break
        conn.execute(records.update().where(records.c.id == sa.bindparam('rid')).values(lookup=sa.bindparam('lk')),
                     [{'rid': r[0], 'lk': _lookup(r[1])} for r in rows])
        last = rows[-1][0]
    with op.batch_alter_table('records', schema=None) as batch_op:
        batch_op.alter_column('lookup', existing_type=sa.BigInteger(), nullable=False)
        batch_op.drop_constraint('uq_records_model_commitment', type_='unique')
        batch_op.drop_index('ix_records_tenant_commitment')
        batch_op.create_index('ix_records_lookup', ['lookup'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('records', schema=None) as batch_op:
        batch_op.drop_index('ix_records_lookup')
        batch_op.create_index('ix_records_tenant_commitment', ['tenant_id', 'commitment'], unique=False)
        batch_op.create_unique_constraint('uq_records_model_commitment', ['model_id', 'commitment'])
        batch_op.drop_column('lookup')
