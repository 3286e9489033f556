"""Secret state is sealed at rest (AES-256-GCM, key id in the blob, AAD = owner) and rate limiting per key."""
from __future__ import annotations

import base64
import os
import stat

import httpx
import pytest
from sqlalchemy import create_engine, select, update

from app.api.ratelimit import TokenBuckets
from app.crypto import Cipher, DecryptionError, load_cipher
from app.db.state_codec import MAGIC as STATE_MAGIC
from app.db.tables import ModelState, Tenant

from .conftest import start_server
from .helpers import create_model, examples, unit_rows


def test_seal_open_binds_owner_and_rotates():
    k1, k2 = os.urandom(32), os.urandom(32)
    c1 = Cipher(k1)
    blob = c1.seal(b"secret state", "state", "mdl_a")
    assert b"secret state" not in blob and blob[:4] == b"OLUE"
    assert c1.open(blob, "state", "mdl_a") == b"secret state"
    with pytest.raises(DecryptionError):
        c1.open(blob, "state", "mdl_b")  # swapped onto another model
    with pytest.raises(DecryptionError):
        c1.open(blob, "record-key", "mdl_a")
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(DecryptionError):
        c1.open(tampered, "state", "mdl_a")
    # nonces are random: sealing twice differs
    assert c1.seal(b"x", "state", "m") != c1.seal(b"x", "state", "m")
    # rotation: the new key seals, the old one is kept for opening
    c2 = Cipher(k2, [k1])
    assert c2.open(blob, "state", "mdl_a") == b"secret state"
    assert c2.key_id_in(c2.seal(b"y", "state", "m")) == c2.active_key_id != c1.active_key_id
    with pytest.raises(DecryptionError):
        Cipher(k2).open(blob, "state", "mdl_a")  # old key dropped: refuses, never guesses
    assert c2.open(b"legacy plaintext", "state", "m") == b"legacy plaintext"


def test_seal_large_is_seals_layout_in_one_buffer():
    """A large state is sealed straight into one buffer (no copy to put the header in front): the same layout as
    ``seal``, opened by ``open`` and bound to its owner like it; the nonce is random."""
    c = Cipher(os.urandom(32))
    plain = os.urandom(1 << 20) + b"secret state"
    big = c.seal_large(plain, "state", "mdl_a")
    small = c.seal(plain, "state", "mdl_a")
    assert len(big) == len(small) and big[:13] == small[:13] and big[13:25] != small[13:25]  # header; own nonce
    assert c.open(bytes(big), "state", "mdl_a") == plain == c.open(big, "state", "mdl_a")
    assert b"secret state" not in big
    with pytest.raises(DecryptionError):
        c.open(big, "state", "mdl_b")
    assert c.open(c.seal_large(b"", "state", "m"), "state", "m") == b""


def test_generated_key_file_is_private_and_stable(tmp_path):
    c = load_cipher(tmp_path, None, None)
    path = tmp_path / "encryption.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_cipher(tmp_path, None, None).active_key_id == c.active_key_id
    explicit = base64.b64encode(os.urandom(32)).decode()
    assert load_cipher(tmp_path, explicit, None).active_key_id != c.active_key_id
    with pytest.raises(ValueError):
        load_cipher(tmp_path, base64.b64encode(b"short").decode(), None)


def _raw_engine(url: str):
    return create_engine(url)


