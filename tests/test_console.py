"""The audit console's files and headers, without a browser (tests/test_console_browser.py drives Chromium):
/console serves the static files shipped in the package with a strict Content-Security-Policy, no inline script
or style, nothing from another origin, and stays out of the OpenAPI document."""
from __future__ import annotations

import fnmatch
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.console import CONSOLE_DIR, CONTENT_SECURITY_POLICY
from app.config import Settings
from app.main import create_app

REPO = Path(__file__).resolve().parents[1]
FILES = sorted(p for p in CONSOLE_DIR.rglob("*") if p.is_file())
OWN = [p for p in FILES if "vendor" not in p.parts]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("console")
    app = create_app(Settings(data_dir=d, database_url=f"sqlite:///{d / 'olu.db'}", log_level="warning"))
    with TestClient(app) as c:
        yield c


def _directives(policy: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (x.strip() for x in policy.split(";")) if d}


def test_policy_is_strict():
    d = _directives(CONTENT_SECURITY_POLICY)
    assert d["default-src"] == ["'none'"]
    assert d["script-src"] == ["'self'"] and d["style-src"] == ["'self'"] and d["connect-src"] == ["'self'"]
    assert d["frame-ancestors"] == ["'none'"] and d["base-uri"] == ["'none'"] and d["form-action"] == ["'none'"]
    assert d["require-trusted-types-for"] == ["'script'"]
    for source in (s for values in d.values() for s in values):  # no third-party origin, nothing unsafe
        assert source in ("'none'", "'self'", "'script'", "data:", "blob:"), source


def test_console_is_served_with_the_policy(client):
    r = client.get("/console", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "console/"
    assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    r = client.get("/console/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["x-frame-options"] == "DENY" and "set-cookie" not in r.headers
    for path in FILES:
        rel = path.relative_to(CONSOLE_DIR).as_posix()
        r = client.get(f"/console/{rel}")
        assert r.status_code == 200, rel
        assert r.content == path.read_bytes()
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, rel
        if rel.endswith(".js"):
            assert "javascript" in r.headers["content-type"], rel  # module scripts need a JavaScript MIME type
    for missing in ("/console/nope.js", "/console/%2e%2e/main.py", "/console/..%2fmain.py",
                    "/console/js/%2e%2e/%2e%2e/main.py"):
        r = client.get(missing)
        assert r.status_code == 404, missing
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert client.post("/console/").status_code == 405


def test_console_is_not_in_the_openapi_document(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/console")]


class _Html(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.inline.append(data)


def test_page_has_no_inline_code_and_loads_only_its_own_files():
    parser = _Html()
    parser.feed((CONSOLE_DIR / "index.html").read_text())
    assert parser.inline == []
    assert not [t for t, _ in parser.tags if t == "style"]
    for tag, attrs in parser.tags:
        assert "style" not in attrs and not [a for a in attrs if a.startswith("on")], (tag, attrs)
        for a in ("src", "href"):
            url = attrs.get(a)
            if url and tag in ("script", "link"):
                assert not re.match(r"^[a-z]+:|^//", url) or url == "data:,", url  # relative: this origin
                if not url.startswith("data:"):
                    assert (CONSOLE_DIR / url).is_file(), url
    scripts = [a["src"] for t, a in parser.tags if t == "script"]
    assert scripts == ["vendor/uPlot.iife.min.js", "js/app.js"]


def test_own_code_has_no_html_sinks_no_remote_origin_and_keeps_the_key_in_session_storage():
    for path in OWN:
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, (path.name, sink)
        assert not re.search(r"https?://", text), path.name
        assert "document.cookie" not in text, path.name
    api = (CONSOLE_DIR / "js" / "api.js").read_text()
    assert "sessionStorage.setItem" in api and "localStorage." not in api and "credentials: 'omit'" in api
    # every import of the modules resolves to a shipped file
    for path in (p for p in OWN if p.suffix == ".js"):
        for target in re.findall(r"from '(\./[^']+)'", path.read_text()):
            assert (path.parent / target).is_file(), (path.name, target)


def test_package_ships_the_console():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["app"]
    for path in FILES:
        rel = path.relative_to(REPO / "app").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel
    assert "playwright" in " ".join(config["project"]["optional-dependencies"]["test"])
