"""idempotency claim token: the fencing token of the request holding an Idempotency-Key claim (issue 29 item 8)

A take-over of a stale claim draws a new token; completing a claim is a conditional update on the holder's token in
the operation's own transaction, so a request whose claim was taken over cannot commit (app/services/idempotency.py).
Rows claimed before this revision have no token (NULL): they can still be taken over, never completed by a
request started before the upgrade (whose guard has no token) -- such a request answers 409 and changes nothing.

Revision ID: 0012_i29forget
Revises: 0011
Create Date: 2026-11-27 23:40:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012_i29forget'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('idempotency_keys') as batch:
        batch.add_column(sa.Column('claim', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('idempotency_keys') as batch:
        batch.drop_column('claim')
