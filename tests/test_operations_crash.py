"""Issue 36 item 4: operations survive their process (SIGKILL), and another replica takes them over, fenced.

Real service processes (tests/procs.py) with a short lease (OLU_OPERATION_LEASE_SECONDS=2):

- SQLite: the process running a bulk unlearn (one record per committed batch) is killed with SIGKILL mid-way, a
  retrain of the same model queued behind it; after a restart the unlearn is taken over when its lease has run out
  and resumes, then the retrain runs: every id forgotten exactly once with one receipt, one retrain in the ledger;
- PostgreSQL, two replicas: a retrain is taken over from a replica frozen (SIGSTOP) at its commit, whose commit is
  then refused (fencing); a bulk unlearn is taken over from a replica killed (SIGKILL) mid-way and resumed.
"""
from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from .helpers import all_receipts, create_model, examples, unit_rows
from .procs import ServiceProcess, service_env

LEASE = {"OLU_OPERATION_LEASE_SECONDS": "2", "OLU_OPERATION_POLL_SECONDS": "0.2"}
N, FORGET = 1500, 20  # records held; ids of the bulk unlearn (one committed batch each)


def _wait(c: httpx.Client, op_id: str, cond, what: str, limit: float = 120.0) -> dict:
    ends = time.monotonic() + limit
    while True:
        try:
            r = c.get(f"/v1/operations/{op_id}")
            if r.status_code == 200 and cond(r.json()):
                return r.json()
        except httpx.HTTPError:
            pass
        if time.monotonic() > ends:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _start(svc: ServiceProcess) -> ServiceProcess:
    """Until it answers (/healthz): operations run before the compiled kernels are loaded (the numpy path)."""
    return svc.launch().wait_ready(path="/healthz")


def _ended(op: dict) -> bool:
    return op["status"] in ("succeeded", "failed", "cancelled")


def _model(c: httpx.Client) -> str:
    mid = create_model(c, dim=4, algorithm="retrain", hyperparameters={"max_forget_batch": 1})["id"]
    X = unit_rows(N, 4, seed=5)
    for a in range(0, N, 750):
        r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[a:a + 750], start=a)})
        assert r.status_code == 200, r.text
    return mid


def _check_forgotten(c: httpx.Client, mid: str, op: dict, ids: list[str]) -> None:
    assert op["status"] == "succeeded" and op["progress"] == {"done": len(ids), "total": len(ids)}, op
    receipts = all_receipts(c, mid)
    assert len(receipts) == len(ids) == len({r["record_commitment"] for r in receipts})  # each once
    listed, cursor = [], None
    while True:
        page = c.get(f"/v1/operations/{op['id']}/receipts",
                     params={"limit": 200, **({"cursor": cursor} if cursor else {})})
        listed += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert [r["id"] for r in listed] == [r["id"] for r in sorted(receipts, key=lambda r: r["log_index"])]
    m = c.get(f"/v1/models/{mid}").json()
    assert m["n_forgotten"] == len(ids) and m["status"] == "ready"
    for rid in ids[:3] + ids[-3:]:
        assert c.get(f"/v1/audit/records/{rid}").json()["models"][0]["status"] == "forgotten"


def test_a_killed_process_loses_nothing_and_its_operations_resume_on_sqlite(tmp_path):
    """SIGKILL while a bulk unlearn is half done, with a retrain of the same model queued behind it; after a restart
    the unlearn is taken over once its lease ran out and resumes after its last committed batch, then the retrain
    runs: every id forgotten once, one retrain, the model at a whole version throughout."""
    svc = _start(ServiceProcess(service_env(tmp_path / "data", f"sqlite:///{tmp_path / 'olu.db'}", **LEASE),
                                tmp_path / "service.log"))
    try:
        _, key = svc.new_tenant("crash")
        with svc.client(key) as c:
            mid = _model(c)
            ids = [f"rec-{i}" for i in range(0, 2 * FORGET, 2)]
            r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids})
            assert r.status_code == 202, r.text
            op = r.json()
            retrain = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
            _wait(c, op["id"], lambda o: o["progress"]["done"] >= 4, "some batches")
        svc.kill()  # SIGKILL mid-operation
        _start(svc)
        with svc.client(key) as c:
            seen = c.get(f"/v1/operations/{op['id']}").json()
            assert seen["status"] == "running" and 4 <= seen["progress"]["done"] < FORGET, seen  # lease not run out
            assert c.get(f"/v1/operations/{retrain['id']}").json()["status"] == "queued"
            done = _wait(c, op["id"], _ended, "the resumed unlearn")
            assert done["attempts"] == 2, done
            _check_forgotten(c, mid, done, ids)
            ended = _wait(c, retrain["id"], _ended, "the retrain")
            assert ended["status"] == "succeeded" and ended["attempts"] == 1, ended
            after = c.get(f"/v1/models/{mid}").json()
            assert ended["result"] == {"version": done["result"]["version"] + 1, "epoch": 2}  # right after the unlearn
            assert (after["version"], after["epoch"]) == (done["result"]["version"] + 1, 2)
            assert [e["kind"] for e in c.get(f"/v1/models/{mid}/ledger").json()["entries"]].count("retrain") == 1
    finally:
        svc.stop()


