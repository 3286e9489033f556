"""models.last_evaluation: the aggregate figures of a model's last evaluation (issue 39)

POST /v1/models/{id}/evaluate keeps nothing of the examples it scores; the figures it answers (n, accuracy, log-loss,
mean squared error, confusion matrix) are kept as the model's last evaluation, which the console shows.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 03:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_evaluation', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_column('last_evaluation')
