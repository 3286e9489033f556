"""Forgetting is total (issue 13, item 1): once unlearn (or DELETE of the model) has answered 2xx, no file of the
data directory holds a byte of the forgotten example: features (float64, float32, decimal text), label, raw id.

Every data-holding family on SQLite, in-process and as a real service SIGKILLed right after the answer and
restarted; the crypto-shredding itself (the example's data key and sealed row are in no file, the WAL is cut);
PostgreSQL: the retained tables never hold an example in the clear.
"""
from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest
from sqlalchemy import create_engine, text

from .conftest import start_server
from .forensics import files_under, needles_of, scan
from .procs import ServiceProcess, service_env

DIM = 4
FAMILIES = [("active_olu", {}), ("descent_to_delete", {}), ("memory_pair", {}), ("retrain", {}),
            ("rewind_to_delete", {"initial_size": 8, "T": 40, "K": 10, "m_max": 3}), ("sisa", {"shards": 3}),
            ("exact_ridge", {"deletion_features": "retained"})]
IDS = [a for a, _ in FAMILIES]
# the forgotten example: distinctive features and label (squared loss), and a distinctive raw id
X_FORGET = [0.3141592653589793, -0.16180339887498948, 0.1414213562373095, 0.05772156649015329]
Y_FORGET = 0.2718281828459045
N = 12
AT = 5  # its index in the learned batch


def _spec(algorithm: str, hp: dict) -> dict:
    return {"name": "forget", "algorithm": algorithm, "loss": "squared", "dim": DIM,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": hp}


def _batch(seed: int, tag: str):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-0.45, 0.45, size=(N, DIM))
    y = rng.uniform(-0.9, 0.9, size=N)
    X[AT], y[AT] = X_FORGET, Y_FORGET
    ids = [f"keep-{tag}-{i}" for i in range(N)]
    ids[AT] = f"forget-me-{tag}-{os.urandom(6).hex()}"
    return ids, X, y


def _learn(c, algorithm: str, hp: dict, seed: int):
    r = c.post("/v1/models", json=_spec(algorithm, hp))
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    ids, X, y = _batch(seed, algorithm)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": [
        {"id": rid, "x": x.tolist(), "y": float(v)} for rid, x, v in zip(ids, X, y)]})
    assert r.status_code == 200, r.text
    return mid, ids, X, y


def _sqlite_server(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    return start_server(f"sqlite:///{data / 'olu.db'}", data, "sqlite")


def _stop(handle, srv) -> None:
    uv, thread = handle
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


def _retained_steps(db_path, model_id: str) -> list[int]:
    """The steps the model's sealed retained chunks hold (app/db/retained.py: public step indices per chunk)."""
    with sqlite3.connect(db_path) as conn:
        return sorted(int(t) for (b,) in conn.execute("SELECT steps FROM retained_chunks WHERE model_id = ?",
                                                      (model_id,))
                      for t in np.frombuffer(b, dtype="<i8"))


def _chunk_of(conn, model_id: str, step: int) -> tuple[bytes, bytes]:
    """(sealed chunk, wrapped chunk key) of the chunk holding ``step``."""
    for cid, steps, sealed in conn.execute("SELECT id, steps, sealed FROM retained_chunks WHERE model_id = ?",
                                           (model_id,)):
        if step in np.frombuffer(steps, dtype="<i8"):
            wrapped, = conn.execute("SELECT wrapped FROM retained_chunk_keys WHERE chunk_id = ?", (cid,)).fetchone()
            return bytes(sealed), bytes(wrapped)
    raise KeyError(step)


@pytest.mark.parametrize("algorithm,hp", FAMILIES, ids=IDS)
def test_unlearn_leaves_no_byte_in_the_data_directory(tmp_path, algorithm, hp):
    srv, handle = _sqlite_server(tmp_path)
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            mid, ids, X, y = _learn(c, algorithm, hp, seed=1)
            assert AT + 1 in _retained_steps(srv.data_dir / "olu.db", mid)  # control: the example is retained
            r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ids[AT]]})
            assert r.status_code == 200, r.text
            assert scan([srv.data_dir], needles_of(X[AT], Y_FORGET, ids[AT])) == []
            assert AT + 1 not in _retained_steps(srv.data_dir / "olu.db", mid)
            assert len(_retained_steps(srv.data_dir / "olu.db", mid)) == N - 1  # the others are still held
            # and they still work: a further forget reads them (active_olu runs GD on them, memory_pair needs x)
            assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ids[AT + 1]]}).status_code == 200
    finally:
        _stop(handle, srv)


