"""Issue 21 item 5: client addresses come from the socket; a forwarded header only from a proxy listed in
OLU_TRUSTED_PROXIES.  Failed authentications are throttled per address and per token, and a valid key is never
refused because of what other tokens did from its address."""
from __future__ import annotations

from collections import Counter

import httpx
import pytest

from app.api.clientaddr import ClientResolver, parse_trusted

from .conftest import ADMIN_TOKEN, start_server
from .procs import ServiceProcess, service_env

LIMIT = 5
WINDOW = 3600  # seconds: no failure comes back during a test, however slow the machine


def _from(url: str, address: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, transport=httpx.HTTPTransport(local_address=address))


def _guess(c: httpx.Client, i: int, **headers) -> int:
    return c.get("/v1/models", headers={"authorization": f"Bearer olu_{i:012x}_guess", **headers}).status_code


SPOOFS = [{"x-forwarded-for": "203.0.113.7"}, {"x-forwarded-for": "198.51.100.9, 203.0.113.8"},
          {"forwarded": "for=203.0.113.9"}, {"x-real-ip": "203.0.113.10"},
          {"x-forwarded-for": "::1"}, {"x-forwarded-for": "127.0.0.9"}]


def _assert_spoofing_does_not_lift(url: str):
    with _from(url, "127.0.0.1") as c:  # loopback: the peer uvicorn's own default (forwarded_allow_ips) trusts
        codes = [_guess(c, i) for i in range(LIMIT)]
        assert codes == [401] * LIMIT, codes
        assert _guess(c, LIMIT) == 429
        spoofed = [_guess(c, 100 + i, **SPOOFS[i % len(SPOOFS)]) for i in range(30)]
        assert spoofed == [429] * 30, Counter(spoofed)


@pytest.fixture
def throttled_server(tmp_path):
    srv, (uv, thread) = start_server(f"sqlite:///{tmp_path / 'olu.db'}", tmp_path, "sqlite", auth_failure_limit=LIMIT,
                                     auth_failure_window=WINDOW)
    yield srv
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


def test_a_spoofed_forwarded_header_does_not_lift_the_throttle(throttled_server):
    """The test server is uvicorn with its defaults (proxy headers on, 127.0.0.1 trusted), as `uvicorn app.main:app`
    runs: the service still takes the address from the socket."""
    _assert_spoofing_does_not_lift(throttled_server.url)


def test_a_spoofed_header_does_not_lift_the_throttle_of_a_service_process(tmp_path):
    """The same against `python -m uvicorn app.main:app` in its own process, configured only by the environment."""
    svc = ServiceProcess(service_env(tmp_path, f"sqlite:///{tmp_path / 'olu.db'}", OLU_AUTH_FAILURE_LIMIT=str(LIMIT),
                                     OLU_AUTH_FAILURE_WINDOW=str(WINDOW)),
                         tmp_path / "service.log", log_level="warning").start()
    try:
        _assert_spoofing_does_not_lift(svc.url)
    finally:
        svc.stop()


def test_a_trusted_proxys_header_is_honoured(tmp_path):
    srv, (uv, thread) = start_server(f"sqlite:///{tmp_path / 'olu.db'}", tmp_path, "sqlite", auth_failure_limit=LIMIT,
                                     auth_failure_window=WINDOW, trusted_proxies="127.0.0.7, 10.0.0.0/8")
    try:
        with _from(srv.url, "127.0.0.7") as proxy:
            a = {"x-forwarded-for": "203.0.113.7"}
            assert [_guess(proxy, i, **a) for i in range(LIMIT)] == [401] * LIMIT
            assert _guess(proxy, 50, **a) == 429  # 203.0.113.7 has used up its failures
            # a client cannot choose its address through the proxy: the hop the proxy appended is the client
            assert _guess(proxy, 51, **{"x-forwarded-for": "198.51.100.1, 203.0.113.7"}) == 429
            # ... past further trusted proxies in the chain
            assert _guess(proxy, 52, **{"x-forwarded-for": "203.0.113.7, 10.1.2.3"}) == 429
            # another client behind the same proxy is its own address
            assert _guess(proxy, 53, **{"x-forwarded-for": "203.0.113.8"}) == 401
            # Forwarded is not the configured header: ignored, the proxy itself is the client
            assert _guess(proxy, 54, forwarded="for=203.0.113.7") == 401
        with _from(srv.url, "127.0.0.8") as direct:  # not a listed proxy: its header counts for nothing
            assert _guess(direct, 60, **{"x-forwarded-for": "203.0.113.7"}) == 401
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()


