"""memory pair: drop the data-dependent ledger numbers stored before issue 14

The memory pair's stored public ledger (models.ledger_json, served as ledger details) held S_N (the sum of squared
gradient norms, forgotten records included), gamma_capacity, gamma_capacity_left and a sample_complexity
extrapolated from S_N.  New writes no longer produce them; this rewrites the rows written before, so nothing
data-dependent is served until a model's next write: the three keys are dropped, and sample_complexity /
inference_allowed are recomputed at the worst case S_N = G^2 N from the specification and the public insert count,
as the engine now does (MemoryPair.public_sample_complexity).  Data only; no schema change.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 08:10:00
"""
from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

WITHDRAWN = ("S_N", "gamma_capacity", "gamma_capacity_left")


def upgrade() -> None:
    from app.unlearning.contract.spec import ModelSpec
    from app.unlearning.families.memory_pair import MemoryPair

    models = sa.table("models", sa.column("id", sa.String), sa.column("algorithm", sa.String),
                      sa.column("spec_json", sa.Text), sa.column("ledger_json", sa.Text))
    conn = op.get_bind()
    rows = conn.execute(sa.select(models.c.id, models.c.spec_json, models.c.ledger_json)
                        .where(models.c.algorithm == "memory_pair")).all()
    for mid, spec_json, ledger_json in rows:
        ledger = json.loads(ledger_json or "{}")
        if not any(k in ledger for k in WITHDRAWN):
            continue
        for k in WITHDRAWN:
            ledger.pop(k, None)
        engine = MemoryPair(ModelSpec(**json.loads(spec_json)))  # the spec alone: no state, no data
        threshold = engine.public_sample_complexity()
        ledger["sample_complexity"] = threshold
        n_inserts = int(ledger.get("n_inserts") or 0)
        ledger["inference_allowed"] = (not engine.hp["inference_gate"]) or n_inserts >= threshold
        conn.execute(sa.update(models).where(models.c.id == mid).values(ledger_json=json.dumps(ledger)))


def downgrade() -> None:
    pass  # the withdrawn numbers cannot (and must not) be restored; later writes never produce them
