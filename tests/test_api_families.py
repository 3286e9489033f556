"""Every registered family through the same endpoints (the service never branches on algorithm names)."""
from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from .helpers import create_model, examples, unit_rows, verify_receipt

FAMILIES = [
    ("passive_olu", {}),
    ("passive_olu", {"schedule": "convex_constant", "allocation": "uniform", "max_deletions": 3}),
    ("passive_olu_restart", {"horizon": 1000, "max_deletions": 10}),
    ("active_olu", {}),
    ("active_olu", {"variant": "single"}),
    ("second_order_olu", {}),
    ("second_order_olu", {"solver": "cg"}),
    ("retrain", {}),
    ("descent_to_delete", {}),
    ("descent_to_delete", {"variant": "perfect"}),
    ("descent_to_delete", {"variant": "distributed"}),
    ("memory_pair", {"capacity": 8}),
    ("rewind_to_delete", {"initial_size": 20, "T": 60, "K": 20, "m_max": 3, "learn_policy": "retrain"}),
    ("sisa", {}),
    ("sisa", {"shards": 3, "slices": 2}),
    ("exact_ridge", {"deletion_features": "retained"}),  # its default (client) mode: test_exact_ridge_* below
]
# families that serve one loss only (exact_ridge: least squares); the others run with the logistic loss
LOSS = {"exact_ridge": "squared"}


@pytest.mark.parametrize("algorithm,hp", FAMILIES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(FAMILIES)])
def test_family_round_trip_over_http(server, tenant, algorithm, hp):
    _, c = tenant
    model = create_model(c, dim=3, algorithm=algorithm, hyperparameters=hp, l2=0.05, loss=LOSS.get(algorithm, "logistic"))
    mid = model["id"]
    assert model["algorithm"] == algorithm and model["guarantee"]["definition"]
    X = unit_rows(30, 3, seed=4)
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)}).status_code == 200
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-3", "rec-29"]})
    assert r.status_code == 200, r.text
    keys = c.get("/v1/keys").json()["keys"]
    for receipt in r.json()["receipts"]:
        assert verify_receipt(receipt, keys) and receipt["algorithm"] == algorithm
    assert c.post(f"/v1/models/{mid}/predict", json={"x": X[:2].tolist()}).status_code == 200
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert len(ledger["entries"]) == 2
    m = c.get(f"/v1/models/{mid}").json()
    assert m["n_forgotten"] == 2 and m["step"] == 30
    rt = c.post(f"/v1/models/{mid}/retrain")
    if m["algorithm"] in ("passive_olu", "passive_olu_restart"):
        assert rt.status_code == 409 and rt.json()["type"].endswith("/retrain-not-supported")
    else:
        assert rt.status_code == 200, rt.text
        assert rt.json()["epoch"] == m["epoch"] + 1
        assert c.get(f"/v1/models/{mid}/ledger").json()["entries"][-1]["kind"] == "retrain"


