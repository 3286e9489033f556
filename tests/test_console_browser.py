"""The audit console in a real browser: Playwright for Python driving headless Chromium (Debian's package,
/usr/bin/chromium; .ci/run installs it when missing) against a live service on a loopback port.

Covered: sign-in (and the refusal of a key without the audit scope), the overview, a model page with its plot
and paged deletion log, a receipt that verifies green, a bundle with one byte changed that verifies red with the
reason (dropped on the page, verified without any request), the log monitor flagging a remembered checkpoint
that the current log does not extend (a fork) or exceeds (a truncation), the record lookup, and the console's
JavaScript verifier against the Python verifier on shared vectors (tests/console_vectors.py, plus receipts,
bundles and proofs from the live server and their tampered variants).

OLU_CONSOLE_SCREENSHOTS=DIR saves the pages as PNGs there (docs/ holds the committed ones).
"""
from __future__ import annotations

import base64
import json
import math
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from app.receipts.checkpoint import make_checkpoint

from .console_vectors import python_report, synthetic_vectors, tamper_variants
from .helpers import examples, unit_rows

CHROMIUM = os.environ.get("OLU_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    pytest.skip("the console browser tests need playwright (pip install -e '.[test]')", allow_module_level=True)
if not CHROMIUM:
    pytest.skip("the console browser tests need Chromium: apt-get install chromium (.ci/run does it as root), "
                "or set OLU_CHROMIUM to a Chromium binary", allow_module_level=True)

# On the container tests' worker, one after the other: tests/test_image.py and tests/test_compose.py add and remove
# podman's bridge and veth interfaces, and Chromium aborts every load in flight with net::ERR_NETWORK_CHANGED when
# the host's interfaces change (crbug.com/41465264). CI failed once that way (stop 34: a page whose scripts did not
# load). Sharing the xdist group keeps the browser off the host's network while containers come and go.
pytestmark = pytest.mark.xdist_group("containers")

# expect() waits up to this long for what it expects (the default, 5 s, is short on a loaded 2-core machine running
# the suite on every core); it returns as soon as the page gets there
expect.set_options(timeout=20_000)

SHOTS = os.environ.get("OLU_CONSOLE_SCREENSHOTS")
VIEWPORT = {"width": 1280, "height": 860}


# ---- a live service with a tenant's audit trail ----------------------------------------------------------------

@pytest.fixture(scope="module")
def live():
    from .conftest import start_server

    data_dir = Path(tempfile.mkdtemp(prefix="olu-console-"))
    srv, (uv, thread) = start_server(f"sqlite:///{data_dir / 'olu.db'}", data_dir, "sqlite")
    tenant_id, key = srv.new_tenant("acme")
    c = srv.client(key)

    def model(algorithm, name, rows, prefix="rec"):
        body = {"name": name, "algorithm": algorithm, "loss": "logistic", "dim": 4, "bounds": {"x_norm": 1.0},
                "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}}
        r = c.post("/v1/models", json=body)
        assert r.status_code == 201, r.text
        mid = r.json()["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(rows, prefix=prefix)}).status_code == 200
        return mid

    X = unit_rows(60, 4, seed=3)
    churn = model("memory_pair", "churn-risk", X)
    for b in range(11):  # 22 deletions: two pages of the deletion log
        r = c.post(f"/v1/models/{churn}/unlearn", json={"ids": [f"rec-{2 * b}", f"rec-{2 * b + 1}"]})
        assert r.status_code == 200, r.text
    credit = model("retrain", "credit-score", X)
    assert c.post(f"/v1/models/{credit}/unlearn", json={"ids": ["rec-3", "rec-40"]}).status_code == 200
    old = model("retrain", "old-campaign", X[:10], prefix="old")
    assert c.delete(f"/v1/models/{old}").status_code == 204
    probe = model("retrain", "monitor-probe", X[:20], prefix="probe")
    with srv.admin() as a:
        audit = a.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["audit"]}).json()["api_key"]
        predict = a.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["predict", "write"]}).json()["api_key"]
    yield {"srv": srv, "url": srv.url + "/console/", "tenant": tenant_id, "key": key, "audit": audit,
           "predict": predict, "churn": churn, "credit": credit, "old": old, "probe": probe, "client": c}
    c.close()
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu"])
        yield b
        b.close()