def test_exact_ridge_keeps_no_byte_of_an_example_and_of_a_resent_one(tmp_path):
    """exact_ridge's default mode keeps no data: after the learn no file holds the example (only integer sums and a
    keyed check code), and the record resent with the unlearn leaves no byte either, the SQLite WAL included."""
    srv, handle = _sqlite_server(tmp_path)
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            mid, ids, X, y = _learn(c, "exact_ridge", {}, seed=3)
            needles = needles_of(X[AT], Y_FORGET, ids[AT])
            assert _retained_steps(srv.data_dir / "olu.db", mid) == []  # nothing sealed either
            assert scan([srv.data_dir], needles) == []
            resent = {"id": ids[AT], "x": X[AT].tolist(), "y": float(y[AT])}
            r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ids[AT]], "examples": [resent]})
            assert r.status_code == 200, r.text
            assert scan([srv.data_dir], needles) == []
            # control: the scan finds the needles where they are (a file holding the example's bytes)
            (srv.data_dir / "control.bin").write_bytes(np.asarray(X[AT], dtype="<f8").tobytes())
            assert scan([srv.data_dir], needles) != []
    finally:
        _stop(handle, srv)


def test_forgotten_data_key_and_sealed_row_are_in_no_file(tmp_path):
    """Crypto-shredding at chunk level: the forgotten example's chunk (its ciphertext) and the chunk's wrapped data
    key were on disk (control) and are in no file once unlearn answered (the chunk is re-sealed without the record
    under a fresh key); the WAL is cut to zero bytes (no frame keeps a page from before)."""
    srv, handle = _sqlite_server(tmp_path)
    db = srv.data_dir / "olu.db"
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            mid, ids, X, _ = _learn(c, "active_olu", {}, seed=2)
            with sqlite3.connect(db) as conn:
                sealed, wrapped = _chunk_of(conn, mid, AT + 1)
            needles = {"sealed": sealed[12:60], "sealed tail": sealed[-48:], "wrapped key": wrapped[-48:]}
            assert {n for _, n, _ in scan([srv.data_dir], needles)} == set(needles)  # control: both on disk
            assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ids[AT]]}).status_code == 200
            assert scan([srv.data_dir], needles) == []
            wal = srv.data_dir / "olu.db-wal"
            assert not wal.exists() or wal.stat().st_size == 0
            with sqlite3.connect(db) as conn:
                assert conn.execute("SELECT count(*) FROM retained_chunk_keys WHERE model_id=?", (mid,)).fetchone() \
                    == conn.execute("SELECT count(*) FROM retained_chunks WHERE model_id=?", (mid,)).fetchone()
            assert _retained_steps(db, mid) == [t for t in range(1, N + 1) if t != AT + 1]
    finally:
        _stop(handle, srv)


def test_model_deletion_leaves_no_byte_of_any_example(tmp_path):
    srv, handle = _sqlite_server(tmp_path)
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            learned = [_learn(c, algorithm, hp, seed=10 + k) for k, (algorithm, hp) in enumerate(FAMILIES)]
            for mid, *_ in learned:
                assert c.delete(f"/v1/models/{mid}").status_code == 204
            for mid, ids, X, y in learned:
                for i in range(N):  # every example of the deleted models, not only the distinctive one
                    assert scan([srv.data_dir], needles_of(X[i], y[i], ids[i])) == [], (mid, i)
                assert _retained_steps(srv.data_dir / "olu.db", mid) == []
    finally:
        _stop(handle, srv)


def test_tenant_deletion_leaves_no_byte_of_any_example(tmp_path):
    """DELETE /v1/tenants/{id} erases every model of the tenant (one erasure receipt each): afterwards no example of
    any of them, nor its raw id, is in any file of the data directory (the WAL included)."""
    srv, handle = _sqlite_server(tmp_path)
    db = srv.data_dir / "olu.db"
    try:
        tenant_id, key = srv.new_tenant()
        with srv.client(key) as c:
            learned = [_learn(c, algorithm, hp, seed=30 + k) for k, (algorithm, hp) in enumerate(FAMILIES)]
        with sqlite3.connect(db) as conn:  # control: the data-holding models hold sealed examples and their keys
            assert conn.execute("SELECT count(*) FROM retained_chunk_keys").fetchone()[0] > 0
        with srv.admin() as adm:
            r = adm.delete(f"/v1/tenants/{tenant_id}")
            assert r.status_code == 200, r.text
        for mid, ids, X, y in learned:
            for i in range(N):
                assert scan([srv.data_dir], needles_of(X[i], y[i], ids[i])) == [], (mid, i)
            assert _retained_steps(db, mid) == []
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM retained_chunk_keys").fetchone()[0] == 0
    finally:
        _stop(handle, srv)