def test_capacity_exhaustion_of_a_model_without_data_restarts_it(tenant):
    """passive_olu keeps no data to retrain on: a forget beyond its capacity restarts the model (exact, a new ledger
    epoch) instead of leaving it retrain_required with records nobody could ever forget (issue 21)."""
    _, c = tenant
    mid = create_model(c, dim=2, hyperparameters={"allocation": "uniform", "max_deletions": 2})["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 2))})
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0", "rec-1"]}).status_code == 200
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert ledger["capacity_total"] == 2 and ledger["capacity_left"] == 0
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-2"]})
    assert r.status_code == 200, r.text
    assert r.json()["receipts"][0]["mechanism"] == {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0,
                                                    "restart": True}
    m = c.get(f"/v1/models/{mid}").json()
    assert m["status"] == "ready" and m["epoch"] == 2 and m["ledger_summary"]["capacity_left"] == 2
    assert c.get("/v1/audit/records/rec-2").json()["models"][0]["status"] == "forgotten"


def _raw_database_bytes(server) -> bytes:
    """Every byte the database holds: the SQLite file (with its WAL) or every PostgreSQL table's contents."""
    db = server.app.state.ctx.db
    if db.is_sqlite:
        with db.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        path = server.database_url.removeprefix("sqlite:///")
        data = open(path, "rb").read()
        try:
            data += open(path + "-wal", "rb").read()
        except FileNotFoundError:
            pass
        return data
    out = []
    with db.engine.connect() as conn:
        tables = [r[0] for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname='public'"))]
        for t in tables:
            for row in conn.execute(text(f'SELECT * FROM "{t}"')):
                for v in row:
                    if isinstance(v, (bytes, memoryview)):
                        out.append(bytes(v))
    return b"".join(out)


DATA_HOLDING = [("retrain", {}), ("active_olu", {}), ("second_order_olu", {}), ("descent_to_delete", {}), ("memory_pair", {}),
                ("rewind_to_delete", {"initial_size": 8, "T": 40, "K": 10, "m_max": 3}), ("sisa", {"shards": 3}),
                ("exact_ridge", {"deletion_features": "retained"})]


@pytest.mark.parametrize("algorithm,hp", DATA_HOLDING, ids=[a for a, _ in DATA_HOLDING])
def test_forgotten_examples_leave_no_bytes_in_the_database(server, tenant, algorithm, hp):
    _, c = tenant
    mid = create_model(c, dim=4, algorithm=algorithm, hyperparameters=hp, loss=LOSS.get(algorithm, "logistic"))["id"]
    rng = np.random.default_rng(11)
    X = rng.uniform(-0.49, 0.49, size=(12, 4))  # distinctive float64 patterns
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)})
    needle = np.ascontiguousarray(X[5], dtype="<f8").tobytes()
    assert np.allclose(_retained(server, mid, [6])[0], X[5])  # positive control: the example is held (step 6) ...
    assert needle not in _raw_database_bytes(server)  # ... and only sealed (app/db/retained.py)
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-5"]}).status_code == 200
    data = _raw_database_bytes(server)
    assert needle not in data
    for j in range(4):  # not even one feature's bytes
        assert np.float64(X[5, j]).tobytes() not in data
    with pytest.raises(KeyError):  # its data key and sealed row are gone
        _retained(server, mid, [6])
    assert np.allclose(_retained(server, mid, [7])[0], X[6])  # the others are still held


def _retained(server, model_id: str, steps):
    from app.db.retained import SqlRetained

    ctx = server.app.state.ctx
    with ctx.db.read() as s:
        return SqlRetained(s, model_id, 4, ctx.models.registry.cipher).get(steps)[0]


def test_memory_pair_with_client_supplied_features(tenant):
    _, c = tenant
    mid = create_model(c, dim=3, algorithm="memory_pair",
                       hyperparameters={"deletion_features": "client", "capacity": 2})["id"]
    X = unit_rows(12, 3, seed=9)
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)})
    version = c.get(f"/v1/models/{mid}").json()["version"]
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-4"]})
    assert r.status_code == 422 and r.json()["type"].endswith("/deletion-features-required")
    wrong = {"id": "rec-4", "x": X[5].tolist(), "y": 0.0}
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-4"], "examples": [wrong]})
    assert r.status_code == 422 and r.json()["type"].endswith("/example-mismatch")
    assert c.get(f"/v1/models/{mid}").json()["version"] == version
    right = {"id": "rec-4", "x": X[4].tolist(), "y": 0.0}
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-4"], "examples": [right]})
    assert r.status_code == 200, r.text
    assert r.json()["receipts"][0]["mechanism"]["type"] == "discrete_gaussian"
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert ledger["accounting"] == "capacity" and ledger["capacity_total"] == 2 and ledger["capacity_left"] == 1
    assert ledger["rho_spent"] <= ledger["rho_budget"]
    ok = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-6"], "examples": [
        {"id": "rec-6", "x": X[6].tolist(), "y": 0.0}]})
    assert ok.status_code == 200
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-7"], "examples": [
        {"id": "rec-7", "x": X[7].tolist(), "y": 1.0}]})
    # beyond the capacity: the model keeps no data to retrain on, so it restarts exactly (issue 29 item 5; was 409
    # "retrain it" while /retrain answered retrain-not-supported)
    assert r.status_code == 200, r.text
    assert r.json()["receipts"][0]["mechanism"] == {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0,
                                                    "restart": True}
    m = c.get(f"/v1/models/{mid}").json()
    assert m["status"] == "ready" and m["ledger_summary"]["capacity_left"] == 2