# Recorded in every page before its scripts: CSP violations (none may happen). The tests wait with selectors and
# expect(), never with wait_for_function(string): Playwright evaluates that string with eval, which the console's
# policy (no 'unsafe-eval', Trusted Types) refuses, as it should.
_WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(
    [e.violatedDirective, e.blockedURI, e.sourceFile, e.lineNumber, e.sample].join(' ')));
"""


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    context.add_init_script(_WATCH)
    pg = context.new_page()
    pg.errors = []
    pg.requests = []
    pg.on("pageerror", lambda e: pg.errors.append(f"page error: {e}"))
    pg.on("console", lambda m: pg.errors.append(f"console {m.type}: {m.text}")
          if m.type == "error" and "status of 40" not in m.text else None)
    pg.on("request", lambda r: pg.requests.append(r))
    yield pg
    violations = pg.evaluate("window.__csp || []") if not pg.is_closed() else []
    context.close()
    assert violations == [], violations
    assert pg.errors == [], pg.errors


def shot(pg, name, selector=None):
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        path = str(Path(SHOTS) / f"console-{name}.png")
        if selector:
            pg.locator(selector).screenshot(path=path)
        else:
            pg.screenshot(path=path, full_page=True)


def sign_in(pg, live, key):
    pg.goto(live["url"])
    pg.fill("#api-key", key)
    pg.click("form.signin button[type=submit]")
    expect(pg.locator("#models tbody tr").first).to_be_visible()


def eventually(pg, read, expected, timeout_ms=20_000):
    """Wait until read() == expected, re-reading every 100 ms: for what expect() cannot watch (a value computed in
    the page, such as a canvas's pixels or sessionStorage). Every other check on the page waits with expect()."""
    waited, got = 0, None
    while waited <= timeout_ms:
        got = read()
        if got == expected:
            return got
        pg.wait_for_timeout(100)
        waited += 100
    raise AssertionError(f"still {got!r} after {timeout_ms} ms, expected {expected!r}")


# ---- sign-in -------------------------------------------------------------------------------------------------

def test_sign_in_refuses_a_key_without_the_audit_scope(page, live):
    page.goto(live["srv"].url + "/console")  # redirects to /console/
    assert page.url.endswith("/console/")
    expect(page.locator("#api-key")).to_be_visible()
    shot(page, "signin")
    page.fill("#api-key", live["predict"])
    page.click("form.signin button[type=submit]")
    expect(page.locator("#signin-error")).to_contain_text("audit scope")
    expect(page.locator("#api-key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0  # cleared before the message is written
    page.fill("#api-key", "olu_not_a_key_at_all")
    page.click("form.signin button[type=submit]")
    expect(page.locator("#signin-error")).to_contain_text("unknown or revoked")
    assert page.evaluate("sessionStorage.length") == 0


def test_sign_in_overview_and_model_page_with_its_plot(page, live):
    sign_in(page, live, live["audit"])
    rows = page.locator("#models tbody tr")
    expect(rows).to_have_count(3)
    # the key: in sessionStorage only; never in a URL, a cookie or localStorage; sent as a bearer header
    assert page.evaluate("Object.values(sessionStorage)") == [live["audit"]]
    assert live["audit"] not in json.dumps(page.evaluate("Object.assign({}, localStorage)"))
    assert page.context.cookies() == []
    assert all(live["audit"] not in r.url for r in page.requests)
    api = [r for r in page.requests if "/v1/" in r.url and "/v1/keys" not in r.url]
    assert api and all(r.headers.get("authorization") == f"Bearer {live['audit']}" for r in api)
    assert all(r.url.startswith(live["srv"].url) for r in page.requests)  # same origin only
    expect(page.locator("#monitor")).to_have_attribute("data-state", "first")
    churn = page.locator(f"#models tr[data-model='{live['churn']}']")
    for text in ("churn-risk", "memory_pair", "logistic", "rho-zCDP", "60", "22", "of 1", "deletions left"):
        expect(churn).to_contain_text(text)
    expect(page.locator(f"#models tr[data-model='{live['credit']}']")).to_contain_text("exact: no privacy spent")
    # the audit trail beside the other quotas (issue 37, F5-A): what the forgets left, against its own quota
    audit = page.locator("#usage [data-quota='audit_bytes']")
    expect(audit).to_contain_text("Audit trail")
    expect(audit).to_contain_text(" of ")
    expect(audit).not_to_contain_text("no limit")
    shot(page, "overview")

    page.click(f"a.model-link[href='#/models/{live['churn']}']")
    expect(page.locator("#privacy-chart canvas")).to_have_count(1)
    expect(page.locator("#capacity-chart canvas")).to_have_count(1)
    for label in ("ρ spent", "ε spent", "ρ budget", "ε target"):
        expect(page.locator("#privacy-chart")).to_contain_text(label)
    # issue 40: the legend shows the last deletion's values without hovering (it showed "--"); the ρ budget and the
    # ε target are one dashed line (two coincided); the deletion axis has ticks at whole deletions only (not 1.5)
    values = page.locator("#privacy-chart .u-legend .u-series .u-value")
    expect(values).to_have_count(4)
    expect(values.nth(1)).not_to_have_text("--")
    eventually(page, lambda: "--" in page.locator("#privacy-chart .u-legend").inner_text(), False)
    expect(page.locator("#privacy-chart .u-legend")).to_contain_text("ρ budget = ε target")
    ticks = eventually(page, lambda: bool(page.evaluate(
        "() => (document.querySelector('#privacy-chart').chart.axes[0]._values || []).length")), True)
    labels = page.evaluate("() => document.querySelector('#privacy-chart').chart.axes[0]._values")
    assert ticks and labels and all(v == "" or v.isdigit() for v in labels), labels
    # the plot is drawn: its canvas is not blank
    eventually(page, lambda: page.evaluate("""() => { const c = document.querySelector('#privacy-chart canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }""") > 1000, True)
    # the deletion log arrives with its own request after the plots: wait for it (CI read it once while that
    # request was still in flight, issue 40)
    log_rows = page.locator("#deletion-log tbody tr")
    expect(log_rows).to_have_count(20)
    expect(log_rows.first.locator("td").first).to_have_text("1")
    shot(page, "model")
    shot(page, "model-plot", "#ledger-plot")
    page.click("#log-next")
    expect(log_rows).to_have_count(2)
    expect(log_rows.first.locator("td").first).to_have_text("21")


# ---- receipts ---------------------------------------------------------------------------------------------------

def test_a_receipt_verifies_green(page, live):
    sign_in(page, live, live["key"])  # all scopes: the parameters are readable too
    last = live["client"].get(f"/v1/models/{live['credit']}/deletions").json()["items"][-1]["id"]
    page.goto(live["url"] + f"#/receipts/{last}")
    checks = ("canonical", "key", "signature", "checkpoint", "inclusion", "parameters")
    expect(page.locator("#receipt-checks li")).to_have_count(len(checks))
    for c in checks:
        expect(page.locator(f"#receipt-checks li[data-check='receipt.{c}']")).to_have_attribute("data-state", "pass")
    expect(page.locator(".verdict")).to_have_attribute("data-state", "pass")
    shot(page, "receipt")
    # an erasure receipt of the deleted model: its exact-erasure terms are checked too
    erasure = live["client"].get(f"/v1/models/{live['old']}/ledger").json()["erasure_receipt_id"]
    page.goto(live["url"] + f"#/receipts/{erasure}")
    expect(page.locator("#receipt-checks li[data-check='receipt.erasure']")).to_have_attribute("data-state", "pass")
    expect(page.locator(".verdict")).to_have_attribute("data-state", "pass")


def test_record_lookup_verifies_each_receipt(page, live):
    sign_in(page, live, live["audit"])
    page.click("#nav a[href='#/records']")
    page.fill("#record-id", "rec-3")
    page.press("#record-id", "Enter")
    expect(page.locator("#record-result tbody tr")).to_have_count(2)
    expect(page.locator("#record-result tr[data-status='forgotten'] .badge.pass")).to_have_count(2)
    shot(page, "record")
    page.fill("#record-id", "old-1")
    page.press("#record-id", "Enter")
    expect(page.locator("#record-result tr[data-status='erased_with_model'] .badge.pass")).to_have_count(1)
    page.fill("#record-id", "no-such-record")
    page.press("#record-id", "Enter")
    expect(page.locator("#record-result .error")).to_be_visible()


# ---- bundles verified offline ------------------------------------------------------------------------------------

def _drop(page, name: str, data: bytes) -> None:
    """Drop a file on the drop zone, as a person dragging it from their desktop would."""
    page.evaluate("""([name, b64]) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, { type: 'application/json' }));
        const drop = new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true });
        document.querySelector('#dropzone').dispatchEvent(drop);
    }""", [name, base64.b64encode(data).decode()])


def test_a_bundle_with_one_byte_changed_verifies_red(page, live):
    sign_in(page, live, live["audit"])
    page.goto(live["url"] + f"#/models/{live['churn']}")
    with page.expect_download() as dl:
        page.click("#export-model")
    bundle = Path(dl.value.path()).read_bytes()
    assert json.loads(bundle)["receipts"]
    page.click("#nav a[href='#/verify']")
    expect(page.locator("#dropzone")).to_be_visible()
    before = len(page.requests)
    page.set_input_files("#bundle-file", files=[{"name": "bundle.json", "mimeType": "application/json",
                                                  "buffer": bundle}])
    expect(page.locator(".verdict")).to_have_attribute("data-state", "pass")
    # one byte changed: a hex digit of the first receipt's record commitment
    at = bundle.index(b'"record_commitment":"') + len(b'"record_commitment":"') + 5
    tampered = bundle[:at] + (b"0" if bundle[at:at + 1] != b"0" else b"1") + bundle[at + 1:]
    assert len(tampered) == len(bundle) and sum(a != b for a, b in zip(tampered, bundle)) == 1
    _drop(page, "bundle-tampered.json", tampered)
    expect(page.locator(".verdict")).to_have_attribute("data-state", "fail")
    for text in ("receipt[0].signature", "bad signature", "receipt[0].inclusion",
                 "audit path does not lead to the root"):
        expect(page.locator("#file-failures")).to_contain_text(text)
    expect(page.locator(".verdict")).to_contain_text("receipt[0].signature")
    shot(page, "verify-red")
    # not strict JSON (a duplicate member): refused with the reason
    _drop(page, "dup.json", b'{"receipts": [], "receipts": []}')
    expect(page.locator("#file-failures")).to_contain_text("duplicate member")
    assert len(page.requests) == before, [r.url for r in page.requests[before:]]  # nothing left the page


# ---- the log monitor ---------------------------------------------------------------------------------------------

def test_monitor_flags_a_log_the_remembered_checkpoint_is_not_consistent_with(page, live):
    c = live["client"]
    sign_in(page, live, live["audit"])
    expect(page.locator("#monitor")).to_have_attribute("data-state", "first")
    stored = "Object.entries(localStorage).filter(([k]) => k.startsWith('olu.console.checkpoint:'))"
    eventually(page, lambda: len(page.evaluate(stored)), 1)
    cp = page.evaluate(stored)
    assert json.loads(cp[0][1])["checkpoint"]["origin"] == f"olu/{live['tenant']}"
    # the log grows: consistent
    assert c.post(f"/v1/models/{live['probe']}/unlearn", json={"ids": ["probe-0"]}).status_code == 200
    page.reload()
    expect(page.locator("#monitor")).to_have_attribute("data-state", "consistent")
    expect(page.locator("#monitor")).to_contain_text("grew from")
    # a fork: the browser remembers a checkpoint, validly signed by the service, of a log that differs from the
    # current one (same origin, an earlier size, another root)
    current = c.get("/v1/audit/checkpoint").json()
    forged = make_checkpoint(current["origin"], current["tree_size"] - 2, bytes(range(32)), "2026-01-02T03:04:05Z",
                             live["srv"].app.state.ctx.keyring)
    key = f"olu.console.checkpoint:{current['origin']}"
    page.evaluate("([k, v]) => localStorage.setItem(k, v)",
                  [key, json.dumps({"checkpoint": forged, "verified_at": "2026-01-02T03:05:00Z"})])
    page.reload()
    expect(page.locator("#monitor")).to_have_attribute("data-state", "fork")
    expect(page.locator("#monitor")).to_have_attribute("role", "alert")
    expect(page.locator("#monitor")).to_contain_text("This log was rewritten")
    assert json.loads(page.evaluate("k => localStorage.getItem(k)", key))["checkpoint"] == forged  # evidence kept
    shot(page, "monitor-fork")
    # a truncation: the remembered log was longer than the current one
    longer = make_checkpoint(current["origin"], current["tree_size"] + 5, bytes(32), "2026-01-02T03:04:05Z",
                             live["srv"].app.state.ctx.keyring)
    page.evaluate("([k, v]) => localStorage.setItem(k, v)",
                  [key, json.dumps({"checkpoint": longer, "verified_at": "2026-01-02T03:05:00Z"})])
    page.reload()
    expect(page.locator("#monitor")).to_have_attribute("data-state", "truncated")
    expect(page.locator("#monitor")).to_have_attribute("role", "alert")
    expect(page.locator("#monitor")).to_contain_text("entries were removed")


# ---- the JavaScript verifier against the Python verifier ---------------------------------------------------------

def _live_vectors(live) -> list[dict]:
    c = live["client"]
    keys = c.get("/v1/keys").text
    out = []
    for label, params in (("model", {"model_id": live["churn"]}), ("deleted-model", {"model_id": live["old"]}),
                          ("record", {"record_id": "rec-3"}), ("erased-record", {"record_id": "old-1"})):
        r = c.get("/v1/audit/export", params=params)
        assert r.status_code == 200, r.text
        out.append({"name": f"live-{label}-bundle", "bundle": r.text, "keys": keys})
    for item in c.get(f"/v1/models/{live['credit']}/deletions").json()["items"]:
        text = c.get(f"/v1/receipts/{item['id']}").text
        out.append({"name": f"live-receipt-{item['id']}", "bundle": '{"receipts": [' + text + ']}', "keys": keys})
    proof = c.get("/v1/audit/consistency", params={"from_size": 3}).json()
    out.append({"name": "live-consistency", "keys": keys, "bundle": json.dumps({"consistency": {
        "from": proof["from_checkpoint"], "to": proof["to_checkpoint"], "hashes": proof["hashes"]}})})
    rng = random.Random(2024)
    for v in list(out):
        b = json.loads(v["bundle"])
        out += tamper_variants(v["name"], b, json.loads(keys), rng, count=12)
    return out


def test_console_verifier_agrees_with_the_python_verifier(page, live):
    vectors = synthetic_vectors() + _live_vectors(live)
    for v in vectors:
        v["expected"] = python_report(v)
    page.goto(live["url"] + "#/verify")
    expect(page.locator("#dropzone")).to_be_visible()
    got = page.evaluate("""async (vectors) => {
        const m = await import('./js/verify.js');
        const out = [];
        for (const v of vectors) {
            const r = await m.verifyBundle(m.strictLoads(v.bundle), m.strictLoads(v.keys));
            out.push(r.checks.map((c) => [c.check, c.ok, c.detail]));
        }
        return out;
    }""", [{"bundle": v["bundle"], "keys": v["keys"]} for v in vectors])
    assert len(got) == len(vectors)
    mismatches = [(v["name"], g, v["expected"]) for v, g in zip(vectors, got) if g != v["expected"]]
    assert not mismatches, mismatches[:3]
    # the vectors exercise both outcomes of every kind of check
    outcomes = {(c[0].split(".")[-1], c[1]) for v in vectors for c in v["expected"]}
    for check in ("canonical", "key", "signature", "checkpoint", "inclusion", "mechanism", "erasure", "records",
                  "from_checkpoint", "to_checkpoint", "proof"):
        assert {(check, True), (check, False)} <= outcomes, check
    assert sum(1 for v in vectors if v["name"].startswith("live")) > 50


def test_console_canonical_json_matches_rfc8785(page, live):
    """js/jcs.js against the Python rfc8785 package (app/receipts/canonical.py): numbers (random doubles of every
    magnitude, integers at the safe limit), every ASCII control character, astral characters, and member order by
    UTF-16 code units; and the same refusals (unsafe integers, lone surrogates)."""
    import struct

    from app.receipts.canonical import CanonicalJSONError, canonical_json

    rng = random.Random(8785)
    doubles = []
    while len(doubles) < 400:
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(x):
            doubles.append(x)
    doubles += [0.0, -0.0, 1e21, 1e-7, 1e-6, 123456789012345680000.0, 0.1 + 0.2, 5e-324, 2.0 ** -1074 * 3,
                1.7976931348623157e308, 2 ** 53 - 1, -(2 ** 53 - 1), 1e16, 9.5367431640625e-07]
    text = "".join(map(chr, range(0x80))) + "\u2028\u2029\ufeff\U0001f600é✓\\\"/"
    keys = {chr(c): c for c in (0x7f, 0x80, 0xe9, 0xffff, 0xfb01, 0x10000, 0x1f600, 0x41, 0x61, 0x20)}
    values = [doubles, text, keys, {"nested": [keys, {"b": [1, 2.5, None, True]}, "a"], "": []}]
    refused = ['{"a": 9007199254740992}', '[-9007199254740993]', '"\\ud800"', '{"\\udfff": 1}', '[1e400]']
    for r in refused:
        with pytest.raises((CanonicalJSONError, ValueError)):
            canonical_json(json.loads(r))
    page.goto(live["url"] + "#/verify")
    expect(page.locator("#dropzone")).to_be_visible()
    got = page.evaluate("""async ([values, refused]) => {
        const m = await import('./js/jcs.js');
        const ok = values.map((t) => m.canonicalize(m.parseStrict(t, { python: true })));
        const bad = refused.map((t) => { try { m.canonicalize(m.parseStrict(t, { python: true })); return 'accepted'; }
                                         catch (e) { return e.constructor.name; } });
        return [ok, bad];
    }""", [[json.dumps(v) for v in values], refused])
    assert got[0] == [canonical_json(v).decode("utf-8") for v in values]
    assert got[1] == ["CanonicalJSONError"] * len(refused)


# ---- the API documentation and the front page, offline (issue 40) ----------------------------------------------

def _only_the_service(page, live) -> list[str]:
    """Abort every request that leaves the service (as a machine with no route out would); return their URLs."""
    outside: list[str] = []

    def handle(route):
        if route.request.url.startswith(live["srv"].url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.context.route("**/*", handle)
    return outside


def test_the_api_documentation_loads_with_no_request_outside_the_service(browser, live):
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script(_WATCH)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    outside = _only_the_service(page, live)
    page.goto(live["srv"].url + "/docs")
    # Swagger UI rendered the document: its title and the operations
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Certified unlearning service", timeout=90_000)
    expect(page.locator(".opblock-summary-path[data-path='/v1/models/{model_id}/unlearn']").first).to_be_visible()
    page.goto(live["srv"].url + "/redoc")
    # ReDoc parses the whole document (hundreds of kB) before it renders: seconds on a loaded machine
    expect(page.locator("h1").first).to_contain_text("Certified unlearning service", timeout=90_000)
    expect(page.get_by_text("Forget records by id").first).to_be_attached()
    # the only thing the pages' policy refused: ReDoc's vendor logo (the image hides itself), never requested
    refused = page.evaluate("window.__csp || []")
    assert all("cdn.redoc.ly" in v for v in refused), refused
    page.goto(live["srv"].url + "/")
    for href in ("/console/", "/docs", "/redoc", "/healthz", "/readyz"):
        expect(page.locator(f"a[href='{href}']")).to_have_count(1)
    page.click("a[href='/console/']")
    expect(page.locator("#api-key")).to_be_visible()
    context.close()
    assert outside == [] and errors == [], (outside, errors)