def test_sigkill_right_after_the_unlearn_answer_then_restart(tmp_path):
    """A real service process: unlearn answers 200, SIGKILL at once (no shutdown handler), scan; restart, scan."""
    data = tmp_path / "data"
    data.mkdir()
    log = tmp_path / "service.log"  # outside the data directory, scanned too
    env = service_env(data, f"sqlite:///{data / 'olu.db'}", OLU_LOG_LEVEL="DEBUG")
    svc = ServiceProcess(env, log).start()
    try:
        _, key = svc.new_tenant()
        needles = {}
        with svc.client(key) as c:
            learned = [_learn(c, algorithm, hp, seed=20 + k) for k, (algorithm, hp) in enumerate(FAMILIES)]
            for mid, ids, X, y in learned:
                for name, b in needles_of(X[AT], Y_FORGET, ids[AT]).items():
                    needles[f"{mid} {name}"] = b
            for n, (mid, ids, _, _) in enumerate(learned):
                r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ids[AT]]})
                assert r.status_code == 200, r.text
                if n == len(learned) - 1:
                    svc.kill()  # right after the last answer
        assert scan([data, log], needles) == []
        svc = ServiceProcess(env, log).start()
        assert scan([data, log], needles) == []
        assert files_under(data)  # control: the scan saw the database files
        with svc.client(key) as c:  # (after the scan: uvicorn's access log at level info prints this raw path)
            for mid, ids, _, _ in learned:  # the restarted service has every forget, and the others still retained
                assert c.get(f"/v1/audit/records/{ids[AT]}").json()["models"][0]["status"] == "forgotten"
                assert len(_retained_steps(data / "olu.db", mid)) == N - 1
    finally:
        svc.kill()


def test_postgresql_retained_tables_hold_no_example_in_the_clear(postgres_url, tmp_path):
    srv, handle = start_server(postgres_url, tmp_path, "postgresql")
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            learned = [_learn(c, algorithm, hp, seed=30 + k) for k, (algorithm, hp) in enumerate(FAMILIES)]
            eng = create_engine(postgres_url)
            try:
                mids = [m for m, *_ in learned]
                for table in ("retained_chunks", "retained_chunk_keys"):
                    with eng.connect() as conn:
                        rows = conn.execute(text(f"SELECT * FROM {table} WHERE model_id = ANY(:m)"),
                                            {"m": mids}).all()
                    assert {r.model_id for r in rows} == set(mids)  # control: every model keeps its examples
                    dump = b"|".join(bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode()
                                     for row in rows for v in row)
                    for mid, ids, X, y in learned:
                        for i in range(N):
                            found = [n for n, b in needles_of(X[i], y[i]).items() if b in dump]
                            assert found == [], (table, mid, i, found)
                for mid, ids, _, _ in learned:
                    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ids[AT]]}).status_code == 200
                with eng.connect() as conn:
                    for mid, *_ in learned:
                        steps = sorted(int(t) for (b,) in conn.execute(
                            text("SELECT steps FROM retained_chunks WHERE model_id = :m"), {"m": mid})
                            for t in np.frombuffer(bytes(b), dtype="<i8"))
                        assert steps == [t for t in range(1, N + 1) if t != AT + 1]
                        keys = conn.execute(text("SELECT count(*) FROM retained_chunk_keys WHERE model_id = :m"),
                                            {"m": mid}).scalar()
                        assert keys == conn.execute(text("SELECT count(*) FROM retained_chunks WHERE model_id = :m"),
                                                    {"m": mid}).scalar()
            finally:
                eng.dispose()
    finally:
        _stop(handle, srv)