def test_exact_ridge_forgets_with_the_resent_records_exactly_and_refuses_a_wrong_one(tenant):
    """exact_ridge keeps no data by default: the unlearn carries the records, checked against the code kept at
    learn (a wrong feature or label: 422 example-mismatch, nothing changes); after the forget the published weights
    equal, bit for bit, those of a model that learned only the other records, in reverse order."""
    _, c = tenant
    names = ["cat", "dog", "eel"]
    spec = dict(dim=3, algorithm="exact_ridge", loss="squared", classes=names, l2=0.5)
    m = create_model(c, **spec)
    mid = m["id"]
    assert m["n_classes"] == 3 and m["hyperparameters"]["deletion_features"] == "client"
    assert m["constants"]["record_cap"] > 10**6 and m["guarantee"]["definition"].startswith("exact")
    X = unit_rows(30, 3, seed=9)
    y = [names[i % 3] for i in range(30)]
    ex = [{"id": f"rec-{i}", "x": X[i].tolist(), "y": y[i]} for i in range(30)]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
    before = c.get(f"/v1/models/{mid}/parameters").json()
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-4"]})
    assert r.status_code == 422 and r.json()["type"].endswith("/deletion-features-required")
    for wrong in ({**ex[4], "x": ex[5]["x"]}, {**ex[4], "y": "cat"}):  # rec-4 is a dog
        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-4"], "examples": [wrong]})
        assert r.status_code == 422 and r.json()["type"].endswith("/example-mismatch"), r.text
        assert c.get(f"/v1/models/{mid}/parameters").json() == before  # nothing changed
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-4", "rec-11"], "examples": [ex[11], ex[4]]})
    assert r.status_code == 200, r.text
    for receipt in r.json()["receipts"]:
        assert receipt["mechanism"] == {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0}
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert ledger["rho_spent"] == 0.0 and len(ledger["entries"]) == 2
    ref = create_model(c, **spec)["id"]
    rest = [e for e in ex if e["id"] not in ("rec-4", "rec-11")][::-1]
    assert c.post(f"/v1/models/{ref}/learn", json={"examples": rest}).status_code == 200
    got, want = c.get(f"/v1/models/{mid}/parameters").json(), c.get(f"/v1/models/{ref}/parameters").json()
    assert got["weights"] == want["weights"] and got["shape"] == [3, 4] and got["classes"] == names
    assert got["weights"] != before["weights"]
    p = c.post(f"/v1/models/{mid}/predict", json={"x": X[:6].tolist()}).json()
    assert all(cls in names for cls in p["classes"]) and len(p["probabilities"][0]) == 3
    assert np.allclose(np.sum(p["probabilities"], axis=1), 1.0)
    assert p == {**c.post(f"/v1/models/{ref}/predict", json={"x": X[:6].tolist()}).json(), "version": p["version"]}
    rt = c.post(f"/v1/models/{mid}/retrain")  # no data kept: nothing to retrain on
    assert rt.status_code == 409 and rt.json()["type"].endswith("/retrain-not-supported")


def test_classes_with_loss_squared_are_for_a_least_squares_classifier_only(tenant):
    _, c = tenant
    body = {"name": "m", "algorithm": "passive_olu", "loss": "squared", "dim": 2, "bounds": {"x_norm": 1.0},
            "n_classes": 3}
    r = c.post("/v1/models", json=body)
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid-model-spec"), r.text
    assert r.json()["errors"][0]["field"] == "n_classes"
    r = c.post("/v1/models", json={**body, "algorithm": "exact_ridge", "loss": "logistic", "n_classes": None})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "loss"
    m = create_model(c, **{**body, "algorithm": "exact_ridge", "n_classes": 2})
    assert m["n_classes"] == 2
    r = c.post(f"/v1/models/{m['id']}/learn", json={"examples": [{"id": "a", "x": [0.1, 0.2], "y": 2.0}]})
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid-label"), r.text


