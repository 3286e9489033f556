"""Audit reads that scale (issue 37, F5-H): a receipt's inclusion proof costs O(log n) database work, a model's
export bundle costs work linear in the receipts it returns, and an auditor can page through an export and resume it.

Database work is counted, not timed: SQLite's virtual-machine instructions (a progress handler on every pooled
connection), which grow with every row an index search or a scan visits.  The export's merkle-node reads were one
``tenant_id = ? AND ((level = ? AND idx = ?) OR ...)`` query, which SQLite answered by scanning every node of the
tenant: a proof cost O(n), an export O(n^2)."""
from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, event, insert
from sqlalchemy.orm import Session

from app.db.merkle_store import SqlNodeStore
from app.db.tables import Base, MerkleNode
from app.receipts.merkle import InMemoryNodeStore, MerkleLog, verify_inclusion, leaf_hash
from app.receipts.verify import verify_bundle

from .helpers import create_model, examples, unit_rows


@contextmanager
def sqlite_steps(engine):
    """Counts SQLite VM instructions (in hundreds) run on ``engine``'s connections inside the block."""
    count = [0]

    def tick():
        count[0] += 1
        return 0

    def on_checkout(dbapi_conn, record, proxy):
        dbapi_conn.set_progress_handler(tick, 100)

    def on_checkin(dbapi_conn, record):
        dbapi_conn.set_progress_handler(None, 0)

    event.listen(engine.pool, "checkout", on_checkout)
    event.listen(engine.pool, "checkin", on_checkin)
    try:
        yield count
    finally:
        event.remove(engine.pool, "checkout", on_checkout)
        event.remove(engine.pool, "checkin", on_checkin)


def _log_of(engine, tenant: str, size: int) -> None:
    """A tenant's log of ``size`` leaves written straight into merkle_nodes."""
    store = InMemoryNodeStore()
    log = MerkleLog(store)
    for i in range(size):
        log.append(f"leaf {i}".encode(), i)
    with engine.begin() as c:
        c.execute(insert(MerkleNode.__table__), [{"tenant_id": tenant, "level": lv, "idx": ix, "hash": h}
                                                 for (lv, ix), h in store._nodes.items()])


def test_inclusion_proof_work_grows_with_log_n_not_n(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    Base.metadata.create_all(engine)
    small, large = 1 << 9, 1 << 14
    _log_of(engine, "ten_small", small)
    _log_of(engine, "ten_large", large)
    work = {}
    for tenant, size in (("ten_small", small), ("ten_large", large)):
        leaves = [0, size // 3, size // 2, size - 1]
        with sqlite_steps(engine) as steps:
            for _ in range(5):
                with Session(engine) as s:
                    log = MerkleLog(SqlNodeStore(s, tenant))
                    root = log.root(size)
                    for i in leaves:
                        proof = log.inclusion_proof(i, size)
                        assert verify_inclusion(leaf_hash(f"leaf {i}".encode()), i, size, proof, root)
        work[size] = steps[0]
    # log2 grows 9 -> 14 (1.6x); scanning the tenant's nodes grew the work 32x
    assert work[large] <= 3 * max(work[small], 1), work


def _forget_all(c, n: int) -> str:
    mid = create_model(c, dim=3)["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(n, 3))}).status_code == 200
    for start in range(0, n, 500):
        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"rec-{i}" for i in range(start, min(n, start + 500))]})
        assert r.status_code == 200, r.text
    return mid


def _pages(c, mid: str, limit: int) -> list[dict]:
    pages, cursor = [], None
    while True:
        r = c.get("/v1/audit/export", params={"model_id": mid, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        pages.append(r.json())
        cursor = pages[-1]["next_cursor"]
        if cursor is None:
            return pages


def test_export_pages_resume_on_one_checkpoint_and_match_the_whole_bundle(server):
    tenant_id, key = server.new_tenant()
    with server.client(key) as c:
        mid = _forget_all(c, 130)
        keys = c.get("/v1/keys").json()
        pages = _pages(c, mid, 50)
        assert [len(p["receipts"]) for p in pages] == [50, 50, 30]
        # the log grows meanwhile: resuming keeps the first page's checkpoint, the new receipt is not in the bundle
        other = _forget_all(c, 1)
        assert other
        resumed = c.get("/v1/audit/export", params={"model_id": mid, "limit": 50, "cursor": pages[0]["next_cursor"]})
        assert resumed.json() == pages[1]
        assert {p["checkpoint"]["tree_size"] for p in pages} == {130}
        for p in pages:  # each page verifies on its own
            assert verify_bundle(p, keys).ok
        whole = c.get("/v1/audit/export", params={"model_id": mid})  # no limit: everything at once (streamed)
        assert whole.status_code == 200 and whole.headers["content-type"].startswith("application/json")
        bundle = whole.json()
        assert bundle["next_cursor"] is None and bundle["checkpoint"]["tree_size"] == 131
        assert [r["id"] for r in bundle["receipts"]] == [r["id"] for p in pages for r in p["receipts"]]
        report = verify_bundle(json.loads(whole.text), keys)
        assert report.ok and len(bundle["receipts"]) == 130, report.failures()
        # a cursor names a size of the log and an index: beyond the log, or malformed, it is refused
        for bad, slug in (("132.0", "log-size-exceeded"), ("x.1", "validation-error"), ("5", "validation-error")):
            r = c.get("/v1/audit/export", params={"model_id": mid, "limit": 10, "cursor": bad})
            assert r.status_code == 422 and r.json()["type"].endswith(slug), (bad, r.text)
        # at an older size (a checkpoint signed for it), the bundle of the log as it was; past its end, nothing
        older = c.get("/v1/audit/export", params={"model_id": mid, "limit": 500, "cursor": "100.0"}).json()
        assert len(older["receipts"]) == 100 and older["checkpoint"]["tree_size"] == 100
        assert verify_bundle(older, keys).ok
        done = c.get("/v1/audit/export", params={"model_id": mid, "limit": 10, "cursor": "131.131"}).json()
        assert done["receipts"] == [] and done["next_cursor"] is None


def test_export_work_is_linear_in_the_receipts_it_returns(server):
    if server.backend != "sqlite":
        pytest.skip("database work is counted in SQLite VM instructions")
    sizes, key_of = {}, {}
    for n in (100, 800):
        tenant_id, key_of[n] = server.new_tenant()
        with server.client(key_of[n]) as c:
            sizes[n] = (tenant_id, _forget_all(c, n))
    engine = server.app.state.ctx.db.engine
    work = {}
    for n, (tenant_id, mid) in sizes.items():
        with server.client(key_of[n]) as c:
            c.get("/v1/audit/checkpoint")  # signs the checkpoint once, outside the count
            with sqlite_steps(engine) as steps:
                bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
        assert len(bundle["receipts"]) == n
        work[n] = steps[0]
    # 8x the receipts: at most 2 x 8 the work (quadratic was 64x)
    assert work[800] <= 16 * work[100], work
