"""Retained chunks are fetched in one query per batch of ids (app/db/retained.py ``fetch_bodies``): on PostgreSQL
through the driver in binary format (bytea as raw bytes, not hex text: 3-4x faster for the hundreds of MB a retrain's
forget reads), elsewhere through the Core query; the same rows either way."""
from __future__ import annotations

import numpy as np

from app.config import Settings
from app.db import retained
from app.main import create_app

SPEC = {"name": "kept", "algorithm": "retrain", "loss": "logistic", "dim": 3, "bounds": {"x_norm": 1.0, "y_abs": 1.0},
        "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}}


def _plain(rows) -> list[tuple]:
    return sorted(tuple(bytes(v) if isinstance(v, (bytes, memoryview)) else v for v in r) for r in rows)


def test_fetch_bodies_gives_the_core_querys_rows_on_either_backend(backend, tmp_path):
    name, url, _ = backend
    (tmp_path / "data").mkdir()
    ctx = create_app(Settings(data_dir=tmp_path / "data", database_url=url, log_level="WARNING")).state.ctx
    try:
        t = ctx.tenants.create_tenant(f"fetch-{name}")["id"]
        m = ctx.models.create(t, SPEC)["id"]
        rng = np.random.default_rng(1)
        X = rng.uniform(-0.5, 0.5, (9000, 3))
        ctx.models.learn(t, m, [f"r{i}" for i in range(9000)], X, (np.arange(9000) % 2).astype(float))
        with ctx.db.read() as s:
            ids = [r[0] for r in s.execute(retained._META.where(retained._C.c.model_id == m)).all()]
            assert len(ids) >= 2
            fetched = retained.fetch_bodies(s, ids)
            assert _plain(fetched) == _plain(s.execute(retained._BODY_OF, {"ids": ids}).all())
            if name == "postgresql":  # the binary format: raw bytes from the driver
                assert all(isinstance(r[3], bytes) for r in fetched)
            got, _ = retained.SqlRetained(s, m, 3, ctx.models.registry.cipher).get(np.arange(1, 9001))
        assert np.array_equal(got, X)
    finally:
        ctx.db.dispose()
