"""No secret ever leaves the service: a full session against the real process, every byte scanned.

Collected: every response body and header of a session that exercises every endpoint (including errors,
idempotent replays, revocation and deletion), and every log line the process wrote (uvicorn at debug level
and the application's own logs).  Searched for, in raw, hex, base64 and base64url forms:

- the Ed25519 signing key (raw seed and PKCS#8 PEM);
- the AES-256-GCM state encryption key (generated into the data directory on first start);
- the decrypted secret state blob of every model and the raw float64 bytes of its ``theta``;
- every tenant's record-commitment HMAC key;
- the admin token, and every API key except in the one response that created it.

Then the SQLite database file (and its WAL) must not hold any plaintext state blob or record key.
"""
from __future__ import annotations

import base64
import binascii
import httpx
import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, select

from app.crypto import Cipher, parse_key
from app.db.state_codec import MAGIC as STATE_MAGIC
from app.db.state_codec import unpack_state
from app.db.tables import ModelState, Tenant

from .conftest import ADMIN_TOKEN
from .helpers import examples, unit_rows
from .procs import ServiceProcess, service_env


def _forms(secret: bytes) -> list[bytes]:
    """The encodings a leaked secret would most likely show up in."""
    forms = [secret, binascii.hexlify(secret), base64.b64encode(secret), base64.urlsafe_b64encode(secret),
             base64.b64encode(secret).rstrip(b"="), base64.urlsafe_b64encode(secret).rstrip(b"=")]
    return [f for f in forms if len(f) >= 16]


class Recorder:
    def __init__(self):
        self.exchanges: list[tuple[str, int, bytes]] = []  # (what, status, headers + body)

    def hook(self, response: httpx.Response) -> None:
        response.read()
        head = "\n".join(f"{k}: {v}" for k, v in response.headers.items()).encode()
        self.exchanges.append((f"{response.request.method} {response.request.url.path}", response.status_code,
                               head + b"\n\n" + response.content))

    def client(self, svc: ServiceProcess, token: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=svc.url, headers=headers, timeout=60, event_hooks={"response": [self.hook]})


def _session(svc: ServiceProcess, rec: Recorder) -> tuple[list[tuple[str, int]], list[str]]:
    """Exercise every endpoint; returns the API keys created (with the index of their creation response)."""
    created: list[tuple[str, int]] = []
    with rec.client(svc, ADMIN_TOKEN) as adm:
        r = adm.post("/v1/tenants", json={"name": "scan"})
        tenant_id, key = r.json()["id"], r.json()["api_key"]
        created.append((key, len(rec.exchanges) - 1))
        r = adm.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["predict"], "label": "app"})
        created.append((r.json()["api_key"], len(rec.exchanges) - 1))
        predict_key, predict_key_id = r.json()["api_key"], r.json()["id"]
        r = adm.post("/v1/tenants", json={"name": "other"})
        created.append((r.json()["api_key"], len(rec.exchanges) - 1))
        other_key = r.json()["api_key"]
    model_ids = []
    with rec.client(svc, key) as c:
        for name, dim in (("a", 3), ("b", 2)):
            r = c.post("/v1/models", json={"name": name, "dim": dim, "bounds": {"x_norm": 1.0}},
                       headers={"Idempotency-Key": f"create-{name}"})
            mid = r.json()["id"]
            model_ids.append(mid)
            c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(12, dim))})
            c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(2, dim), prefix="z")},
                   headers={"Idempotency-Key": f"learn-{name}"})
            c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(2, dim), prefix="z")},
                   headers={"Idempotency-Key": f"learn-{name}"})  # replay
            c.post(f"/v1/models/{mid}/predict", json={"x": unit_rows(3, dim).tolist()})
            c.get(f"/v1/models/{mid}/parameters")
            u = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1", "rec-2"]},
                       headers={"Idempotency-Key": f"forget-{name}"})
            c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1", "rec-2"]},
                   headers={"Idempotency-Key": f"forget-{name}"})  # replay
            c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]})  # already forgotten
            c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["never"]})  # unknown
            c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "bad", "x": [9.0] * dim, "y": 1}]})
            c.post(f"/v1/models/{mid}/learn", content=b"{not json", headers={"content-type": "application/json"})
            c.post(f"/v1/models/{mid}/retrain")
            c.get(f"/v1/models/{mid}")
            c.get(f"/v1/models/{mid}/ledger")
            c.get(f"/v1/models/{mid}/deletions")
            c.get(f"/v1/receipts/{u.json()['receipts'][0]['id']}")
        c.get("/v1/models")
        c.get("/v1/audit/records/rec-1")
        c.get("/v1/audit/records/rec-5")
        c.get("/v1/audit/checkpoint")
        c.get("/v1/models/mdl_doesnotexist")
        c.delete(f"/v1/models/{model_ids[1]}")
        c.get(f"/v1/models/{model_ids[1]}/ledger")
    with rec.client(svc, predict_key) as p:
        p.post(f"/v1/models/{model_ids[0]}/predict", json={"x": [[0.1, 0.2, 0.3]]})
        p.post(f"/v1/models/{model_ids[0]}/learn", json={"examples": examples(unit_rows(1, 3), prefix="p")})
    with rec.client(svc, other_key) as o:
        o.get(f"/v1/models/{model_ids[0]}")
    with rec.client(svc, ADMIN_TOKEN) as adm:
        adm.delete(f"/v1/tenants/{tenant_id}/keys/{predict_key_id}")
        adm.get("/v1/models")
    with rec.client(svc, predict_key) as p:
        p.get("/v1/models")  # revoked
    with rec.client(svc, key[:-3] + "abc") as p:
        p.get("/v1/models")  # a near miss of a real key
    with rec.client(svc) as anon:
        for path in ("/v1/keys", "/v1/algorithms", "/healthz", "/readyz", "/metrics", "/openapi.json"):
            anon.get(path)
    return created, model_ids


