"""state deltas and retained chunks: writes proportional to the change, retained data sealed in chunks (issue 36)

* ``model_state_deltas`` / ``model_state_delta_keys``: a model's state is its base (``model_states``, at its own
  version) and a log of sealed per-version deltas (app/db/state_log.py).  Existing states are bases at the model's
  version: nothing to move.  Downgrade folds every log into its base (app/state_store.py rebuilds the state).
* ``retained_chunks`` / ``retained_chunk_keys``: kept examples sealed in chunks of up to 4 096 records of one public
  group (app/db/retained.py) instead of one sealed row and one key per record.  Upgrade opens every per-record row
  (0010's layout) and seals the model's records into chunks, grouped by the engine's ``retained_groups`` (sisa:
  its shard), then drops the old tables (on SQLite with ``secure_delete`` on; the start-up checkpoint then cuts
  the WAL).  Downgrade opens the chunks back into per-record rows.  The chunk layout is app/db/retained.py's.

The encryption key comes from the migration's caller (``app.db.migrate.upgrade_to_head(engine, cipher)``), else
from the OLU_* settings, as in 0010; it is needed only when rows exist.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30 08:00:00
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import sqlalchemy as sa
from alembic import op
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

PAGE = 1000
FLUSH_ROWS = 1 << 18  # records buffered across groups before every group's buffer is sealed


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
        raise RuntimeError("migration 0015 re-seals the retained examples: set OLU_ENCRYPTION_KEY or OLU_DATA_DIR "
                           "to the data directory holding encryption.key")
    return load_cipher(st.data_dir, active,
                       st.encryption_keys_old.get_secret_value() if st.encryption_keys_old else None)


def _engine(spec_json: str):
    from app.unlearning import ModelSpec, engine_class

    d = json.loads(spec_json)
    if d.get("classes") is not None:
        d["classes"] = tuple(d["classes"])
    spec = ModelSpec(**d)
    return engine_class(spec.algorithm)(spec)


def _old_aad(model_id: str, step: int) -> bytes:
    return f"olu:retained:{model_id}:{step}".encode()


_MODELS = sa.table('models', sa.column('id', sa.String), sa.column('spec_json', sa.Text))
_EX = sa.table('retained_examples', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
               sa.column('sealed', sa.LargeBinary))
_KEYS = sa.table('retained_keys', sa.column('model_id', sa.String), sa.column('step', sa.BigInteger),
                 sa.column('wrapped', sa.LargeBinary))


def _create_chunk_tables() -> None:
    op.create_table(
        'model_state_deltas',
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('version', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('kind', sa.String(length=8), nullable=False),
        sa.Column('sealed', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_model_state_deltas_model_id_models')),
        sa.PrimaryKeyConstraint('model_id', 'version', name=op.f('pk_model_state_deltas')),
    )
    op.create_table(
        'model_state_delta_keys',
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('version', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('wrapped', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'],
                                name=op.f('fk_model_state_delta_keys_model_id_models')),
        sa.PrimaryKeyConstraint('model_id', 'version', name=op.f('pk_model_state_delta_keys')),
    )
    op.create_table(
        'retained_chunks',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('grp', sa.BigInteger(), nullable=False),
        sa.Column('first_step', sa.BigInteger(), nullable=False),
        sa.Column('last_step', sa.BigInteger(), nullable=False),
        sa.Column('n', sa.Integer(), nullable=False),
        sa.Column('steps', sa.LargeBinary(), nullable=False),
        sa.Column('sealed', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_retained_chunks_model_id_models')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_retained_chunks')),
    )
    op.create_index('ix_retained_chunks_model_grp_last', 'retained_chunks', ['model_id', 'grp', 'last_step'])
    op.create_table(
        'retained_chunk_keys',
        sa.Column('chunk_id', sa.String(length=32), nullable=False),
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('wrapped', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_retained_chunk_keys_model_id_models')),
        sa.PrimaryKeyConstraint('chunk_id', name=op.f('pk_retained_chunk_keys')),
    )
    op.create_index(op.f('ix_retained_chunk_keys_model_id'), 'retained_chunk_keys', ['model_id'])
    if op.get_bind().dialect.name == 'postgresql':  # ciphertext does not compress: TOAST it without trying
        for table in ('retained_chunks', 'model_state_deltas'):
            op.execute(f'ALTER TABLE {table} ALTER COLUMN sealed SET STORAGE EXTERNAL')


def _rows_of(conn, model_id: str, cipher):
    """(step, plaintext x | y) of the model's per-record rows in step order, in keyset pages."""
    joined = (sa.select(_EX.c.step, _EX.c.sealed, _KEYS.c.wrapped)
              .select_from(_EX.join(_KEYS, sa.and_(_KEYS.c.model_id == _EX.c.model_id, _KEYS.c.step == _EX.c.step)))
              .where(_EX.c.model_id == model_id))
    last = 0
    while True:
        page = conn.execute(joined.where(_EX.c.step > last).order_by(_EX.c.step).limit(PAGE)).all()
        if not page:
            return
        for step, sealed, wrapped in page:
            key = cipher.open(wrapped, 'retained-key', f'{model_id}:{step}')
            blob = bytes(sealed)
            yield int(step), AESGCM(key).decrypt(blob[:12], blob[12:], _old_aad(model_id, int(step)))
        last = int(page[-1][0])