def test_memory_pair_inference_gate(tenant):
    _, c = tenant
    mid = create_model(c, dim=2, algorithm="memory_pair", hyperparameters={"inference_gate": True})["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(5, 2))})
    r = c.post(f"/v1/models/{mid}/predict", json={"x": [[0.1, 0.1]]})
    assert r.status_code == 409 and r.json()["type"].endswith("/inference-not-ready")
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert ledger["capacity_total"] is not None
    assert ledger["details"]["inference_allowed"] is False and ledger["details"]["sample_complexity"] > 5
    assert c.get(f"/v1/models/{mid}").json()["ledger_summary"]["details"]["n_inserts"] == 5
    ungated = create_model(c, dim=2, algorithm="memory_pair")["id"]
    c.post(f"/v1/models/{ungated}/learn", json={"examples": examples(unit_rows(5, 2))})
    assert c.post(f"/v1/models/{ungated}/predict", json={"x": [[0.1, 0.1]]}).status_code == 200


@pytest.mark.parametrize("algorithm,hp,field", [
    ("memory_pair", {"burn_in": 0}, "burn_in"),
    ("memory_pair", {"initial_curvature": "shanno_phua"}, "initial_curvature"),
    ("passive_olu", {"schedule": "adaptive", "capped": False, "p0": 1.0}, "p0"),
])
def test_settings_with_a_false_certificate_are_refused_at_creation(tenant, algorithm, hp, field):
    """Issue 14 (4): settings the project measured as under-noised (memory pair) or whose forgets could only be
    decided from unpublished data (uncapped adaptive below beta^2 D^2/4) are refused with a 422 naming the field."""
    _, c = tenant
    before = len(c.get("/v1/models").json()["items"])
    body = {"name": "m", "algorithm": algorithm, "loss": "logistic", "dim": 3, "bounds": {"x_norm": 1.0},
            "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": hp}
    r = c.post("/v1/models", json=body)
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["type"].endswith("/invalid-model-spec") and problem["detail"].startswith(field)
    assert "refused" in problem["detail"]
    assert len(c.get("/v1/models").json()["items"]) == before  # nothing created


def test_the_service_ledger_refuses_an_under_noised_certificate(server, tenant, monkeypatch):
    """The service spends each Gaussian certificate against its own app.privacy ledger: an engine that
    under-noises (claims more rho than the omega-series allows) fails the request and changes nothing."""
    _, c = tenant
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(8, 2))})
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).status_code == 200
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    before = c.get(f"/v1/models/{mid}").json()

    from app.unlearning.families.passive import PassiveOLU

    honest = PassiveOLU.noise_multiplier
    monkeypatch.setattr(PassiveOLU, "noise_multiplier", lambda self, i: honest(self, i) / 2)
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]})
    assert r.status_code == 500 and r.json()["type"].endswith("/internal-error")
    monkeypatch.setattr(PassiveOLU, "noise_multiplier", honest)
    assert c.get(f"/v1/models/{mid}/ledger").json() == ledger
    after = c.get(f"/v1/models/{mid}").json()
    assert (after["version"], after["n_forgotten"]) == (before["version"], before["n_forgotten"])
    assert c.get("/v1/audit/records/rec-1").json()["models"][0]["status"] == "learned"
    ok = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]})
    assert ok.status_code == 200
    receipts = ok.json()["receipts"]
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert receipts[-1]["ledger_after"]["rho_spent"] == pytest.approx(ledger["rho_spent"], rel=1e-12)
    assert ledger["rho_spent"] == pytest.approx(sum(e["rho"] for e in ledger["entries"]), rel=1e-12)


def test_memory_pair_capacity_spent_then_retrain_restores_it(tenant):
    _, c = tenant
    mid = create_model(c, dim=3, algorithm="memory_pair", hyperparameters={"capacity": 2})["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(20, 3, seed=2))})
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1", "rec-2"]}).status_code == 200
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-3"]})
    assert r.status_code == 409 and c.get(f"/v1/models/{mid}").json()["status"] == "retrain_required"
    assert c.post(f"/v1/models/{mid}/retrain").status_code == 200
    m = c.get(f"/v1/models/{mid}").json()
    assert m["status"] == "ready" and m["epoch"] == 2 and m["ledger_summary"]["capacity_left"] == 2
    assert m["ledger_summary"]["rho_spent"] == 0.0
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-3"]})
    assert r.status_code == 200 and r.json()["receipts"][0]["epoch"] == 2