def test_migration_0010_seals_existing_plaintext_examples(tmp_path):
    """A database from before 0010 (examples in the clear): the upgrade seals every row, the start-up checkpoint
    leaves no plaintext in any file, the examples still serve forgets and retrains; downgrade opens them back."""
    from alembic import command

    from app.config import Settings
    from app.db.migrate import alembic_config
    from app.main import create_app

    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'olu.db'}"
    settings = Settings(data_dir=data, database_url=url, log_level="WARNING")
    app = create_app(settings)
    ctx = app.state.ctx
    t = ctx.tenants.create_tenant("mig")["id"]
    learned = []
    for k, (algorithm, hp) in enumerate(FAMILIES):
        m = ctx.models.create(t, _spec(algorithm, hp))["id"]
        ids, X, y = _batch(40 + k, algorithm)
        ctx.models.learn(t, m, ids, X, y)
        learned.append((m, ids, X, y))
    cipher = ctx.models.registry.cipher
    ctx.db.dispose()

    cfg = alembic_config(url)
    cfg.attributes["cipher"] = cipher
    command.downgrade(cfg, "0009")
    with sqlite3.connect(data / "olu.db") as conn:  # control: the old layout holds the examples in the clear
        x, yv = conn.execute("SELECT x, y FROM retained_examples WHERE model_id=? AND step=?",
                             (learned[0][0], AT + 1)).fetchone()
    assert bytes(x) == np.asarray(X_FORGET, dtype="<f8").tobytes() and yv == Y_FORGET
    assert scan([data], needles_of(X_FORGET, Y_FORGET)) != []

    app = create_app(settings)  # upgrades to head (0010 seals, 0015 chunks) with the data directory's key
    ctx = app.state.ctx
    try:
        assert scan([data], needles_of(X_FORGET, Y_FORGET)) == []
        sisa = learned[IDS.index("sisa")][0]
        with sqlite3.connect(data / "olu.db") as conn:  # sisa's records are chunked by shard (its retained_groups)
            for grp, steps in conn.execute("SELECT grp, steps FROM retained_chunks WHERE model_id = ?", (sisa,)):
                assert {(int(t) - 1) % 3 for t in np.frombuffer(steps, dtype="<i8")} == {grp}
        for m, ids, X, y in learned:
            assert _retained_steps(data / "olu.db", m) == list(range(1, N + 1))
            ctx.models.unlearn(t, m, [ids[AT]])  # the sealed examples open: every family forgets on them
            assert _retained_steps(data / "olu.db", m) == [s for s in range(1, N + 1) if s != AT + 1]
        retrain = learned[IDS.index("retrain")][0]
        ctx.models.retrain(t, retrain)
        from app.db.retained import SqlRetained
        m, ids, X, y = learned[0]
        with ctx.db.read() as s:
            got_X, got_y = SqlRetained(s, m, DIM, cipher).get([1, N])
        assert np.array_equal(got_X, X[[0, N - 1]]) and np.array_equal(got_y, y[[0, N - 1]])
    finally:
        ctx.db.dispose()
    command.downgrade(cfg, "0009")  # and back: the plaintext layout, every kept example intact
    with sqlite3.connect(data / "olu.db") as conn:
        x, yv = conn.execute("SELECT x, y FROM retained_examples WHERE model_id=? AND step=1",
                             (learned[0][0],)).fetchone()
        assert conn.execute("SELECT count(*) FROM retained_examples").fetchone()[0] == len(FAMILIES) * (N - 1)
    assert bytes(x) == np.asarray(learned[0][2][0], dtype="<f8").tobytes() and yv == learned[0][3][0]


def test_key_rotation_rewraps_the_data_keys_only(tmp_path):
    """Rotating the encryption key (app.db.reseal) re-wraps every retained data key, leaves the sealed examples
    byte for byte, and afterwards the new key alone opens them (the old one can be destroyed)."""
    import base64

    from app.crypto import Cipher, parse_key
    from app.db.reseal import reseal_all
    from app.db.retained import SqlRetained

    k1, k2 = (base64.b64encode(os.urandom(32)).decode() for _ in range(2))
    data = tmp_path / "data"
    data.mkdir()
    srv, handle = start_server(f"sqlite:///{data / 'olu.db'}", data, "sqlite", encryption_key=k1)
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            mid, ids, X, y = _learn(c, "active_olu", {}, seed=50)
        db = srv.app.state.ctx.db
        with sqlite3.connect(data / "olu.db") as conn:
            before = conn.execute("SELECT id, sealed FROM retained_chunks ORDER BY id").fetchall()
        counts = reseal_all(db, Cipher(parse_key(k2), [parse_key(k1)]))
        assert counts["retained_keys"] == len(before) >= 1  # one key per chunk
        assert reseal_all(db, Cipher(parse_key(k2)))["retained_keys"] == 0
        with sqlite3.connect(data / "olu.db") as conn:
            assert conn.execute("SELECT id, sealed FROM retained_chunks ORDER BY id").fetchall() == before
        with db.read() as s:
            got_X, got_y = SqlRetained(s, mid, DIM, Cipher(parse_key(k2))).get(range(1, N + 1))
        assert np.array_equal(got_X, X) and np.array_equal(got_y, y)
    finally:
        _stop(handle, srv)


