"""sealed retained examples: each example under its own data key, the key wrapped in retained_keys

Retained examples were stored in the clear (``x`` as little-endian float64 bytes, ``y`` as a float). Each is now
sealed with AES-256-GCM under its own random data key (``retained_examples.sealed``), and the data key, wrapped by
the service's encryption key, lives in ``retained_keys``: forgetting deletes both (crypto-shredding; see
app/db/retained.py and docs/operations.md).

Upgrade seals every existing row: the old table is renamed, a new one is created, every row is sealed into it in
keyset pages, and the old table is dropped (on SQLite with ``secure_delete`` on, so its freed pages are zeroed; on
PostgreSQL dropping the table unlinks its files, where an UPDATE would have left dead tuples). The service runs
``PRAGMA wal_checkpoint(TRUNCATE)`` at start-up after migrating, so the WAL frames of the old rows go too.
Downgrade opens every row back into the plaintext layout.

The encryption key comes from the migration's caller (``app.db.migrate.upgrade_to_head(engine, cipher)``), else
from the OLU_* settings (``OLU_ENCRYPTION_KEY`` or ``<data dir>/encryption.key``); it is needed only when rows
exist, and a missing key is an error, never a freshly generated one (which could not open the state).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 08:00:00
"""
from __future__ import annotations

import os
import struct

import sqlalchemy as sa
from alembic import op
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

PAGE = 1000


def _cipher():
    cfg = op.get_context().config
    cipher = cfg.attributes.get("cipher") if cfg is not None else None
    if cipher is not None:
        return cipher
    from app.config import Settings
    from app.crypto import KEY_FILE, load_cipher

    st = Settings()
    active = st.encryption_key.get_secret_value() if st.encryption_key else None
    if not active and not (st.data_dir / KEY_FILE).exists():
        raise RuntimeError("migration 0010 seals the retained examples: set OLU_ENCRYPTION_KEY or OLU_DATA_DIR to "
                           "the data directory holding encryption.key")
    return load_cipher(st.data_dir, active,
                       st.encryption_keys_old.get_secret_value() if st.encryption_keys_old else None)


def _aad(model_id: str, step: int) -> bytes:
    return f"olu:retained:{model_id}:{step}".encode()


def _rename_constraints(old: str, new: str) -> None:
    """PostgreSQL names constraints per schema: free the names before a table of the same shape is created."""
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(f'ALTER TABLE {new} RENAME CONSTRAINT pk_{old} TO pk_{new}')
        op.execute(f'ALTER TABLE {new} RENAME CONSTRAINT fk_{old}_model_id_models TO fk_{new}_model_id_models')


def _pages(conn, table, columns):
    last = None
    while True:
        q = sa.select(*(table.c[c] for c in columns))
        if last is not None:
            q = q.where(sa.tuple_(table.c.model_id, table.c.step) > sa.tuple_(*last))
        rows = conn.execute(q.order_by(table.c.model_id, table.c.step).limit(PAGE)).all()
        if not rows:
            return
        yield rows
        last = (rows[-1].model_id, rows[-1].step)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == 'sqlite':
        op.execute('PRAGMA secure_delete=ON')  # the dropped plaintext pages are zeroed, whoever runs this
    op.create_table(
        'retained_keys',
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('step', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('wrapped', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_retained_keys_model_id_models')),
        sa.PrimaryKeyConstraint('model_id', 'step', name=op.f('pk_retained_keys')),
    )
    op.rename_table('retained_examples', 'retained_examples_plain')
    _rename_constraints('retained_examples', 'retained_examples_plain')
    op.create_table(
        'retained_examples',
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('step', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('sealed', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_retained_examples_model_id_models')),
        sa.PrimaryKeyConstraint('model_id', 'step', name=op.f('pk_retained_examples')),
    )
    if conn.dialect.name == 'postgresql':  # ciphertext does not compress: TOAST it without trying
        op.execute('ALTER TABLE retained_examples ALTER COLUMN sealed SET STORAGE EXTERNAL')
    plain = sa.table('retained_examples_plain', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
                     sa.column('x', sa.LargeBinary), sa.column('y', sa.Float))
    sealed = sa.table('retained_examples', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
                      sa.column('sealed', sa.LargeBinary))
    keys = sa.table('retained_keys', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
                    sa.column('wrapped', sa.LargeBinary))
    cipher = None
    for rows in _pages(conn, plain, ('model_id', 'step', 'x', 'y')):
        cipher = cipher or _cipher()
        out, wrapped = [], []
        for r in rows:
            rnd = os.urandom(44)
            data_key, nonce = rnd[:32], rnd[32:]
            text = bytes(r.x) + struct.pack('<d', float(r.y))
            out.append({'model_id': r.model_id, 'step': r.step,
                        'sealed': nonce + AESGCM(data_key).encrypt(nonce, text, _aad(r.model_id, r.step))})
            wrapped.append({'model_id': r.model_id, 'step': r.step,
                            'wrapped': cipher.seal(data_key, 'retained-key', f'{r.model_id}:{r.step}')})
        conn.execute(keys.insert(), wrapped)
        conn.execute(sealed.insert(), out)
    op.drop_table('retained_examples_plain')


def downgrade() -> None:
    conn = op.get_bind()
    op.create_table(
        'retained_examples_plain',
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('step', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('x', sa.LargeBinary(), nullable=False),
        sa.Column('y', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'],
                                name=op.f('fk_retained_examples_plain_model_id_models')),
        sa.PrimaryKeyConstraint('model_id', 'step', name=op.f('pk_retained_examples_plain')),
    )
    plain = sa.table('retained_examples_plain', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
                     sa.column('x', sa.LargeBinary), sa.column('y', sa.Float))
    sealed = sa.table('retained_examples', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
                      sa.column('sealed', sa.LargeBinary))
    keys = sa.table('retained_keys', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
                    sa.column('wrapped', sa.LargeBinary))
    joined = (sa.select(sealed.c.model_id, sealed.c.step, sealed.c.sealed, keys.c.wrapped)
              .select_from(sealed.join(keys, sa.and_(keys.c.model_id == sealed.c.model_id,
                                                     keys.c.step == sealed.c.step))).subquery())
    cipher = None
    for rows in _pages(conn, joined, ('model_id', 'step', 'sealed', 'wrapped')):
        cipher = cipher or _cipher()
        out = []
        for r in rows:
            data_key = cipher.open(r.wrapped, 'retained-key', f'{r.model_id}:{r.step}')
            blob = bytes(r.sealed)
            text = AESGCM(data_key).decrypt(blob[:12], blob[12:], _aad(r.model_id, r.step))
            out.append({'model_id': r.model_id, 'step': r.step, 'x': text[:-8],
                        'y': struct.unpack('<d', text[-8:])[0]})
        conn.execute(plain.insert(), out)
    op.drop_table('retained_examples')
    op.drop_table('retained_keys')
    op.rename_table('retained_examples_plain', 'retained_examples')
    _rename_constraints('retained_examples_plain', 'retained_examples')
