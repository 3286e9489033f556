"""Concurrent clients end in exactly the state a serial run of the accepted requests gives.

16 threads learn and unlearn on two models of one tenant at once (so model-row and tenant-log locks are taken
by many transactions in both orders of models), racing deliberately for the same record ids.  Then:

- every answer is 200 or a 4xx conflict (409), never 5xx (no deadlock or serialization error leaks out);
- the accepted learns' step ranges tile 1..step exactly (no step lost or given twice) and step = n_records;
- the versions of the accepted writes of a model are exactly 2..version (a serial order exists);
- each contested id was learned once / forgotten once; n_forgotten = receipts = ledger entries;
- the tenant log's indices over both models are exactly 0..n-1; every receipt verifies with /v1/keys.

Run against the in-process ``server`` (SQLite and PostgreSQL) and against two service processes sharing one
PostgreSQL database.
"""
from __future__ import annotations

import base64
import os
import random
import threading
import time
from collections import defaultdict

import httpx
import pytest

from .conftest import PG_URL, _pg_admin_url
from .helpers import create_model, unit_rows, verify_receipt
from .procs import ServiceProcess, service_env

THREADS = 16
ITERATIONS = 10
DIM = 3
X = unit_rows(64, DIM, seed=7)


def _x(i: int) -> list[float]:
    return X[i % len(X)].tolist()


def _post(c: httpx.Client, path: str, body: dict, **kw) -> httpx.Response:
    while True:
        r = c.post(path, json=body, **kw)
        if r.status_code != 429:  # rate limited: not applied, try again
            return r
        time.sleep(float(r.headers.get("retry-after", "1")))


def run_load(urls: list[str], key: str, model_ids: list[str], contested: dict[str, list[str]]) -> dict:
    """Drive THREADS clients; return every accepted write and every answer's status."""
    log: dict = {"learn": defaultdict(list), "unlearn": defaultdict(list), "statuses": [], "errors": []}
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def worker(w: int) -> None:
        rng = random.Random(w)
        mine: dict[str, list[str]] = {m: [] for m in model_ids}

        def learn(c: httpx.Client, mid: str, batch: list[str], examples: list[dict]) -> int:
            r = _post(c, f"/v1/models/{mid}/learn", {"examples": examples})
            with lock:
                log["statuses"].append(r.status_code)
                if r.status_code == 200:
                    log["learn"][mid].append((batch, r.json()))
            if r.status_code == 200:
                mine[mid].extend(batch)
            return r.status_code

        with httpx.Client(base_url=urls[w % len(urls)], headers={"authorization": f"Bearer {key}"},
                          timeout=120) as c:
            barrier.wait()
            for it in range(ITERATIONS):
                mid = model_ids[(w + it) % len(model_ids)]
                ids = [f"w{w}-i{it}-{k}" for k in range(2)]
                # contested learn: every worker tries the same new id at the same iteration
                if it % 3 == 0:
                    ids.append(f"contest-{mid}-{it}")
                examples = [{"id": rid, "x": _x(w + it + k), "y": float(k % 2)} for k, rid in enumerate(ids)]
                if learn(c, mid, ids, examples) == 409:  # someone else won the contested id: learn the rest
                    learn(c, mid, ids[:2], examples[:2])
                # unlearn one of my own records, and race everyone for a shared one
                targets = []
                if mine[mid] and rng.random() < 0.6:
                    targets.append([mine[mid].pop(rng.randrange(len(mine[mid])))])
                targets.append([rng.choice(contested[mid])])
                for ids in targets:
                    r = _post(c, f"/v1/models/{mid}/unlearn", {"ids": ids})
                    with lock:
                        log["statuses"].append(r.status_code)
                        if r.status_code == 200:
                            log["unlearn"][mid].append((ids, r.json()))
                        elif r.status_code != 409:
                            log["errors"].append((r.status_code, r.text))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return log