class RowLock:
    """A PostgreSQL transaction holding the model's row lock: every write of the model waits at its commit."""

    def __init__(self, url: str, model_id: str):
        import psycopg

        self.conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1))
        self.conn.execute("SELECT id FROM models WHERE id = %s FOR UPDATE", (model_id,))

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


@pytest.fixture
def own_postgres(postgres_url):
    """A database of this test's own: the session's is polled by the in-process server's operation runner (another
    encryption key), which would claim these operations too."""
    import secrets

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"olu_ops_{secrets.token_hex(4)}"
    base = make_url(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield base.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_another_replica_takes_over_fenced_and_a_killed_replica_loses_nothing(own_postgres, tmp_path):
    """Two replicas on one PostgreSQL database.  (1) Replica a computes a retrain and waits at its commit (the test
    holds the model's row lock); a is frozen (SIGSTOP) past its lease; replica b takes the retrain over (a new
    fencing token), computes it and waits at the commit too; the lock is released and a thawed: a's commit is
    refused by the fence (or finds the model moved on), b's passes: one retrain.  (2) b, running a bulk unlearn, is
    killed (SIGKILL); a takes it over and resumes after the last committed batch: every id forgotten once."""
    url = own_postgres
    env = dict(LEASE, OLU_ENCRYPTION_KEY="MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
               OLU_SIGNING_KEY="MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
    a = _start(ServiceProcess(service_env(tmp_path / "a", url, **env), tmp_path / "a.log"))
    b = lock = None
    try:
        _, key = a.new_tenant("takeover")
        with a.client(key) as c:
            mid = _model(c)
            before = c.get(f"/v1/models/{mid}").json()
            lock = RowLock(url, mid)
            op = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
            _wait(c, op["id"], lambda o: o["progress"]["done"] == N, "replica a's retrain at its commit")
        os.kill(a.proc.pid, signal.SIGSTOP)  # frozen at the commit, holding its lease
        try:
            b = _start(ServiceProcess(service_env(tmp_path / "b", url, **env), tmp_path / "b.log"))
            with b.client(key) as c:
                _wait(c, op["id"], lambda o: o["attempts"] == 2 and o["progress"]["done"] == N,
                      "replica b's take-over at its commit")
            lock.release()
            lock = None
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        with b.client(key) as c:
            done = _wait(c, op["id"], _ended, "the retrain")
            assert done["status"] == "succeeded" and done["attempts"] == 2, done
            after = c.get(f"/v1/models/{mid}").json()
            assert (after["version"], after["epoch"]) == (before["version"] + 1, before["epoch"] + 1)
            assert [e["kind"] for e in c.get(f"/v1/models/{mid}/ledger").json()["entries"]].count("retrain") == 1
            ids = [f"rec-{i}" for i in range(1, 2 * FORGET, 2)]
            op = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids}).json()
            _wait(c, op["id"], lambda o: o["progress"]["done"] >= 3, "some batches")
            running = c.get(f"/v1/operations/{op['id']}").json()
        ends = time.monotonic() + 30
        while f"operation {done['id']} (retrain) lost" not in (tmp_path / "a.log").read_text():
            assert time.monotonic() < ends, "replica a did not stop its fenced retrain"
            time.sleep(0.1)
        owner = _owner(url, op["id"])
        dead, alive = (b, a) if f":{b.proc.pid}:" in owner else (a, b)
        dead.kill()  # SIGKILL the replica running the unlearn
        with alive.client(key) as c:
            done = _wait(c, op["id"], _ended, "the take-over of the unlearn")
            assert done["attempts"] == running["attempts"] + 1, done
            _check_forgotten(c, mid, done, ids)
    finally:
        if lock is not None:
            lock.release()
        a.stop()
        if b is not None:
            b.stop()


def _owner(url: str, operation_id: str) -> str:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        return conn.execute("SELECT owner FROM operations WHERE id = %s", (operation_id,)).fetchone()[0]
