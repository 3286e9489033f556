"""Small predictions on SQLite are answered on the event loop, reading through the thread's own connection: same
answers as the worker-thread path, no read transaction left open, large inputs and PostgreSQL keep the hop."""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from app.config import Settings
from app.errors import Problem
from app.main import create_app

SPEC = {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 4, "bounds": {"x_norm": 1.0, "y_abs": 1.0},
        "domain_radius": 5.0, "l2": 0.1, "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}}


@pytest.fixture()
def ctx(backend):
    _, url, data_dir = backend
    app = create_app(Settings(data_dir=Path(data_dir), log_level="WARNING", database_url=url))
    yield app.state.ctx
    app.state.ctx.db.dispose()


def _model(ctx):
    t = ctx.tenants.create_tenant("t")["id"]
    m = ctx.models.create(t, SPEC)["id"]
    X = np.random.default_rng(3).uniform(-0.4, 0.4, size=(40, 4))
    ctx.models.learn(t, m, [f"r{i}" for i in range(40)], X, [float(i % 2) for i in range(40)])
    return t, m, X


def test_inline_only_for_small_inputs_on_sqlite(ctx):
    small, large = [[0.0] * 4], [[0.0] * 4] * (ctx.models.INLINE_PREDICT_VALUES // 4 + 1)
    assert ctx.models.predict_inline(small) is ctx.db.is_sqlite
    assert ctx.models.predict_inline(large) is False


def test_inline_answers_as_the_worker_path(ctx):
    t, m, X = _model(ctx)
    if not ctx.db.is_sqlite:
        pytest.skip("inline predictions are a SQLite path")
    rows = X[:5].tolist()
    assert ctx.models.predict(t, m, rows, inline=True) == ctx.models.predict(t, m, rows)
    ctx.models.unlearn(t, m, ["r3"])  # a new version is seen at once
    assert ctx.models.predict(t, m, rows, inline=True) == ctx.models.predict(t, m, rows)
    with pytest.raises(Problem) as e:
        ctx.models.predict(t, "mdl_missing", rows, inline=True)
    assert e.value.status == 404
    with pytest.raises(Problem) as e:
        ctx.models.predict(t, m, [[0.1, 0.2]], inline=True)
    assert e.value.slug == "invalid-dimension"


def test_inline_reads_leave_no_transaction_open(ctx, backend):
    """A read transaction left open would pin the WAL: a TRUNCATE checkpoint could not complete."""
    if not ctx.db.is_sqlite:
        pytest.skip("SQLite WAL")
    t, m, X = _model(ctx)
    for _ in range(3):
        ctx.models.predict(t, m, X[:2].tolist(), inline=True)
    ctx.models.learn(t, m, ["later"], X[:1], [1.0])  # new WAL frames after the reads
    with sqlite3.connect(Path(backend[2]) / "olu.db") as other:
        busy, frames, checkpointed = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0 and frames == 0 == checkpointed


def test_each_thread_reads_on_its_own_connection(ctx):
    if not ctx.db.is_sqlite:
        pytest.skip("SQLite own connections")
    t, m, X = _model(ctx)
    seen, answers = [], []

    def work():
        with ctx.db.own_read() as conn:
            seen.append(id(conn))
        answers.append(ctx.models.predict(t, m, X[:3].tolist(), inline=True))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with ctx.db.own_read() as conn:
        seen.append(id(conn))
    with ctx.db.own_read() as again:
        assert id(again) == seen[-1]  # kept between calls on one thread
    assert len(set(seen)) == 5 and all(a == answers[0] for a in answers)


def test_large_and_small_predictions_over_http(tenant):
    _, c = tenant
    mid = c.post("/v1/models", json={**SPEC, "dim": 64}).json()["id"]
    X = np.random.default_rng(5).uniform(-0.1, 0.1, size=(1100, 64))
    assert c.post(f"/v1/models/{mid}/learn", json={"ids": [f"x{i}" for i in range(50)], "x": X[:50].tolist(),
                                                   "y": [float(i % 2) for i in range(50)]}).status_code == 200
    big = c.post(f"/v1/models/{mid}/predict", json={"x": X.tolist()})  # 70 400 values: a worker thread
    small = c.post(f"/v1/models/{mid}/predict", json={"x": X[:3].tolist()})
    assert big.status_code == 200 and small.status_code == 200
    assert big.json()["scores"][:3] == small.json()["scores"]
    assert c.post(f"/v1/models/{mid}/predict", json={"x": [[0.0] * 3]}).status_code == 422
