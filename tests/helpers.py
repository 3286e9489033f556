"""Small helpers shared by the API tests."""
from __future__ import annotations

import base64

import numpy as np


def unit_rows(n: int, d: int, seed: int = 0, scale: float = 0.9) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return scale * X / np.linalg.norm(X, axis=1, keepdims=True)


def create_model(client, dim: int = 4, **overrides) -> dict:
    body = {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": dim, "bounds": {"x_norm": 1.0},
            "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}}
    body.update(overrides)
    r = client.post("/v1/models", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def learned_model(client, dim: int, n: int, **overrides) -> str:
    """A new model (``create_model``) with ``n`` unit-ball records rec-0 .. rec-{n-1} learned; its id."""
    mid = create_model(client, dim=dim, **overrides)["id"]
    r = client.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(n, dim))})
    assert r.status_code == 200, r.text
    return mid


def examples(X: np.ndarray, prefix: str = "rec", start: int = 0) -> list[dict]:
    return [{"id": f"{prefix}-{start + i}", "x": x.tolist(), "y": float(i % 2)} for i, x in enumerate(X)]


def verify_receipt(receipt: dict, public_keys: list[dict]) -> bool:
    """Check a receipt's Ed25519 signature over its RFC 8785 form with only the published public keys."""
    import rfc8785
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = next((k for k in public_keys if k["key_id"] == receipt["key_id"]), None)
    if key is None:
        return False
    signed = {k: v for k, v in receipt.items() if k not in ("signature", "proof")}
    pub = Ed25519PublicKey.from_public_bytes(base64.b64decode(key["public_key"]))
    try:
        pub.verify(_b64decode_any(receipt["signature"]), rfc8785.dumps(signed))
        return True
    except InvalidSignature:
        return False


def _b64decode_any(s: str) -> bytes:
    s = s.replace("-", "+").replace("_", "/")
    return base64.b64decode(s + "=" * (-len(s) % 4))


def all_receipts(client, model_id: str) -> list[dict]:
    """Every receipt of a model's deletion log, page by page."""
    out, cursor = [], None
    while True:
        page = client.get(f"/v1/models/{model_id}/deletions",
                          params={"limit": 200, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        out += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return out


def add_tenant(ctx, tenant_id: str) -> None:
    """A tenant row with a fixed id (and a fresh record key) for tests that name tenants; kept if it exists."""
    import secrets

    from app.db.tables import Tenant
    from app.ids import utcnow
    from app.services.records import seal_record_key

    with ctx.db.write() as s:
        if s.get(Tenant, tenant_id) is None:
            s.add(Tenant(id=tenant_id, name=tenant_id, log_size=0, created_at=utcnow(),
                         record_key=seal_record_key(ctx.tenants.cipher, tenant_id, secrets.token_bytes(32))))