def check_serial_equivalence(c: httpx.Client, tenant_id: str, model_ids: list[str], initial: dict, log: dict) -> None:
    assert not log["errors"], log["errors"][:5]
    assert all(s in (200, 409) for s in log["statuses"]), sorted(set(log["statuses"]))
    keys = c.get("/v1/keys").json()["keys"]
    all_receipts = []
    for mid in model_ids:
        model = c.get(f"/v1/models/{mid}").json()
        learns = [initial[mid]] + log["learn"][mid]
        accepted = sum(len(ids) for ids, _ in learns)
        # step ranges of accepted learns tile 1..step: a serial order of these batches exists
        ranges = sorted((r["first_step"], r["last_step"]) for _, r in learns)
        assert ranges[0][0] == 1
        for (a0, a1), (b0, _) in zip(ranges, ranges[1:]):
            assert b0 == a1 + 1, f"steps overlap or gap: {ranges}"
        assert ranges[-1][1] == model["step"] == accepted == model["n_records"]
        for ids, r in learns:
            assert r["last_step"] - r["first_step"] + 1 == len(ids) == r["accepted"]
        # each accepted write got its own version; together they are exactly 2..version
        versions = [r["version"] for _, r in learns] + [r["version"] for _, r in log["unlearn"][mid]]
        assert sorted(versions) == list(range(2, model["version"] + 1))
        # contested ids: learned exactly once, forgotten at most once
        learned_ids = [rid for ids, _ in learns for rid in ids]
        assert len(learned_ids) == len(set(learned_ids))
        forgotten = [rid for ids, _ in log["unlearn"][mid] for rid in ids]
        assert len(forgotten) == len(set(forgotten))
        assert model["n_forgotten"] == len(forgotten)
        receipts = []
        cursor = None
        while True:
            page = c.get(f"/v1/models/{mid}/deletions", params={"limit": 200, **({"cursor": cursor} if cursor else {})}).json()
            receipts += page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        answered = [rc for _, r in log["unlearn"][mid] for rc in r["receipts"]]
        assert sorted(r["id"] for r in receipts) == sorted(r["id"] for r in answered)
        assert len({r["record_commitment"] for r in receipts}) == len(receipts)
        ledger = c.get(f"/v1/models/{mid}/ledger").json()
        deletions = [e for e in ledger["entries"] if e["kind"] == "deletion"]
        assert sorted(e["receipt_id"] for e in deletions) == sorted(r["id"] for r in receipts)
        assert ledger["rho_spent"] == pytest.approx(sum(r["mechanism"]["rho"] for r in receipts), rel=1e-9)
        for rid in forgotten:
            st = c.get(f"/v1/audit/records/{rid}").json()
            assert [m["status"] for m in st["models"] if m["model_id"] == mid] == ["forgotten"]
        all_receipts += receipts
    assert sorted(r["log_index"] for r in all_receipts) == list(range(len(all_receipts)))
    assert all(verify_receipt(r, keys) for r in all_receipts)
    for mid in model_ids:  # the state loads and still works after the storm
        assert c.post(f"/v1/models/{mid}/predict", json={"x": [_x(0)]}).status_code == 200


def _setup(c: httpx.Client) -> tuple[list[str], dict, dict]:
    model_ids = [create_model(c, dim=DIM, name=f"conc-{i}")["id"] for i in range(2)]
    contested = {m: [f"shared-{m}-{k}" for k in range(THREADS)] for m in model_ids}
    initial = {}
    for m in model_ids:
        ids = contested[m]
        r = c.post(f"/v1/models/{m}/learn",
                   json={"examples": [{"id": rid, "x": _x(k), "y": float(k % 2)} for k, rid in enumerate(ids)]})
        assert r.status_code == 200, r.text
        initial[m] = (ids, r.json())
    return model_ids, contested, initial


def test_sixteen_concurrent_clients_match_a_serial_run(server):
    tenant_id, key = server.new_tenant("concurrency")
    with server.client(key) as c:
        model_ids, contested, initial = _setup(c)
        log = run_load([server.url], key, model_ids, contested)
        check_serial_equivalence(c, tenant_id, model_ids, initial, log)


@pytest.fixture
def empty_postgres_db(postgres_url):
    """A second, empty database on the same server: both processes race to migrate it from scratch."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url)
    name = f"{url.database}_two"
    admin = create_engine(make_url(_pg_admin_url(PG_URL)), isolation_level="AUTOCOMMIT")  # as conftest does
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    yield url.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_two_service_processes_on_one_postgres_stay_consistent(empty_postgres_db, tmp_path):
    signing = base64.b64encode(os.urandom(32)).decode()
    # 16 clients of one tenant on purpose (the write path's concurrency): the per-tenant fairness limits
    # (tests/test_tenant_fairness.py) would only make them wait
    env = service_env(tmp_path, empty_postgres_db, OLU_SIGNING_KEY=signing, OLU_TENANT_MAX_IN_FLIGHT="0",
                      OLU_TENANT_COMPUTE_SHARE="0", OLU_TENANT_RATE_LIMIT="0")
    procs = [ServiceProcess(env, tmp_path / f"svc{i}.log") for i in range(2)]
    for p in procs:  # started together: one migrates, the other waits on the advisory lock
        p.launch()
    for p in procs:
        p.wait_ready()
    try:
        tenant_id, key = procs[0].new_tenant("two-procs")
        with procs[1].client(key) as c:
            model_ids, contested, initial = _setup(c)
            log = run_load([p.url for p in procs], key, model_ids, contested)
            check_serial_equivalence(c, tenant_id, model_ids, initial, log)
    finally:
        for p in procs:
            p.stop()
    logs = "".join((tmp_path / f"svc{i}.log").read_text() for i in range(2))
    assert "Traceback" not in logs and "deadlock" not in logs.lower()
