"""Crash safety: SIGKILL the real service at random moments under learn/unlearn load, restart, check.

Per database (SQLite with OLU_SQLITE_SYNCHRONOUS=FULL, and PostgreSQL) the service is killed KILLS times while
a client thread drives learn and unlearn requests.  A request is *acknowledged* when its 200 answer arrived;
the request in flight at a kill is *uncertain*.  After the restarts:

- every acknowledged learn is present and every acknowledged forget is forgotten, with the very receipt the
  client got;
- an uncertain request is all-or-nothing (a learn batch is wholly present or wholly absent; an unlearn either
  has its receipt and ledger entry or the record is still learned);
- step = n_records = number of learned records; n_forgotten = receipts = ledger entries; the model version is
  1 + the number of applied writes; the newest receipt's parameter hash matches the served parameters when it
  is the newest write;
- the tenant log indices are exactly 0..n-1 and every receipt verifies with /v1/keys;
- every acknowledged unlearn, retried with its Idempotency-Key, replays the identical answer;
- the state loads: predict, a further learn and unlearn work.
"""
from __future__ import annotations

import base64
import hashlib
import os
import random
import threading
import time

import httpx
import numpy as np
import pytest

from .helpers import all_receipts, create_model, unit_rows, verify_receipt
from .procs import ServiceProcess, service_env

KILLS = 4
DIM = 3
X = unit_rows(50, DIM, seed=3)
NET_ERRORS = (httpx.TransportError,)


class Driver:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.counter = 0
        self.learned: dict[str, int] = {}  # acknowledged learns: id -> batch number
        self.batches: dict[int, list[str]] = {}  # every learn batch ever sent
        self.acked_batches: set[int] = set()
        self.forgotten: dict[str, dict] = {}  # acknowledged forgets: id -> receipt
        self.acked_unlearns = 0
        self.uncertain_learns: list[int] = []
        self.uncertain_unlearns: list[list[str]] = []
        self.pending_forget: set[str] = set()
        self.answers: dict[str, tuple[list[str], dict]] = {}  # Idempotency-Key -> acknowledged unlearn answer

    def run(self, url: str, key: str, mid: str, stop: threading.Event) -> None:
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c:
            while not stop.is_set():
                b = len(self.batches)
                ids = [f"r{self.counter + k}" for k in range(self.rng.randint(1, 4))]
                self.counter += len(ids)
                self.batches[b] = ids
                body = {"examples": [{"id": rid, "x": X[(self.counter + k) % len(X)].tolist(), "y": float(k % 2)}
                                     for k, rid in enumerate(ids)]}
                try:
                    r = c.post(f"/v1/models/{mid}/learn", json=body)
                except NET_ERRORS:
                    self.uncertain_learns.append(b)
                    return
                assert r.status_code == 200, r.text
                self.acked_batches.add(b)
                for rid in ids:
                    self.learned[rid] = b
                candidates = sorted(set(self.learned) - set(self.forgotten) - self.pending_forget)
                if len(candidates) > 2 and self.rng.random() < 0.7:
                    ids = self.rng.sample(candidates, self.rng.randint(1, 2))
                    idem = f"forget-{self.acked_unlearns}-{'-'.join(ids)}"
                    try:
                        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids}, headers={"Idempotency-Key": idem})
                    except NET_ERRORS:
                        self.uncertain_unlearns.append(ids)
                        self.pending_forget.update(ids)
                        return
                    assert r.status_code == 200, r.text
                    self.acked_unlearns += 1
                    self.answers[idem] = (ids, r.json())
                    for rid, rc in zip(ids, r.json()["receipts"]):
                        self.forgotten[rid] = rc


def _statuses(c: httpx.Client, mid: str, rid: str) -> list[dict]:
    r = c.get(f"/v1/audit/records/{rid}")
    if r.status_code == 404:
        return []
    assert r.status_code == 200, r.text
    return [m for m in r.json()["models"] if m["model_id"] == mid]


def _params_sha256(p: dict) -> str:
    return hashlib.sha256(np.asarray(p["weights"] + [p["bias"]], dtype="<f8").tobytes()).hexdigest()


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_sigkill_under_load_loses_no_acknowledged_write_and_half_applies_none(db, tmp_path, request):
    url = f"sqlite:///{tmp_path / 'olu.db'}" if db == "sqlite" else request.getfixturevalue("postgres_url")
    # the tenant request limit (200/s by default, docs/operations.md §10.1) is off: the checker reads every record
    # back in a tight loop after the restarts, which is not what this test is about (it answered 429 in CI once)
    env = service_env(tmp_path, url, OLU_SIGNING_KEY=base64.b64encode(os.urandom(32)).decode(),
                      OLU_SQLITE_SYNCHRONOUS="FULL", OLU_TENANT_RATE_LIMIT="0")
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    driver = Driver(seed)
    log = tmp_path / "service.log"
    svc = ServiceProcess(env, log).start()
    try:
        tenant_id, key = svc.new_tenant("crash")
        with svc.client(key) as c:
            mid = create_model(c, dim=DIM)["id"]
        for _ in range(KILLS):
            stop = threading.Event()
            t = threading.Thread(target=driver.run, args=(svc.url, key, mid, stop))
            t.start()
            time.sleep(rng.uniform(0.3, 1.5))
            svc.kill()
            stop.set()
            t.join(timeout=60)
            assert not t.is_alive()
            svc = ServiceProcess(env, log).start()
        _check(svc, key, mid, driver, seed)
    finally:
        svc.stop()


