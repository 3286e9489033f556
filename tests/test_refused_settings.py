"""Issue 14 (4): a model whose settings are now refused (stored before the refusal) signs no certificate.

Creation refuses them with a 422 (tests/test_api_families.py).  A model created before keeps loading: it learns
and predicts, and (issue 29 item 4) every forget is exact -- a restart from the initial state where the model keeps no
data, an exact retrain without the record where it keeps it -- never a certificate under the refused settings.
Before, every forget answered 409 ``record-not-deletable``: its records could never be forgotten.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import update

from app.config import Settings
from app.db.tables import Model
from app.errors import Problem
from app.main import create_app

CASES = [  # (algorithm, certified settings the model was created with, the now-refused ones it was stored with)
    ("memory_pair", {}, {"burn_in": 0}, "certificates false"),
    ("memory_pair", {}, {"initial_curvature": "shanno_phua"}, "certificates false"),
    ("passive_olu", {"schedule": "adaptive"}, {"capped": False, "p0": 1.0}, "no forget certifiable"),
]


@pytest.fixture()
def ctx(tmp_path: Path):
    app = create_app(Settings(data_dir=tmp_path, log_level="WARNING", database_url=f"sqlite:///{tmp_path / 'o.db'}"))
    yield app.state.ctx
    app.state.ctx.db.dispose()


@pytest.mark.parametrize("algorithm,certified,hp,words", CASES)
def test_a_stored_model_with_refused_settings_forgets_nothing(ctx, algorithm, certified, hp, words):
    t = ctx.tenants.create_tenant("t")["id"]
    spec = {"name": "m", "algorithm": algorithm, "loss": "logistic", "dim": 3, "bounds": {"x_norm": 1.0, "y_abs": 1.0},
            "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": certified}
    with pytest.raises(Problem) as refused:
        ctx.models.create(t, {**spec, "hyperparameters": {**certified, **hp}})
    assert refused.value.status == 422 and refused.value.slug == "invalid-model-spec"
    m = ctx.models.create(t, spec)["id"]
    # what a database written before the refusal holds: the same model with the now-refused settings
    with ctx.db.write() as s:
        row = s.get(Model, m)
        stored = json.loads(row.spec_json)
        stored["hyperparameters"].update(hp)
        s.execute(update(Model).where(Model.id == m).values(spec_json=json.dumps(stored, sort_keys=True)))
    ctx.models.registry.evict(m)
    X = np.random.default_rng(1).normal(size=(30, 3)) * 0.3
    ctx.models.learn(t, m, [f"r{i}" for i in range(30)], X, [float(i % 2) for i in range(30)])
    assert "predictions" in ctx.models.predict(t, m, X[:2].tolist())
    before = ctx.models.get(t, m)
    (receipt,) = ctx.models.unlearn(t, m, ["r20"])["receipts"]
    assert receipt["mechanism"] == {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0, "restart": True}
    after = ctx.models.get(t, m)
    assert after["version"] == before["version"] + 1 and after["n_forgotten"] == 1
    assert [e["kind"] for e in ctx.models.ledger(t, m)["entries"]] == ["restart"]
