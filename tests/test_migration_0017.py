"""Migration 0017 (issue 37) on a database with data, SQLite and PostgreSQL: the stored request fingerprints become
keyed in place (so the service's own fingerprint of the same request still matches and its answer replays), the
audit usage is backfilled from the rows that exist, and the downgrade drops what it added."""
from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import create_engine, text

from app.services.audit_usage import CHECKPOINT_ROW, LEDGER_ROW, MODEL_ROW, NODE_ROW, RECEIPT_ROW, RECORD_ROW
from app.services.records import fingerprint_key, keyed_fingerprint, seal_record_key

NOW = "2026-12-01 00:00:00+00:00"


def _migrate(url: str, data_dir) -> None:
    from alembic import command

    from app.crypto import load_cipher
    from app.db.migrate import alembic_config

    cipher = load_cipher(data_dir, None, None)
    cfg = alembic_config(url)
    cfg.attributes["cipher"] = cipher
    command.upgrade(cfg, "0014")
    eng = create_engine(url)
    key = secrets.token_bytes(32)
    learn = hashlib.sha256(b"POST /v1/models/m1/learn\n{\"examples\":[]}").hexdigest()
    event = hashlib.sha256(b'{"id":"e1","kind":"learn"}').hexdigest()
    with eng.begin() as c:
        c.execute(text("INSERT INTO tenants (id, name, record_key, log_size, created_at) VALUES ('ten_a', 'n', :k, 2, "
                       ":now)"), {"k": seal_record_key(cipher, "ten_a", key), "now": NOW})
        c.execute(text("INSERT INTO tenants (id, name, record_key, log_size, created_at) VALUES ('ten_b', 'n', :k, 0, "
                       ":now)"), {"k": seal_record_key(cipher, "ten_b", secrets.token_bytes(32)), "now": NOW})
        c.execute(text(
            "INSERT INTO models (id, tenant_id, name, algorithm, spec_json, status, step, n_records, n_forgotten, "
            "version, epoch, rho_spent, ledger_json, constants_json, guarantee_json, created_at, updated_at, "
            "bytes_stored) VALUES ('m1', 'ten_a', 'm', 'passive_olu', '{}', 'deleted', 3, 3, 1, 1, 1, 0, '{}', '{}', "
            "'{}', :now, :now, 0)"), {"now": NOW})
        for i, body in enumerate((b"x" * 1000, b"y" * 1500)):
            c.execute(text("INSERT INTO receipts (id, tenant_id, model_id, log_index, record_commitment, body, kind, "
                           "issued_at) VALUES (:id, 'ten_a', 'm1', :i, :c, :b, 'certificate', :now)"),
                      {"id": f"rcp_{i}", "i": i, "c": "ab" * 32, "b": body, "now": NOW})
        for level, idx in ((0, 0), (0, 1), (1, 0)):
            c.execute(text("INSERT INTO merkle_nodes (tenant_id, level, idx, hash) VALUES ('ten_a', :l, :i, :h)"),
                      {"l": level, "i": idx, "h": b"h" * 32})
        c.execute(text("INSERT INTO records (tenant_id, model_id, commitment, lookup, step, status, learned_at) "
                       "VALUES ('ten_a', 'm1', :c, 1, 1, 'forgotten', :now)"), {"c": "ab" * 32, "now": NOW})
        c.execute(text("INSERT INTO ledger_entries (model_id, epoch, receipt_id, kind, step, sigma, rho, created_at) "
                       "VALUES ('m1', 1, 'rcp_0', 'deletion', 3, 1.0, 0.1, :now)"), {"now": NOW})
        c.execute(text("INSERT INTO checkpoints (tenant_id, tree_size, body, created_at) VALUES ('ten_a', 2, :b, :now)"),
                  {"b": "c" * 300, "now": NOW})
        c.execute(text("INSERT INTO idempotency_keys (tenant_id, key, request_hash, state, status_code, response, "
                       "created_at) VALUES ('ten_a', 'k1', :h, 'done', 200, :r, :now)"),
                  {"h": learn, "r": b"{}", "now": NOW})
        c.execute(text("INSERT INTO stream_events (tenant_id, event_id, model_id, kind, outcome, stream, seq, "
                       "body_sha256, version, result, created_at) VALUES ('ten_a', 'e1', 'm1', 'learn', 'applied', "
                       "'S', 1, :h, 2, :r, :now)"), {"h": event, "r": b"{}", "now": NOW})
    command.upgrade(cfg, "head")
    fp = fingerprint_key(key)
    with eng.connect() as c:
        assert c.execute(text("SELECT request_hash FROM idempotency_keys")).scalar() == keyed_fingerprint(
            fp, bytes.fromhex(learn))
        assert c.execute(text("SELECT body_sha256 FROM stream_events")).scalar() == keyed_fingerprint(
            fp, bytes.fromhex(event))
        audit = dict(c.execute(text("SELECT id, usage_audit_bytes FROM tenants")).all())
        dropped = c.execute(text("SELECT n_dropped, dropped_through FROM models")).one()
    model_row = MODEL_ROW + len("m") + 2 + 2 + 2 + 2 + len("passive_olu") + len("deleted")
    assert audit == {"ten_a": 2 * RECEIPT_ROW + 2500 + 3 * NODE_ROW + RECORD_ROW + LEDGER_ROW + CHECKPOINT_ROW + 300
                     + model_row, "ten_b": 0}, audit
    assert tuple(dropped) == (0, 0)
    command.downgrade(cfg, "0014")
    with eng.connect() as c:
        columns = {r[1] for r in c.exec_driver_sql("PRAGMA table_info(tenants)")} if eng.dialect.name == "sqlite" \
            else set(c.execute(text("SELECT column_name FROM information_schema.columns WHERE table_name = 'tenants'"))
                     .scalars())
    assert "usage_audit_bytes" not in columns and "usage_bytes" in columns
    eng.dispose()


def test_migration_0017_sqlite(tmp_path):
    _migrate(f"sqlite:///{tmp_path / 'm.db'}", tmp_path)


def test_migration_0017_postgresql(postgres_url, tmp_path):
    from sqlalchemy.engine import make_url

    base = make_url(postgres_url)  # the session's database is at head and in use: migrate a fresh one
    name = f"{base.database}_m{secrets.token_hex(3)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        _migrate(base.set(database=name).render_as_string(hide_password=False), tmp_path)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
