"""stream events: broker events applied exactly once (olu consume), and the per-subject order cursor

``stream_events`` records each event id taken from NATS JetStream in the same transaction as its learn / unlearn
(or its dead letter), with the message published back; ``stream_cursors`` keeps, per stream and model subject,
the last stream sequence taken into account (docs/streaming.md).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 10:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('stream_events',
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('event_id', sa.String(length=255), nullable=False),
    sa.Column('model_id', sa.String(length=255), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('stream', sa.String(length=255), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('body_sha256', sa.String(length=64), nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=True),
    sa.Column('result', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('tenant_id', 'event_id', name=op.f('pk_stream_events'))
    )
    op.create_table('stream_cursors',
    sa.Column('stream', sa.String(length=255), nullable=False),
    sa.Column('subject', sa.String(length=255), nullable=False),
    sa.Column('last_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('stream', 'subject', name=op.f('pk_stream_cursors'))
    )


def downgrade() -> None:
    op.drop_table('stream_cursors')
    op.drop_table('stream_events')