def upgrade() -> None:
    from app.db.retained import capacity, seal_chunk

    conn = op.get_bind()
    if conn.dialect.name == 'sqlite':
        op.execute('PRAGMA secure_delete=ON')  # the dropped per-record pages are zeroed, whoever runs this
    _create_chunk_tables()
    chunks = sa.table('retained_chunks', *(sa.column(c) for c in
                                           ('id', 'model_id', 'grp', 'first_step', 'last_step', 'n', 'steps',
                                            'sealed')))
    keys = sa.table('retained_chunk_keys', sa.column('chunk_id'), sa.column('model_id'), sa.column('wrapped'))
    held = [m for (m,) in conn.execute(sa.select(_EX.c.model_id).distinct())]
    cipher = _cipher() if held else None
    for model_id in held:
        spec_json = conn.execute(sa.select(_MODELS.c.spec_json).where(_MODELS.c.id == model_id)).scalar_one()
        engine = _engine(spec_json)
        dim = int(engine.spec.dim)
        cap = capacity(dim)
        buffers: dict[int, list[tuple[int, bytes]]] = {}
        buffered = 0

        def flush(groups) -> None:
            rows, wrapped = [], []
            for g in groups:
                part = buffers.pop(g, [])
                if not part:
                    continue
                steps = np.array([t for t, _ in part], dtype=np.int64)
                XY = np.frombuffer(b''.join(p for _, p in part), dtype='<f8').reshape(len(part), dim + 1)
                row, key = seal_chunk(cipher, model_id, g, steps, XY[:, :dim], XY[:, dim])
                rows.append(row)
                wrapped.append(key)
            if rows:
                conn.execute(keys.insert(), wrapped)
                conn.execute(chunks.insert(), rows)

        for step, plain in _rows_of(conn, model_id, cipher):
            g = int(engine.retained_groups(np.array([step], dtype=np.int64))[0])
            buffers.setdefault(g, []).append((step, plain))
            buffered += 1
            if len(buffers[g]) >= cap:
                buffered -= len(buffers[g])
                flush([g])
            elif buffered >= FLUSH_ROWS:
                flush(list(buffers))
                buffered = 0
        flush(list(buffers))
    op.drop_table('retained_examples')
    op.drop_table('retained_keys')


def downgrade() -> None:
    from app.db import state_log
    from app.db.retained import open_chunk
    from app.state_store import base_write, rebuild

    conn = op.get_bind()
    if conn.dialect.name == 'sqlite':
        op.execute('PRAGMA secure_delete=ON')
    op.create_table(
        'retained_keys',
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('step', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('wrapped', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_retained_keys_model_id_models')),
        sa.PrimaryKeyConstraint('model_id', 'step', name=op.f('pk_retained_keys')),
    )
    op.create_table(
        'retained_examples',
        sa.Column('model_id', sa.String(length=40), nullable=False),
        sa.Column('step', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('sealed', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_retained_examples_model_id_models')),
        sa.PrimaryKeyConstraint('model_id', 'step', name=op.f('pk_retained_examples')),
    )
    if conn.dialect.name == 'postgresql':
        op.execute('ALTER TABLE retained_examples ALTER COLUMN sealed SET STORAGE EXTERNAL')
    cipher = None
    chunk_rows = sa.text("SELECT c.id, c.grp, c.steps, c.sealed, k.wrapped "
                         "FROM retained_chunks c JOIN retained_chunk_keys k ON k.chunk_id = c.id "
                         "WHERE c.model_id = :m ORDER BY c.first_step, c.id")
    for model_id, spec_json in conn.execute(sa.text(
            "SELECT id, spec_json FROM models WHERE id IN (SELECT DISTINCT model_id FROM retained_chunks)")).all():
        cipher = cipher or _cipher()
        dim = int(json.loads(spec_json)['dim'])
        for cid, grp, steps, sealed, wrapped in conn.execute(chunk_rows, {"m": model_id}).all():
            c = open_chunk(cipher, model_id, dim, cid, grp, steps, sealed, wrapped)
            out, wrapped_keys = [], []
            for t, x, v in zip(c.steps.tolist(), c.X, c.y):
                rnd = os.urandom(44)
                data_key, nonce = rnd[:32], rnd[32:]
                text = np.ascontiguousarray(x, dtype='<f8').tobytes() + struct.pack('<d', float(v))
                out.append({'model_id': model_id, 'step': t,
                            'sealed': nonce + AESGCM(data_key).encrypt(nonce, text, _old_aad(model_id, t))})
                wrapped_keys.append({'model_id': model_id, 'step': t,
                                     'wrapped': cipher.seal(data_key, 'retained-key', f'{model_id}:{t}')})
            conn.execute(_KEYS.insert(), wrapped_keys)
            conn.execute(_EX.insert(), out)
    # fold every state log into its base: the old layout knows bases only
    logged = [m for (m,) in conn.execute(sa.text("SELECT DISTINCT model_id FROM model_state_deltas"))]
    if logged:
        from sqlalchemy.orm import Session

        from app.registry import spec_from_json

        cipher = cipher or _cipher()
        s = Session(bind=conn)
        for model_id in logged:
            spec_json, version = conn.execute(sa.text("SELECT spec_json, version FROM models WHERE id = :m"),
                                              {"m": model_id}).one()
            engine, _ = rebuild(spec_from_json(spec_json), model_id, state_log.load(s, cipher, model_id), cipher)
            conn.execute(sa.text("UPDATE model_states SET blob = :b, version = :v WHERE model_id = :m"),
                         {"b": base_write(engine, model_id, version, cipher).payload, "v": version, "m": model_id})
    op.drop_table('retained_chunk_keys')
    op.drop_index('ix_retained_chunks_model_grp_last', table_name='retained_chunks')
    op.drop_table('retained_chunks')
    op.drop_table('model_state_delta_keys')
    op.drop_table('model_state_deltas')