def test_a_sealed_chunk_opens_only_with_its_own_key_and_place():
    import base64

    from app.crypto import Cipher, DecryptionError, parse_key
    from app.db.retained import open_chunk, seal_chunk

    cipher = Cipher(parse_key(base64.b64encode(os.urandom(32)).decode()))
    X = np.array([X_FORGET, [0.1, 0.2, 0.3, 0.4]])
    y = np.array([Y_FORGET, 0.5])
    row, key = seal_chunk(cipher, "mdl_a", 2, np.array([6, 9]), X, y)
    args = ("mdl_a", 4, row["id"], 2, row["steps"], row["sealed"], key["wrapped"])
    c = open_chunk(cipher, *args)
    assert c.steps.tolist() == [6, 9] and np.array_equal(c.X, X) and np.array_equal(c.y, y)
    assert scan_bytes(row["sealed"] + key["wrapped"]) == []  # nothing of it in the clear
    other, other_key = seal_chunk(cipher, "mdl_a", 2, np.array([6, 9]), X, y)
    assert other["sealed"][12:] != row["sealed"][12:]  # a fresh data key per chunk: equal examples, unrelated bytes
    moved = [("mdl_b",) + args[1:], args[:2] + (other["id"],) + args[3:], args[:3] + (3,) + args[4:],
             args[:4] + (np.array([6, 10], dtype="<i8").tobytes(),) + args[5:],
             args[:5] + (row["sealed"][:-1] + bytes([row["sealed"][-1] ^ 1]),) + args[6:],
             args[:6] + (other_key["wrapped"],)]
    for bad in moved:  # another model, chunk id, group, steps; a flipped bit; another chunk's key
        with pytest.raises(DecryptionError):
            open_chunk(cipher, *bad)
    with pytest.raises(DecryptionError):  # without the service key the wrapped data key is useless
        open_chunk(Cipher(os.urandom(32)), *args)


def scan_bytes(data: bytes) -> list[str]:
    return [n for n, b in needles_of(X_FORGET, Y_FORGET).items() if b in data]


def test_migration_0010_on_postgresql_with_rows(tmp_path):
    """The PostgreSQL path of 0010 (constraint names freed and restored, rows sealed, plaintext table dropped)
    on a database of its own that holds examples, down to 0009 and up again."""
    import secrets

    from alembic import command
    from sqlalchemy.engine import make_url

    from app.config import Settings
    from app.db.migrate import alembic_config
    from app.main import create_app

    from .conftest import PG_URL, _pg_admin_url

    if not PG_URL:
        pytest.skip("PostgreSQL tests need OLU_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test)")
    base = make_url(_pg_admin_url(PG_URL))
    name = f"olu_mig8_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = base.set(database=name).render_as_string(hide_password=False)
    try:
        settings = Settings(data_dir=tmp_path, database_url=url, log_level="WARNING")
        ctx = create_app(settings).state.ctx
        t = ctx.tenants.create_tenant("mig")["id"]
        m = ctx.models.create(t, _spec("active_olu", {}))["id"]
        ids, X, y = _batch(60, "pg")
        ctx.models.learn(t, m, ids, X, y)
        cfg = alembic_config(url)
        cfg.attributes["cipher"] = ctx.models.registry.cipher
        ctx.db.dispose()
        command.downgrade(cfg, "0009")
        eng = create_engine(url)
        with eng.connect() as conn:
            x, = conn.execute(text("SELECT x FROM retained_examples WHERE model_id=:m AND step=:s"),
                              {"m": m, "s": AT + 1}).one()
        assert bytes(x) == np.asarray(X_FORGET, dtype="<f8").tobytes()  # control: in the clear before 0010
        command.upgrade(cfg, "head")
        with eng.connect() as conn:
            names = {r[0] for r in conn.execute(text(
                "SELECT conname FROM pg_constraint WHERE conrelid IN ('retained_chunks'::regclass, "
                "'retained_chunk_keys'::regclass)"))}
            assert names == {"pk_retained_chunks", "fk_retained_chunks_model_id_models",
                             "pk_retained_chunk_keys", "fk_retained_chunk_keys_model_id_models"}
            for old in ("retained_examples_plain", "retained_examples", "retained_keys"):
                assert conn.execute(text(f"SELECT to_regclass('{old}')")).scalar() is None
            dump = b"".join(bytes(v) for row in conn.execute(text(
                "SELECT c.sealed, k.wrapped FROM retained_chunks c JOIN retained_chunk_keys k ON k.chunk_id = c.id"))
                for v in row)
        eng.dispose()
        assert len(dump) > 0 and scan_bytes(dump) == []
        ctx = create_app(settings).state.ctx
        ctx.models.unlearn(t, m, [ids[AT]])  # the sealed examples open: the forget runs GD on them
        ctx.db.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
