"""Hardening (issue 13, item 4): failed authentication throttled per client address, admin tokens of at least
32 characters, and a schema that refuses what it forbids (booleans for numbers, control characters in ids and
names, malformed cursors, non-RFC 3339 date-times).  Every refusal is an RFC 9457 problem and changes nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import httpx
import msgpack
import pytest

from .conftest import ADMIN_TOKEN, free_port, start_server
from .helpers import create_model, learned_model

ROOT = Path(__file__).resolve().parents[1]


def _problem(r, status, slug=None):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["status"] == status
    if slug:
        assert body["type"].endswith("/" + slug), r.text
    return body


def _state(c, mid):
    m = c.get(f"/v1/models/{mid}").json()
    return m["version"], m["step"], m["n_records"], m["n_forgotten"]


def _from(srv, address: str, token: str | None = None) -> httpx.Client:
    """A client whose connections leave from ``address`` (any 127.x.y.z reaches the loopback server)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=srv.url, headers=headers, timeout=60,
                        transport=httpx.HTTPTransport(local_address=address))


# ---- failed authentication, per client address ------------------------------------------------------------
LIMIT = 100  # the production default (OLU_AUTH_FAILURE_LIMIT), checked in test_rotating_admin_token_guesses_hit_429


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server with the production defaults of the failure throttle (100 failures per 60 s per address)."""
    d = tmp_path_factory.mktemp("guarded")
    srv, (uv, thread) = start_server(f"sqlite:///{d / 'olu.db'}", d, "sqlite", auth_failure_limit=LIMIT)
    yield srv
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


def _assert_throttled(codes: list[int], limit: int):
    # the bucket starts full and only refills with time: the first `limit` failures are plain 401s
    assert set(codes[:limit]) == {401}, Counter(codes)
    assert set(codes) <= {401, 429}, Counter(codes)
    assert codes.count(429) > 0, f"{len(codes)} rotating guesses were never throttled: {Counter(codes)}"


def test_rotating_admin_token_guesses_hit_429(guarded):
    _, key = guarded.new_tenant("bystander")
    with _from(guarded, "127.0.0.2") as attacker:
        rs = [attacker.post("/v1/tenants", json={"name": "x"},
                            headers={"authorization": f"Bearer guess-{i:04d}-" + "g" * 30}) for i in range(500)]
        codes = [r.status_code for r in rs]
        _assert_throttled(codes, LIMIT)
        throttled = next(r for r in rs if r.status_code == 429)
        body = _problem(throttled, 429, "rate-limited")
        assert "failed authentication" in body["detail"]
        assert int(throttled.headers["retry-after"]) >= 1
        # while throttled, the address's failures are refused; a valid token is still let through (issue 21: one
        # client behind a shared address must not lock out the others; tests/test_client_address.py)
        assert attacker.post("/v1/tenants", json={"name": "x"},
                             headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 201
        assert attacker.get("/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200
        again = [attacker.get("/v1/models", headers={"authorization": f"Bearer guess-again-{i}-" + "g" * 30})
                 for i in range(20)]  # (the bucket may have refilled a failure or two meanwhile)
        _problem(next(r for r in again if r.status_code == 429), 429, "rate-limited")
        # requests that present no token are not guesses: still 401 (and public endpoints are untouched)
        _problem(attacker.get("/v1/models"), 401, "unauthorized")
        assert attacker.get("/v1/keys").status_code == 200
    # legitimate traffic from other addresses is unaffected
    with guarded.admin() as adm:
        assert adm.post("/v1/tenants", json={"name": "still-works"}).status_code == 201
    with guarded.client(key) as c:
        assert c.get("/v1/models").status_code == 200
    with _from(guarded, "127.0.0.4", key) as other:
        assert other.get("/v1/models").status_code == 200
    from app.config import Settings

    assert Settings.model_fields["auth_failure_limit"].default == LIMIT
    assert Settings.model_fields["auth_failure_window"].default == 60.0


def test_rotating_api_key_guesses_hit_429(guarded):
    _, key = guarded.new_tenant("victim")
    prefix = key.rsplit("_", 1)[0]  # a real key's id, with guessed secrets
    with _from(guarded, "127.0.0.3") as attacker:
        codes = [attacker.get("/v1/models", headers={"authorization": f"Bearer {prefix}_guess{i:05d}"}).status_code
                 for i in range(250)]
        codes += [attacker.get("/v1/models", headers={"authorization": f"Bearer olu_{i:012x}_guess"}).status_code
                  for i in range(250)]
    _assert_throttled(codes, LIMIT)
    with guarded.client(key) as c:
        assert c.get("/v1/models").status_code == 200


def test_failure_throttle_refills_and_bounds_its_memory():
    from app.api.ratelimit import AuthFailureThrottle

    now = [0.0]
    t = AuthFailureThrottle(limit=3, window_seconds=30.0, max_addresses=50, clock=lambda: now[0])
    for _ in range(3):
        assert t.retry_after("203.0.113.7") == 0
        t.failed("203.0.113.7")
    assert t.retry_after("203.0.113.7") == 10  # one failure back every window/limit = 10 s
    assert t.retry_after("203.0.113.8") == 0  # another address is not affected
    assert t.retry_after("::ffff:203.0.113.7") == 10  # the same IPv4 client through a dual-stack socket
    now[0] = 10.0
    assert t.retry_after("203.0.113.7") == 0
    # IPv6 clients are counted per /64 (one host usually holds a whole /64)
    for i in range(3):
        t.failed(f"2001:db8:0:1::{i + 1:x}")
    assert t.retry_after("2001:db8:0:1:ffff::9") > 0 and t.retry_after("2001:db8:0:2::1") == 0
    # memory: at most max_addresses are tracked, whatever the number of failing addresses
    for i in range(10_000):
        t.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(t.buckets._buckets) <= 50
    # addresses that only ever succeed are never tracked
    before = len(t.buckets._buckets)
    assert t.retry_after("198.51.100.1") == 0 and len(t.buckets._buckets) == before


# ---- the admin token --------------------------------------------------------------------------------------
def test_short_admin_token_is_refused_at_creation(tmp_path):
    from app.config import Settings
    from app.main import create_app

    with pytest.raises(Exception) as e:
        create_app(Settings(data_dir=tmp_path, admin_token="x" * 31))
    assert "OLU_ADMIN_TOKEN" in str(e.value) and "32" in str(e.value)
    assert "x" * 31 not in str(e.value)  # the token itself is never echoed
    app = create_app(Settings(data_dir=tmp_path, admin_token="x" * 32))
    app.state.ctx.db.dispose()


@pytest.mark.parametrize("token", ["change-me", "a"])
def test_service_refuses_to_start_with_a_short_admin_token(tmp_path, token):
    env = {**os.environ, "OLU_DATA_DIR": str(tmp_path), "OLU_ADMIN_TOKEN": token, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(free_port())]
    try:
        out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the service started (and kept serving) with OLU_ADMIN_TOKEN={token!r}")
    assert out.returncode != 0
    assert "OLU_ADMIN_TOKEN" in out.stderr and "at least 32 characters" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_test_suite_and_readme_use_long_admin_tokens():
    assert len(ADMIN_TOKEN) >= 32
    readme = (ROOT / "README.md").read_text()
    serve = next(line for line in readme.splitlines() if "uvicorn app.main:app" in line)
    token = serve.split("OLU_ADMIN_TOKEN=", 1)[1].split()[0]
    assert len(token) >= 32, serve


# ---- schema strictness ------------------------------------------------------------------------------------
@pytest.fixture
def fresh(server):
    """A tenant client and a model with 3 learned records."""
    _, key = server.new_tenant("strict")
    with server.client(key) as c:
        yield c, learned_model(c, dim=2, n=3)


def test_booleans_and_strings_are_not_numbers(fresh):
    c, mid = fresh
    before = _state(c, mid)
    for x in ([[False, 0.1]], [[True, 0]], [["0.5", 0.1]]):
        _problem(c.post(f"/v1/models/{mid}/predict", json={"x": x}), 422, "validation-error")
    bad_examples = [{"id": "b", "x": [0.1, 0.1], "y": True}, {"id": "b", "x": [False, 0.1], "y": 1}]
    for ex in bad_examples:
        _problem(c.post(f"/v1/models/{mid}/learn", json={"examples": [ex]}), 422, "validation-error")
    # a string is a class name (the schema takes one for any model): this model declared none (issue 21)
    _problem(c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "b", "x": [0.1, 0.1], "y": "1"}]}), 422,
             "invalid-label")
    bad_columns = [{"ids": ["b"], "x": [[0.1, 0.1]], "y": [True]}, {"ids": ["b"], "x": [[True, 0.1]], "y": [1]},
                   {"ids": ["b"], "x": [["0.1", 0.1]], "y": [1]}, {"ids": ["b"], "x": [[0.1, 0.1]], "y": ["0"]}]
    for body in bad_columns:
        _problem(c.post(f"/v1/models/{mid}/learn", json=body), 422, "validation-error")
        _problem(c.post(f"/v1/models/{mid}/learn", content=msgpack.packb(body),
                        headers={"content-type": "application/msgpack"}), 422, "validation-error")
    # unlearn with the examples (memory_pair with client features): the same strict numbers
    _problem(c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"], "examples": [
        {"id": "rec-0", "x": [0.1, 0.1], "y": False}]}), 422, "validation-error")
    assert _state(c, mid) == before
    # model specifications
    base = {"name": "n", "dim": 2, "bounds": {"x_norm": 1.0}}
    for spec in ({**base, "dim": True}, {**base, "bounds": {"x_norm": True}}, {**base, "bounds": {"x_norm": "1"}},
                 {**base, "bounds": {"x_norm": 1.0, "y_abs": True}}, {**base, "domain_radius": True},
                 {**base, "l2": False}, {**base, "privacy": {"epsilon": True}},
                 {**base, "privacy": {"epsilon": 1.0, "delta": True}}):
        _problem(c.post("/v1/models", json=spec), 422, "validation-error")
    # integers are numbers
    assert c.post("/v1/models", json={**base, "bounds": {"x_norm": 1}, "domain_radius": 10, "l2": 1}).status_code == 201
    assert c.post(f"/v1/models/{mid}/predict", json={"x": [[1, 0]]}).status_code == 200
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "int", "x": [0, 1], "y": 1}]}).status_code == 200
    assert c.post(f"/v1/models/{mid}/learn", json={"ids": ["int2"], "x": [[1, 0]], "y": [0]}).status_code == 200


CONTROL = ["\x00", "\x01", "\t", "\n", "\x1f", "\x7f"]


@pytest.mark.parametrize("ch", CONTROL, ids=[f"{ord(ch):#04x}" for ch in CONTROL])
def test_ids_and_names_with_control_characters_are_refused(server, fresh, ch):
    c, mid = fresh
    before = _state(c, mid)
    rid = f"rec{ch}x"
    _problem(c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": rid, "x": [0.1, 0.1], "y": 1}]}),
             422, "validation-error")
    _problem(c.post(f"/v1/models/{mid}/learn", json={"ids": [rid], "x": [[0.1, 0.1]], "y": [1]}), 422,
             "validation-error")
    _problem(c.post(f"/v1/models/{mid}/learn", content=msgpack.packb({"ids": [rid], "x": [[0.1, 0.1]], "y": [1]}),
                    headers={"content-type": "application/msgpack"}), 422, "validation-error")
    _problem(c.post(f"/v1/models/{mid}/unlearn", json={"ids": [rid]}), 422, "validation-error")
    _problem(c.get("/v1/audit/records/" + quote(rid, safe="")), 422, "validation-error")
    _problem(c.get("/v1/audit/export", params={"record_id": rid}), 422, "validation-error")
    # model ids (and every other id) in paths and queries
    bad_mid = quote(mid + ch, safe="")
    for method, path, body in (("GET", f"/v1/models/{bad_mid}", None),
                               ("POST", f"/v1/models/{bad_mid}/learn", {"examples": [{"id": "z", "x": [0, 0], "y": 1}]}),
                               ("POST", f"/v1/models/{bad_mid}/unlearn", {"ids": ["rec-0"]}),
                               ("POST", f"/v1/models/{bad_mid}/predict", {"x": [[0, 0]]}),
                               ("GET", f"/v1/models/{bad_mid}/parameters", None),
                               ("GET", f"/v1/models/{bad_mid}/ledger", None),
                               ("GET", f"/v1/models/{bad_mid}/deletions", None),
                               ("DELETE", f"/v1/models/{bad_mid}", None),
                               ("GET", "/v1/receipts/" + quote("rcp_0" + ch, safe=""), None)):
        _problem(c.request(method, path, json=body), 422, "validation-error")
    _problem(c.get("/v1/audit/export", params={"model_id": mid + ch}), 422, "validation-error")
    # names and labels (PostgreSQL cannot store NUL: this was a 500 there)
    _problem(c.post("/v1/models", json={"name": f"m{ch}", "dim": 2, "bounds": {"x_norm": 1.0}}), 422,
             "validation-error")
    with server.admin() as adm:
        _problem(adm.post("/v1/tenants", json={"name": f"t{ch}"}), 422, "validation-error")
        tid = adm.post("/v1/tenants", json={"name": "ok"}).json()["id"]
        _problem(adm.post(f"/v1/tenants/{tid}/keys", json={"scopes": ["audit"], "label": f"l{ch}"}), 422,
                 "validation-error")
        _problem(adm.post(f"/v1/tenants/{quote(tid + ch, safe='')}/keys", json={"scopes": ["audit"]}), 422,
                 "validation-error")
        _problem(adm.delete(f"/v1/tenants/{tid}/keys/{quote('key_1' + ch, safe='')}"), 422, "validation-error")
    assert _state(c, mid) == before
    # other unicode is fine
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "zoë-日本-\u0085", "x": [0.1, 0], "y": 1}]}
                  ).status_code == 200


def test_malformed_cursors_are_refused_on_every_list_endpoint(fresh):
    c, mid = fresh
    ids = [create_model(c, dim=1)["id"] for _ in range(2)]
    page = c.get("/v1/models", params={"limit": 1}).json()
    assert c.get("/v1/models", params={"limit": 1, "cursor": page["next_cursor"]}).status_code == 200
    for bad in ("x" * 5000, "", "mdl_", ids[0] + "0", ids[0][:-1], ids[0].upper(), "0", "\x00", "ten_" + ids[0][4:]):
        _problem(c.get("/v1/models", params={"cursor": bad}), 422, "validation-error")
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0", "rec-1"]}).status_code == 200
    page = c.get(f"/v1/models/{mid}/deletions", params={"limit": 1}).json()
    assert c.get(f"/v1/models/{mid}/deletions", params={"cursor": page["next_cursor"]}).status_code == 200
    for bad in ("x" * 5000, "", "-1", "1.5", "9" * 19, "\x00"):
        _problem(c.get(f"/v1/models/{mid}/deletions", params={"cursor": bad}), 422, "validation-error")


def test_since_and_until_must_be_rfc3339_date_times(fresh):
    c, mid = fresh
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).status_code == 200
    url = f"/v1/models/{mid}/deletions"
    for bad in ("0.5", "0", "1700000000", "2026-01-01", "2026-01-01T00:00:00", "yesterday", "", "2026-13-01T00:00:00Z",
                "2026-01-01 00:00:00Z"):
        for name in ("since", "until"):
            body = _problem(c.get(url, params={name: bad}), 422, "validation-error")
            assert body["errors"][0]["loc"] == ["query", name]
    assert len(c.get(url, params={"since": "2000-01-01T00:00:00Z"}).json()["items"]) == 1
    assert c.get(url, params={"until": "2000-01-01T00:00:00.5+01:00"}).json()["items"] == []
    assert len(c.get(url, params={"since": "2000-01-01t00:00:00-05:30", "until": "2999-12-31T23:59:59Z"}
                     ).json()["items"]) == 1


def test_openapi_states_the_constraints(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    params = {(path, method, p["name"]): p["schema"] for path, ops in doc["paths"].items()
              for method, op in ops.items() for p in op.get("parameters", [])}

    def schema_of(s):
        return next((alt for alt in s.get("anyOf", [s]) if alt.get("type") == "string"), s)

    assert schema_of(params[("/v1/models", "get", "cursor")])["pattern"] == "^mdl_[0-9a-f]{30}$"
    for name in ("since", "until"):
        assert schema_of(params[("/v1/models/{model_id}/deletions", "get", name)])["format"] == "date-time"
    for key, s in params.items():
        if key[2].endswith("_id"):
            assert "\\x00-\\x1f\\x7f" in schema_of(s)["pattern"], key
    record_id = doc["components"]["schemas"]["Example"]["properties"]["id"]
    assert "\\x00-\\x1f\\x7f" in record_id["pattern"]
    committed = (ROOT / "openapi" / "openapi.json").read_text()
    assert "^mdl_[0-9a-f]{30}$" in committed