def test_state_and_record_keys_are_sealed_in_the_database_and_rotation_works(tmp_path):
    url = f"sqlite:///{tmp_path / 'olu.db'}"
    k1, k2 = base64.b64encode(os.urandom(32)).decode(), base64.b64encode(os.urandom(32)).decode()
    srv, (uv, thread) = start_server(url, tmp_path, "sqlite", encryption_key=k1)
    try:
        tenant_id, key = srv.new_tenant()
        with srv.client(key) as c:
            m1, m2 = create_model(c, dim=3)["id"], create_model(c, dim=3)["id"]
            for mid in (m1, m2):
                assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(5, 3))}).status_code == 200
        eng = _raw_engine(url)
        with eng.connect() as conn:
            blobs = dict(conn.execute(select(ModelState.model_id, ModelState.blob)).all())
            rkey = conn.execute(select(Tenant.record_key).where(Tenant.id == tenant_id)).scalar_one()
        assert all(b[:4] == b"OLUE" and STATE_MAGIC not in b for b in blobs.values())
        assert rkey[:4] == b"OLUE" and len(rkey) > 32
        # swapping two models' sealed states is detected (AAD = model id): the write fails, nothing changes
        with eng.begin() as conn:
            conn.execute(update(ModelState).where(ModelState.model_id == m1).values(blob=blobs[m2]))
        srv.app.state.ctx.models.registry.evict(m1)
        with srv.client(key) as c:
            before = c.get(f"/v1/models/{m1}").json()
            r = c.post(f"/v1/models/{m1}/learn", json={"examples": examples(unit_rows(1, 3), prefix="z")})
            assert r.status_code == 500 and "secret" not in r.text.lower()
            assert c.get(f"/v1/models/{m1}").json() == before
        with eng.begin() as conn:
            conn.execute(update(ModelState).where(ModelState.model_id == m1).values(blob=blobs[m1]))
        eng.dispose()
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()
    # rotate: k2 active, k1 only for decryption; old blobs load, new writes are sealed with k2
    srv, (uv, thread) = start_server(url, tmp_path, "sqlite", encryption_key=k2, encryption_keys_old=k1)
    try:
        cipher = srv.app.state.ctx.models.registry.cipher
        with srv.client(key) as c:
            assert c.post(f"/v1/models/{m1}/learn", json={"examples": examples(unit_rows(2, 3), prefix="n")}).status_code == 200
            assert c.post(f"/v1/models/{m1}/unlearn", json={"ids": ["rec-0"]}).status_code == 200
            assert c.post(f"/v1/models/{m2}/predict", json={"x": [[0.1, 0.2, 0.3]]}).status_code == 200
        eng = _raw_engine(url)
        with eng.connect() as conn:
            blobs = dict(conn.execute(select(ModelState.model_id, ModelState.blob)).all())
        eng.dispose()
        assert cipher.key_id_in(blobs[m1]) == cipher.active_key_id
        assert cipher.key_id_in(blobs[m2]) != cipher.active_key_id  # untouched since: still under k1
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()
    # without the old key, values still sealed under it refuse to load instead of serving garbage
    srv, (uv, thread) = start_server(url, tmp_path, "sqlite", encryption_key=k2)
    try:
        with srv.client(key) as c:
            r = c.post(f"/v1/models/{m2}/learn", json={"examples": examples(unit_rows(1, 3), prefix="q")})
            assert r.status_code == 500
            assert c.get(f"/v1/models/{m2}").status_code == 200  # public reads still work
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()
    # re-sealing completes the rotation: afterwards k1 can be dropped
    from app.crypto import parse_key
    from app.db.reseal import reseal_all
    from app.db.session import Database

    db = Database(url)
    assert reseal_all(db, Cipher(parse_key(k2), [parse_key(k1)])) == {"tenants": 1, "models": 1, "retained_keys": 0,
                                                                 "delta_keys": 0, "operation_keys": 0}
    assert reseal_all(db, Cipher(parse_key(k2))) == {"tenants": 0, "models": 0, "retained_keys": 0, "delta_keys": 0,
                                                     "operation_keys": 0}
    db.dispose()
    srv, (uv, thread) = start_server(url, tmp_path, "sqlite", encryption_key=k2)
    try:
        with srv.client(key) as c:
            for mid in (m1, m2):
                r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(1, 3), prefix="q")})
                assert r.status_code == 200, r.text
            assert c.post(f"/v1/models/{m2}/unlearn", json={"ids": ["rec-1"]}).status_code == 200
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()


def test_token_bucket_refills_at_the_rate():
    now = [0.0]
    b = TokenBuckets(rate=2, burst=2, clock=lambda: now[0])
    assert b.take(b"k") == 0 and b.take(b"k") == 0
    wait = b.take(b"k")
    assert 0 < wait <= 0.5
    assert b.take(b"other") == 0  # per key
    now[0] += 0.5
    assert b.take(b"k") == 0


def test_rate_limit_answers_429_with_retry_after_per_key(tmp_path):
    srv, (uv, thread) = start_server(f"sqlite:///{tmp_path / 'olu.db'}", tmp_path, "sqlite",
                                     rate_limit=5, rate_limit_burst=5)
    try:
        _, key_a = srv.new_tenant("a")
        _, key_b = srv.new_tenant("b")
        with srv.client(key_a) as a, srv.client(key_b) as b:
            codes = [a.get("/v1/models").status_code for _ in range(12)]
            assert codes[:5] == [200] * 5 and 429 in codes
            r = a.get("/v1/models")
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["type"].endswith("/rate-limited")
            assert b.get("/v1/models").status_code == 200  # another key has its own bucket
            assert httpx.get(srv.url + "/healthz").status_code == 200  # unauthenticated public endpoints pass
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()


def test_rate_limit_off_and_default(tmp_path):
    from app.config import Settings

    assert Settings(rate_limit="").rate_limit is None
    assert Settings(rate_limit=0).rate_limit == 0
    assert Settings().rate_limit >= 1000


def test_transient_database_errors_answer_503_with_retry_after(server, tenant):
    """A deadlock or serialization failure is rolled back: the client is told to retry, not given a 500."""
    import psycopg
    from sqlalchemy.exc import OperationalError

    _, c = tenant
    models = server.app.state.ctx.models.lifecycle  # the service GET /v1/models calls
    original = models.list

    def deadlock(*_a, **_k):
        raise OperationalError("SELECT 1", {}, psycopg.errors.DeadlockDetected("deadlock detected"))

    models.list = deadlock
    try:
        r = c.get("/v1/models")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["type"].endswith("/database-busy")
    finally:
        models.list = original
    assert c.get("/v1/models").status_code == 200
