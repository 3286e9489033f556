"""record_batches: learned records packed one row per learn request; records keeps only forgotten ones

A learn of 1000 examples wrote 1000 rows into ``records`` and as many entries into its random-keyed lookup index,
dirtying about one index page per row (~6 ms of a durable commit on SQLite). Learned records now live packed in
``record_batches`` (commitments and, when needed, steps and example MACs as blobs, one row per learn request) and
are found through a per-process in-memory index (app/db/record_batches.py). ``records`` keeps a row per forgotten
record.

Upgrade moves every record's commitment into batch rows (records learned in one request, in step order, at most
1000 per row; forgotten records too, since the duplicate check must still see them) and deletes the rows of
learned records. Downgrade expands the batches back into rows of learned records.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-21 16:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

PER_ROW = 1000

records = sa.table('records', sa.column('id', sa.BigInteger), sa.column('tenant_id', sa.String),
                   sa.column('model_id', sa.String), sa.column('commitment', sa.String),
                   sa.column('lookup', sa.BigInteger), sa.column('step', sa.BigInteger),
                   sa.column('status', sa.String), sa.column('learned_at', sa.DateTime(timezone=True)),
                   sa.column('example_mac', sa.String))
batches = sa.table('record_batches', sa.column('id', sa.BigInteger), sa.column('tenant_id', sa.String),
                   sa.column('model_id', sa.String), sa.column('n', sa.Integer),
                   sa.column('commitments', sa.LargeBinary), sa.column('first_step', sa.BigInteger),
                   sa.column('steps', sa.LargeBinary), sa.column('example_macs', sa.LargeBinary),
                   sa.column('learned_at', sa.DateTime(timezone=True)))


def _batch_row(rows) -> dict:
    digests = [bytes.fromhex(r.commitment) for r in rows]
    macs = None
    if any(r.example_mac for r in rows):
        macs = b"".join(bytes.fromhex(r.example_mac) if r.example_mac else bytes(32) for r in rows)
    steps = [int(r.step) for r in rows]
    consecutive = steps == list(range(steps[0], steps[0] + len(steps)))
    return {'tenant_id': rows[0].tenant_id, 'model_id': rows[0].model_id, 'n': len(rows),
            'commitments': b"".join(digests), 'first_step': steps[0],
            'steps': None if consecutive else b"".join(t.to_bytes(8, "little", signed=True) for t in steps),
            'example_macs': macs, 'learned_at': rows[0].learned_at}


def upgrade() -> None:
    op.create_table(
        'record_batches',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('tenant_id', sa.String(length=40), nullable=False),
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('n', sa.Integer(), nullable=False),
        sa.Column('commitments', sa.LargeBinary(), nullable=False),
        sa.Column('first_step', sa.BigInteger(), nullable=False),
        sa.Column('steps', sa.LargeBinary(), nullable=True),
        sa.Column('example_macs', sa.LargeBinary(), nullable=True),
        sa.Column('learned_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_record_batches_model_id_models')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_record_batches')),
    )
    op.create_index('ix_record_batches_model_id', 'record_batches', ['model_id', 'id'], unique=False)
    conn = op.get_bind()
    if conn.dialect.name == 'postgresql':  # HMACs are random bytes: TOAST them without trying to compress them
        op.execute('ALTER TABLE record_batches ALTER COLUMN commitments SET STORAGE EXTERNAL, '
                   'ALTER COLUMN example_macs SET STORAGE EXTERNAL')
    model_ids = [m for (m,) in conn.execute(sa.select(records.c.model_id).distinct().order_by(records.c.model_id))]
    for model_id in model_ids:
        last = None
        pending: list = []
        while True:  # keyset pages in step order: bounded memory on large tables
            q = sa.select(records.c.tenant_id, records.c.model_id, records.c.commitment, records.c.step,
                          records.c.example_mac, records.c.learned_at).where(records.c.model_id == model_id)
            if last is not None:
                q = q.where(records.c.step > last)
            page = conn.execute(q.order_by(records.c.step).limit(5000)).all()
            for r in page:  # one batch row per learn request (same learned_at), at most PER_ROW records
                if pending and (len(pending) == PER_ROW or r.learned_at != pending[0].learned_at):
                    conn.execute(batches.insert(), _batch_row(pending))
                    pending = []
                pending.append(r)
            if not page:
                break
            last = page[-1].step
        if pending:
            conn.execute(batches.insert(), _batch_row(pending))
    conn.execute(records.delete().where(records.c.status == 'learned'))


def downgrade() -> None:
    conn = op.get_bind()
    last = 0
    while True:
        rows = conn.execute(sa.select(batches).where(batches.c.id > last).order_by(batches.c.id).limit(100)).all()
        if not rows:
            break
        for b in rows:
            gone = {c for (c,) in conn.execute(sa.select(records.c.commitment).where(records.c.model_id == b.model_id))}
            out = []
            for i in range(b.n):
                c = bytes(b.commitments[32 * i:32 * i + 32]).hex()
                if c in gone:
                    continue
                mac = None if b.example_macs is None else bytes(b.example_macs[32 * i:32 * i + 32])
                out.append({'tenant_id': b.tenant_id, 'model_id': b.model_id, 'commitment': c,
                            'lookup': int.from_bytes(bytes.fromhex(c[:16]), "big", signed=True),
                            'step': b.first_step + i if b.steps is None else
                            int.from_bytes(bytes(b.steps[8 * i:8 * i + 8]), "little", signed=True),
                            'status': 'learned', 'learned_at': b.learned_at,
                            'example_mac': mac.hex() if mac and any(mac) else None})
            if out:
                conn.execute(records.insert(), out)
        last = rows[-1].id
    op.drop_index('ix_record_batches_model_id', table_name='record_batches')
    op.drop_table('record_batches')
