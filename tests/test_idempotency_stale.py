"""A claim on an Idempotency-Key whose request died (its replica was killed) is taken over by a retry after
OLU_IDEMPOTENCY_STALE_SECONDS; before that the retry answers 409 idempotency-request-in-progress."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from app.config import Settings
from app.db.tables import IdempotencyRecord
from app.errors import Problem
from app.main import create_app
from app.services.idempotency import IdempotencyGuard

from .conftest import ADMIN_TOKEN
from .helpers import add_tenant


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("OLU_IDEMPOTENCY_STALE_SECONDS", "45")
    app = create_app(Settings(data_dir=tmp_path, admin_token=ADMIN_TOKEN))
    ctx = app.state.ctx
    add_tenant(ctx, "ten_x")  # a tenant row: fingerprints are keyed under its record key
    yield ctx.idempotency
    ctx.db.dispose()


def _age(store, seconds: float) -> None:
    with store.db.write() as s:  # the dead request's claim, made that long ago
        row = s.get(IdempotencyRecord, ("ten_x", "k1"))
        s.execute(update(IdempotencyRecord).where(IdempotencyRecord.key == "k1")
                  .values(created_at=row.created_at - timedelta(seconds=seconds)))


def test_a_dead_claim_is_taken_over_after_the_configured_seconds(store):
    assert store.stale_after == 45.0  # read from the environment by Settings, passed on by create_app
    assert isinstance(store.begin("ten_x", "k1", b"h"), IdempotencyGuard)  # ... and its process dies here
    with pytest.raises(Problem) as e:
        store.begin("ten_x", "k1", b"h")
    assert e.value.status == 409 and e.value.slug == "idempotency-request-in-progress"
    _age(store, 30)
    with pytest.raises(Problem):  # younger than 45 s: maybe still running
        store.begin("ten_x", "k1", b"h")
    _age(store, 20)
    assert isinstance(store.begin("ten_x", "k1", b"h"), IdempotencyGuard)  # 50 s: taken over
    with pytest.raises(Problem):  # the take-over is a fresh claim
        store.begin("ten_x", "k1", b"h")


def test_the_setting_refuses_nonsense(monkeypatch, tmp_path):
    for bad in ("0", "-1", "nan"):
        monkeypatch.setenv("OLU_IDEMPOTENCY_STALE_SECONDS", bad)
        with pytest.raises(ValueError):
            Settings(data_dir=tmp_path)