def test_no_secret_in_any_response_header_or_log_line(tmp_path):
    sk = Ed25519PrivateKey.generate()
    seed = sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    pem = sk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())
    url = f"sqlite:///{tmp_path / 'olu.db'}"
    log_path = tmp_path / "service.log"
    svc = ServiceProcess(service_env(tmp_path, url, OLU_SIGNING_KEY=base64.b64encode(seed).decode()),
                         log_path)
    svc.log_level = "debug"
    rec = Recorder()
    svc.start()
    try:
        created, model_ids = _session(svc, rec)
    finally:
        svc.stop()
    aes_key = parse_key((tmp_path / "encryption.key").read_text())
    cipher = Cipher(aes_key)
    eng = create_engine(url)
    with eng.connect() as conn:
        blobs = dict(conn.execute(select(ModelState.model_id, ModelState.blob)).all())
        record_keys = dict(conn.execute(select(Tenant.id, Tenant.record_key)).all())
    eng.dispose()
    assert blobs and record_keys
    plain_states = {mid: cipher.open(b, "state", mid) for mid, b in blobs.items()}
    plain_record_keys = {tid: cipher.open(k, "record-key", tid) for tid, k in record_keys.items()}

    secrets: dict[str, bytes] = {"signing seed": seed, "aes key": aes_key, "admin token": ADMIN_TOKEN.encode()}
    for mid, plain in plain_states.items():
        secrets[f"state blob {mid}"] = plain
        theta = unpack_state(plain)["theta"]
        secrets[f"theta bytes {mid}"] = np.ascontiguousarray(theta, dtype="<f8").tobytes()
    for tid, k in plain_record_keys.items():
        secrets[f"record key {tid}"] = k
    pem_body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))

    logs = log_path.read_bytes()
    assert b"GET /v1/models" in logs, "the access log was not captured"
    haystacks = [(what, status, data) for what, status, data in rec.exchanges] + [("service log", 0, logs)]
    assert len(rec.exchanges) > 50
    for what, status, data in haystacks:
        for name, secret in secrets.items():
            for form in _forms(secret):
                assert form not in data, f"{name} found in {what} ({status})"
        assert pem_body not in data and b"PRIVATE KEY" not in data, f"signing key PEM in {what}"
    # API keys: only the response that created each one shows it (and no log line ever does)
    for raw, index in created:
        secret_part = raw.split("_", 2)[2].encode()  # olu_<prefix>_<secret>; the secret may itself hold "_"
        for i, (what, status, data) in enumerate(haystacks):
            if i == index:
                assert raw.encode() in data
                continue
            assert secret_part not in data, f"API key shown again in {what} ({status})"

    # at rest: no plaintext secret state or record key in the database files
    db_bytes = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("olu.db"))
    for mid, plain in plain_states.items():
        assert plain not in db_bytes and plain[8:40] not in db_bytes, f"plaintext state of {mid} at rest"
    for tid, k in plain_record_keys.items():
        assert k not in db_bytes, f"plaintext record key of {tid} at rest"
    assert STATE_MAGIC not in db_bytes  # no plaintext state header anywhere in the files
