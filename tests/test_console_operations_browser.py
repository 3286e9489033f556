"""The console's operations page in a real browser (Playwright, Debian's Chromium; see tests/test_console_browser.py).

A retrain run as an operation is paused mid-way (after the first of its four shards): the page shows it running with
a progress bar part filled, refreshes by itself, and once the retrain is let go shows it succeeded with a full bar
and the new version.  No Content-Security-Policy violation, no script error.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from .helpers import create_model, examples, unit_rows
from .test_console_browser import CHROMIUM, VIEWPORT, _WATCH, shot  # noqa: F401 - skips without Chromium
from .test_operations import Pause

from playwright.sync_api import expect, sync_playwright  # noqa: E402 - after the module that skips without it

pytestmark = pytest.mark.xdist_group("containers")  # as tests/test_console_browser.py (network changes)


@pytest.fixture
def live(monkeypatch):
    from .conftest import start_server

    data_dir = Path(tempfile.mkdtemp(prefix="olu-console-ops-"))
    srv, (uv, thread) = start_server(f"sqlite:///{data_dir / 'olu.db'}", data_dir, "sqlite",
                                     operation_lease_seconds=1.5)  # a heartbeat (progress) every 0.5 s
    pause = Pause(monkeypatch)
    tenant_id, key = srv.new_tenant("acme")
    with srv.admin() as a:
        audit = a.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["audit"]}).json()["api_key"]
    c = srv.client(key)
    yield {"srv": srv, "url": srv.url + "/console/", "client": c, "audit": audit, "pause": pause}
    pause.go.set()
    c.close()
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()
    shutil.rmtree(data_dir, ignore_errors=True)


def test_the_operations_page_shows_a_retrain_progressing_to_success(live):
    c = live["client"]
    mid = create_model(c, dim=3, algorithm="sisa", hyperparameters={"shards": 4})["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(40, 3))}).status_code == 200
    op = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
    assert live["pause"].entered.wait(60)
    ends = time.monotonic() + 60
    while c.get(f"/v1/operations/{op['id']}").json()["progress"]["done"] == 0:  # the heartbeat wrote progress
        assert time.monotonic() < ends
        time.sleep(0.05)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu"])
        context = browser.new_context(viewport=VIEWPORT)
        context.add_init_script(_WATCH)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.goto(live["url"])
        page.fill("#api-key", live["audit"])
        page.click("form.signin button[type=submit]")
        page.wait_for_selector("#models")
        page.click("#nav a[href='#/operations']")
        row = page.locator(f"#operations tr[data-operation='{op['id']}']")
        expect(row).to_have_attribute("data-status", "running")
        bar = row.locator("progress")
        assert bar.get_attribute("max") == "40"
        value = int(bar.get_attribute("value"))
        assert 0 < value < 40, value  # one shard of four read
        assert "retrain" in row.inner_text() and f"{value} / 40" in row.inner_text()
        shot(page, "operations")
        live["pause"].go.set()
        expect(row).to_have_attribute("data-status", "succeeded", timeout=30_000)  # refreshed by itself
        assert bar.get_attribute("value") == "40" and "40 / 40 (100%)" in row.inner_text()
        version = c.get(f"/v1/models/{mid}").json()["version"]
        assert f"version {version}, epoch 2" in row.locator("td.outcome").inner_text()
        violations = page.evaluate("window.__csp || []")
        context.close()
        browser.close()
    assert violations == [] and errors == [], (violations, errors)