def _check(svc: ServiceProcess, key: str, mid: str, d: Driver, seed: int) -> None:
    note = f"(seed {seed}; {len(d.acked_batches)} acked learns, {d.acked_unlearns} acked unlearns, " \
           f"uncertain learns {d.uncertain_learns}, uncertain unlearns {d.uncertain_unlearns})"
    assert d.acked_batches and d.acked_unlearns, f"the load did not get going {note}"
    with svc.client(key) as c:
        model = c.get(f"/v1/models/{mid}").json()
        applied_batches = set(d.acked_batches)
        for b in d.uncertain_learns:
            present = [bool(_statuses(c, mid, rid)) for rid in d.batches[b]]
            assert all(present) or not any(present), f"learn batch {b} half-applied: {present} {note}"
            if all(present):
                applied_batches.add(b)
        learned_ids = {rid for b in applied_batches for rid in d.batches[b]}
        for rid in d.learned:
            st = _statuses(c, mid, rid)
            assert len(st) == 1, f"acknowledged learn of {rid} lost {note}"
            if rid in d.forgotten:
                assert st[0]["status"] == "forgotten" and st[0]["receipt_id"] == d.forgotten[rid]["id"], note
            elif rid not in d.pending_forget:
                assert st[0]["status"] == "learned", f"{rid} forgotten without a request {note}"
        forgotten_ids = set(d.forgotten)
        applied_unlearns = d.acked_unlearns
        for ids in d.uncertain_unlearns:
            states = [_statuses(c, mid, rid)[0]["status"] for rid in ids]
            assert len(set(states)) == 1, f"unlearn {ids} half-applied: {states} {note}"
            if states[0] == "forgotten":
                forgotten_ids.update(ids)
                applied_unlearns += 1
        assert model["step"] == model["n_records"] == len(learned_ids), note
        assert model["n_forgotten"] == len(forgotten_ids), note
        assert model["version"] == 1 + len(applied_batches) + applied_unlearns, note

        receipts = all_receipts(c, mid)
        assert len(receipts) == len(forgotten_ids) == len({r["record_commitment"] for r in receipts}), note
        by_id = {r["id"]: r for r in receipts}
        for rid, rc in d.forgotten.items():
            assert by_id[rc["id"]] == rc, f"stored receipt differs from the acknowledged one {note}"
        ledger = c.get(f"/v1/models/{mid}/ledger").json()
        assert sorted(e["receipt_id"] for e in ledger["entries"] if e["kind"] == "deletion") == sorted(by_id), note
        assert sorted(r["log_index"] for r in receipts) == list(range(len(receipts))), note
        keys = c.get("/v1/keys").json()["keys"]
        assert all(verify_receipt(r, keys) for r in receipts), note
        newest = max(receipts, key=lambda r: r["model_version"])
        assert newest["model_version"] <= model["version"]
        params = c.get(f"/v1/models/{mid}/parameters").json()
        assert params["version"] == model["version"]
        if newest["model_version"] == model["version"]:
            assert newest["published_parameters_sha256"] == _params_sha256(params), note
        # the stored idempotent answers survived with their writes: a retry after the crash replays, changes nothing
        for idem, (ids, answer) in d.answers.items():
            r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids}, headers={"Idempotency-Key": idem})
            assert r.status_code == 200 and r.headers.get("idempotent-replayed") == "true", (r.text, note)
            assert r.json() == answer, note
        assert c.get(f"/v1/models/{mid}").json()["version"] == model["version"]
        # the state loads and works on
        assert c.post(f"/v1/models/{mid}/predict", json={"x": [X[0].tolist()]}).status_code == 200
        r = c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "after-crash", "x": X[1].tolist(), "y": 1.0}]})
        assert r.status_code == 200 and r.json()["last_step"] == model["step"] + 1, r.text
        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["after-crash"]})
        assert r.status_code == 200 and r.json()["receipts"][0]["log_index"] == len(receipts), r.text
        assert verify_receipt(r.json()["receipts"][0], keys)