def test_a_valid_key_from_a_throttled_address_still_works(throttled_server):
    srv = throttled_server
    _, key = srv.new_tenant("behind-the-nat")
    with _from(srv.url, "127.0.0.3") as shared:  # one address, many clients (NAT): one of them guesses
        assert [_guess(shared, i) for i in range(LIMIT)] == [401] * LIMIT
        r = shared.get("/v1/models", headers={"authorization": "Bearer olu_000000000000_more"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"].endswith("/rate-limited") and "failed authentications" in r.json()["detail"]
        # the others' valid keys, and the admin token, still pass from that address
        for _ in range(3):
            assert shared.get("/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200
        assert shared.post("/v1/tenants", json={"name": "x"},
                           headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 201
        assert _guess(shared, 99) == 429  # bad tokens from it still are throttled
        assert shared.get("/v1/models").status_code == 401  # no token: not a guess


def test_a_failing_token_is_throttled_from_every_address(throttled_server):
    srv = throttled_server
    bad = {"authorization": "Bearer olu_0123456789ab_always-the-same"}
    codes = []
    for i in range(LIMIT + 3):  # one token, a new address each time (a botnet)
        with _from(srv.url, f"127.0.1.{i + 1}") as c:
            codes.append(c.get("/v1/models", headers=bad).status_code)
    assert codes == [401] * LIMIT + [429] * 3, codes
    with _from(srv.url, "127.0.1.200") as c:  # another token from a fresh address is judged on its own
        assert _guess(c, 7) == 401


def test_resolver_parses_headers_and_lists():
    r = ClientResolver("10.0.0.0/8, 192.0.2.7, 2001:db8::/32")
    xff = [(b"x-forwarded-for", b"1.1.1.1, 203.0.113.7"), (b"x-forwarded-for", b"10.9.9.9")]
    assert r.resolve("127.0.0.1", xff) == "127.0.0.1"  # not a listed proxy
    assert r.resolve("10.0.0.1", xff) == "203.0.113.7"  # both header lines, read from the right past 10.9.9.9
    assert r.resolve("::ffff:10.0.0.1", xff) == "203.0.113.7"  # IPv4-mapped peer
    assert r.resolve("10.0.0.1", []) == "10.0.0.1"  # no header: the proxy
    assert r.resolve("10.0.0.1", [(b"x-forwarded-for", b"203.0.113.7:4711")]) == "203.0.113.7"
    assert r.resolve("10.0.0.1", [(b"x-forwarded-for", b"nonsense")]) == "10.0.0.1"
    assert r.resolve("10.0.0.1", [(b"x-forwarded-for", b"10.2.2.2")]) == "10.2.2.2"  # all trusted: the leftmost
    assert r.resolve("2001:db8::1", [(b"x-forwarded-for", b"[2001:db9::5]:80")]) == "2001:db9::5"
    f = ClientResolver("192.0.2.7", "Forwarded")
    fwd = [(b"forwarded", b'for="[2001:db8::5]:4711";proto=https, For=198.51.100.4;by=192.0.2.7')]
    assert f.resolve("192.0.2.7", fwd) == "198.51.100.4"
    assert f.resolve("192.0.2.7", [(b"forwarded", b"for=unknown")]) == "192.0.2.7"
    assert f.resolve("192.0.2.7", [(b"x-forwarded-for", b"203.0.113.1")]) == "192.0.2.7"
    assert ClientResolver("").resolve("127.0.0.1", xff) == "127.0.0.1"  # the default: nobody is trusted
    assert parse_trusted(" , ") == ()
    with pytest.raises(ValueError, match="'example.com'"):
        parse_trusted("10.0.0.1, example.com")
    with pytest.raises(ValueError, match="OLU_FORWARDED_HEADER"):
        ClientResolver("", "x-real-ip")


def test_a_bad_trusted_proxies_setting_stops_the_start(tmp_path):
    from app.config import Settings
    from app.main import ConfigurationError, create_app

    with pytest.raises(ConfigurationError, match="OLU_TRUSTED_PROXIES.*not-an-ip"):
        create_app(Settings(data_dir=tmp_path, trusted_proxies="not-an-ip"))


def test_every_launcher_turns_uvicorns_proxy_headers_off(monkeypatch, tmp_path):
    """The README command, the Dockerfile and `olu serve` alike: forwarded headers are the service's business."""
    from pathlib import Path

    import uvicorn
    from typer.testing import CliRunner

    from app.cli import app as cli

    root = Path(__file__).resolve().parents[1]
    docker = (root / "Dockerfile").read_text()
    assert '"--no-proxy-headers"' in docker and '"--proxy-headers"' not in docker
    readme = (root / "README.md").read_text()
    serve_lines = [line for line in readme.splitlines() if "uvicorn app.main:app" in line]
    assert serve_lines and all("--no-proxy-headers" in line for line in serve_lines), serve_lines
    assert "OLU_TRUSTED_PROXIES" in readme and "OLU_TRUSTED_PROXIES" in (root / "docs" / "operations.md").read_text()
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.update(kw))
    monkeypatch.setenv("OLU_DATA_DIR", str(tmp_path))  # olu serve builds the app once before uvicorn (issue 40)
    assert CliRunner().invoke(cli, ["serve", "--port", "8123"]).exit_code == 0
    assert seen["proxy_headers"] is False and seen["port"] == 8123
