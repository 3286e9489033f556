"""Records are indexed by the first 8 bytes of their commitment only; the full commitment and the model decide."""
from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select, update

from app.config import Settings
from app.db.tables import Record
from app.errors import Problem
from app.main import create_app
from app.services.tenants import commitment, lookup_key

SPEC = {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 2, "bounds": {"x_norm": 1.0, "y_abs": 1.0},
        "domain_radius": 5.0, "l2": 0.1, "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}}


@given(st.binary(min_size=32, max_size=32))
def test_lookup_key_is_the_signed_big_endian_prefix(digest):
    assert lookup_key(digest.hex()) == int.from_bytes(digest[:8], "big", signed=True)


@pytest.fixture()
def ctx(backend):
    _, url, data_dir = backend  # SQLite and, when configured, PostgreSQL
    app = create_app(Settings(data_dir=Path(data_dir), log_level="WARNING", database_url=url))
    yield app.state.ctx
    app.state.ctx.db.dispose()


def _force_lookup(ctx, model_id: str, held_id: str, like_id: str, tenant_id: str) -> None:
    """Give the stored record ``held_id`` the lookup value of ``like_id``: a prefix collision, made on purpose."""
    with ctx.db.write() as s:
        key = ctx.models._record_key(s, tenant_id)
        s.execute(update(Record).where(Record.model_id == model_id, Record.commitment == commitment(key, held_id))
                  .values(lookup=lookup_key(commitment(key, like_id))))


def test_prefix_collisions_neither_clash_nor_mix_up_records(ctx):
    t = ctx.tenants.create_tenant("t")["id"]
    m = ctx.models.create(t, SPEC)["id"]
    ctx.models.learn(t, m, ["a"], [[0.1, 0.2]], [1.0])
    _force_lookup(ctx, m, "a", "b", t)
    ctx.models.learn(t, m, ["b"], [[0.2, 0.1]], [0.0])  # same lookup, different commitment: not a duplicate
    out = ctx.models.unlearn(t, m, ["b"])
    with ctx.db.read() as s:
        key = ctx.models._record_key(s, t)
    assert out["receipts"][0]["record_commitment"] == commitment(key, "b")
    assert ctx.models.record_status(t, "b")["models"][0]["status"] == "forgotten"
    with ctx.db.read() as s:  # "a" shares b's lookup value (forced above) and was left alone
        rows = s.execute(select(Record.commitment, Record.status).where(Record.model_id == m)).all()
    assert sorted(rows) == sorted([(commitment(key, "a"), "learned"), (commitment(key, "b"), "forgotten")])
    with pytest.raises(Problem) as e:
        ctx.models.learn(t, m, ["b"], [[0.0, 0.0]], [1.0])  # b is found among the colliding rows
    assert e.value.status == 409


def test_same_record_id_in_two_models_of_a_tenant(ctx):
    t = ctx.tenants.create_tenant("t")["id"]
    m1, m2 = ctx.models.create(t, SPEC)["id"], ctx.models.create(t, SPEC)["id"]
    ids = [secrets.token_hex(4) for _ in range(50)]
    X, y = [[0.01 * i, 0.0] for i in range(50)], [float(i % 2) for i in range(50)]
    ctx.models.learn(t, m1, ids, X, y)
    ctx.models.learn(t, m2, ids, X, y)  # same commitments, other model: accepted
    ctx.models.unlearn(t, m1, ids[:3])
    with pytest.raises(Problem) as e:
        ctx.models.unlearn(t, m1, ids[:1])
    assert e.value.status == 409 and e.value.slug == "record-already-forgotten"
    status = {m["model_id"]: m["status"] for m in ctx.models.record_status(t, ids[0])["models"]}
    assert status == {m1: "forgotten", m2: "learned"}
    with pytest.raises(Problem) as e:
        ctx.models.learn(t, m2, ["new", ids[7]], X[:2], y[:2])
    assert e.value.status == 409 and ids[7] in e.value.detail
    with pytest.raises(Problem) as e:
        ctx.models.unlearn(t, m2, ["new"])  # the refused batch learned nothing
    assert e.value.status == 404


def test_batches_larger_than_one_in_chunk(ctx):
    """Learn and unlearn batches beyond the 500-key chunk (SQLite) / one array parameter (PostgreSQL)."""
    t = ctx.tenants.create_tenant("t")["id"]
    m = ctx.models.create(t, SPEC)["id"]
    ids = [f"big-{i}" for i in range(1100)]
    ctx.models.learn(t, m, ids, [[0.0005 * i, 0.1] for i in range(1100)], [float(i % 2) for i in range(1100)])
    with pytest.raises(Problem) as e:  # the clash sits in the third chunk
        ctx.models.learn(t, m, ["fresh-1", "big-1050"], [[0.0, 0.0], [0.1, 0.0]], [1.0, 0.0])
    assert e.value.status == 409 and "big-1050" in e.value.detail
    out = ctx.models.unlearn(t, m, ids[::2][:520])
    assert len(out["receipts"]) == 520
    statuses = {rid: ctx.models.record_status(t, rid)["models"][0]["status"] for rid in (ids[0], ids[1], ids[1038])}
    assert statuses == {ids[0]: "forgotten", ids[1]: "learned", ids[1038]: "forgotten"}
